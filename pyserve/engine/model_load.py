"""Loading a model: the engine's weights and the tokenizer side by side, then the engine's calibration; each
phase timed.

The engine's load (weights read and repacked) releases the GIL; the tokenizer (from tokenizer_cache.py, or
derived from the vocabulary) is Python and `tokenizers` work that holds it. So the tokenizer is made in a
second thread from the header (read on its own: ~0.05 s) while this one waits in the engine's constructor.
The engine's calibration (timed scratch forwards that seed its step-cost model, ~1 s with the serving
options; calibration_cache.py keeps it for the next load) runs after both, alone: beside the tokenizer's
thread its thread team would be descheduled, the timings inflated (measured: row costs 1.5-2x) and the
calibration itself slower.

Errors are those a load in sequence raises, in that order: the engine's (GGUFError / ModelError / ValueError,
once the tokenizer thread has ended), then the tokenizer's.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Optional

from .. import _engine
from .calibration_cache import calibrate
from .tokenizer import Tokenizer
from .tokenizer_cache import load_tokenizer

__all__ = ["LoadedModel", "load_model"]


@dataclass
class LoadedModel:
    engine: Any  # _engine.Engine
    metadata: dict
    tokenizer: Tokenizer
    times: dict = field(default_factory=dict)  # phase -> seconds: header, engine, tokenizer, calibrate, total
    tokenizer_source: str = ""  # tokenizer_cache.load_tokenizer's "cached" / "built" / "built, not cached"
    calibration_source: str = ""  # calibration_cache.calibrate's "cached" / "measured"


class _TokenizerThread(threading.Thread):
    def __init__(self, metadata: dict):
        super().__init__(name="pyserve-tokenizer", daemon=True)
        self.metadata = metadata
        self.result: Optional[tuple[Tokenizer, str]] = None
        self.error: Optional[BaseException] = None
        self.seconds = 0.0

    def run(self) -> None:
        t0 = time.perf_counter()
        try:
            self.result = load_tokenizer(self.metadata)
        except BaseException as e:  # noqa: BLE001 - handed to the loading thread, raised there
            self.error = e
        self.seconds = time.perf_counter() - t0


def load_model(path: str, options: dict) -> LoadedModel:
    """The engine of the GGUF at `path` (with engine `options`, EngineOptions.as_dict()) and its tokenizer."""
    t0 = time.perf_counter()
    metadata = _engine.read_gguf(path)[0]
    t_header = time.perf_counter()
    tok = _TokenizerThread(metadata)
    tok.start()
    try:
        engine = _engine.Engine(path, calibrate=False, **options)
    finally:
        t_engine = time.perf_counter()
        tok.join()
    if tok.error is not None:
        raise tok.error
    tokenizer, source = tok.result
    t_calibrate = time.perf_counter()
    how = calibrate(engine, path)
    t_end = time.perf_counter()
    times = {"header": t_header - t0, "engine": t_engine - t_header, "tokenizer": tok.seconds,
             "calibrate": t_end - t_calibrate, "total": t_end - t0}
    return LoadedModel(engine, metadata, tokenizer, times, source, how)
