"""Loading a model: the engine's weights and the tokenizer side by side, then the engine's calibration; each
phase timed.

The engine's load (weights read and repacked, or mapped packed from weights_cache.py; a load that packed
writes them there for the next, in the background once it is calibrated) releases the GIL; the tokenizer
(from tokenizer_cache.py, or read from the vocabulary) is mostly Python work that holds it. So the tokenizer
is made in a second thread from the file (a file seen before: its cache entry, the vocabulary never read into
Python) while this one waits in the engine's constructor. The header the model keeps is read first without
the vocabulary's long arrays.
The engine's calibration (timed scratch forwards that seed its step-cost model, ~1 s with the serving
options; calibration_cache.py keeps it for the next load) runs after both, alone: beside the tokenizer's
thread its thread team would be descheduled, the timings inflated (measured: row costs 1.5-2x) and the
calibration itself slower.

Errors are those a load in sequence raises, in that order: the engine's (GGUFError / ModelError / ValueError,
once the tokenizer thread has ended), then the tokenizer's.

An early load (`start_early`): `pyserve serve` with one model begins loading it -- header, engine and tokenizer,
not the calibration -- in a thread before it imports the server (~0.3 s of modules that hold the GIL while the
engine's load does not), and the server's load_model of the same file with the same options takes it over, then
calibrates alone. Any other load_model drops it; one that failed is forgotten, and the server's own load then
raises what it raises.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from .. import _engine
from .calibration_cache import calibrate
from .tokenizer import Tokenizer
from .tokenizer_cache import load_tokenizer_of_file
from .weights_cache import entry_of, keep_in_background

__all__ = ["LoadedModel", "load_model", "start_early", "discard_early"]

# The header a model keeps leaves out arrays longer than this: the vocabulary's (tokens, scores, types, merges),
# which only the tokenizer reads, and it reads them itself (tokenizer_cache.load_tokenizer_of_file) or not at all.
_HEADER_MAX_ARRAY = 4096


@dataclass
class LoadedModel:
    engine: Any  # _engine.Engine
    metadata: dict
    tokenizer: Tokenizer
    times: dict = field(default_factory=dict)  # phase -> seconds: header, engine, tokenizer, calibrate, total
    tokenizer_source: str = ""  # tokenizer_cache.load_tokenizer's "cached" / "built" / "built, not cached"
    weights_source: str = ""  # weights_cache.keep_in_background's "mapped" / "packed" / "packed, writing the cache"
    weights_entry: Optional[Path] = None  # the cache entry the weights were looked for in (None: no cache)
    calibration_source: str = ""  # calibration_cache.calibrate's "cached" / "measured"


class _TokenizerThread(threading.Thread):
    def __init__(self, path: str):
        super().__init__(name="pyserve-tokenizer", daemon=True)
        self.path = path
        self.result: Optional[tuple[Tokenizer, str]] = None
        self.error: Optional[BaseException] = None
        self.seconds = 0.0

    def run(self) -> None:
        t0 = time.perf_counter()
        try:
            self.result = load_tokenizer_of_file(self.path)
        except BaseException as e:  # noqa: BLE001 - handed to the loading thread, raised there
            self.error = e
        self.seconds = time.perf_counter() - t0


def load_model(path: str, options: dict) -> LoadedModel:
    """The engine of the GGUF at `path` (with engine `options`, EngineOptions.as_dict()) and its tokenizer."""
    loaded = _claim_early(path, options) or _load_uncalibrated(path, options)
    t_calibrate = time.perf_counter()
    loaded.calibration_source = calibrate(loaded.engine, path)
    seconds = time.perf_counter() - t_calibrate
    # after the timed forwards, which a writer beside them would skew
    loaded.weights_source = keep_in_background(loaded.engine, loaded.weights_entry)
    loaded.times.update(calibrate=seconds, total=loaded.times["total"] + seconds)  # an early load's own time
    return loaded


def _load_uncalibrated(path: str, options: dict) -> LoadedModel:
    t0 = time.perf_counter()
    metadata = _engine.read_gguf(path, _HEADER_MAX_ARRAY)[0]
    t_header = time.perf_counter()
    tok = _TokenizerThread(path)
    tok.start()
    try:
        entry = entry_of(path)
        engine = _engine.Engine(path, calibrate=False, packed_weights=str(entry or ""), **options)
    finally:
        t_engine = time.perf_counter()
        tok.join()
    if tok.error is not None:
        raise tok.error
    tokenizer, source = tok.result
    times = {"header": t_header - t0, "engine": t_engine - t_header, "tokenizer": tok.seconds,
             "total": time.perf_counter() - t0}
    return LoadedModel(engine, metadata, tokenizer, times, source, weights_entry=entry)


class _EarlyLoad(threading.Thread):
    """_load_uncalibrated begun ahead of its load_model. Not a daemon: an exit before the server claims it waits
    for it to end (a native load is not torn down mid-way by the interpreter's shutdown)."""

    def __init__(self, model: Optional[str], options: dict):
        super().__init__(name="pyserve-early-load")
        self.model, self.options = model, dict(options)
        self.path: Optional[str] = None
        self.result: Optional[LoadedModel] = None

    def run(self) -> None:
        from .model_source import resolve_model

        try:
            self.path = os.path.realpath(resolve_model(self.model))
            self.result = _load_uncalibrated(self.path, self.options)
        except Exception:  # noqa: BLE001 - the server's own load raises it where it is reported
            self.result = None


_early: Optional[_EarlyLoad] = None
_early_lock = threading.Lock()


def start_early(model: Optional[str], options: dict) -> None:
    """Begins loading `model` (a GGUF path; None: the default model) with engine `options` in a thread; the
    next load_model of that file with those options takes it (a load already begun is dropped for this one)."""
    global _early
    with _early_lock:
        _early = _EarlyLoad(model, options)
        _early.start()


def discard_early() -> None:
    """Drops an early load nobody took (the server's start-up loads are done), once it has ended: its engine's
    memory goes back. Blocks while it runs."""
    _take_early()


def _take_early() -> Optional[_EarlyLoad]:
    """The early load, ended (waited for), no longer anyone else's to take; None if there is none."""
    global _early
    with _early_lock:
        early, _early = _early, None
    if early is not None:
        early.join()
    return early


def _claim_early(path: str, options: dict) -> Optional[LoadedModel]:
    """The early load, if it is of `path` with `options` and it succeeded (waiting for it to end); else None
    (and it is dropped either way)."""
    t0 = time.perf_counter()
    early = _take_early()
    if early is None:
        return None
    if early.result is None or early.path != os.path.realpath(path) or early.options != options:
        return None
    early.result.times["waited"] = time.perf_counter() - t0
    return early.result
