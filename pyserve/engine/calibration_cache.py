"""The engine's load-time calibration, kept in pyserve's cache folder (user_cache.py) for the next load.

With the serving options an engine times ~25 scratch forwards at load (~1 s on the default model, more on a
big one): the seed of its step-cost model (target_itl) and the row costs drafted tokens are priced on
(speculative_ngram). Both are refitted on every step the engine runs, so the seed only shapes the first
steps; a seed measured by an earlier load of the same file, with the same options, on the same machine is as
good as a new one. An entry is keyed by all of these (the file's path, size and mtime; the options the
engine resolved; the CPU model, the cores this process may use; the engine library's size and mtime) and
re-measured once it is a day old, so a calibration taken while the machine was busy does not last.

A missing, stale, unreadable or unfitting entry (seed_costs' ValueError) means a calibration as without the
cache; writes are atomic (user_cache.write_atomic); OSErrors of the cache are logged, never raised.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import time
from pathlib import Path
from typing import Optional

from .. import _engine
from .user_cache import cache_dir, write_atomic

log = logging.getLogger(__name__)

__all__ = ["calibrate"]

MAX_AGE_S = 24 * 3600.0
_FORMAT = 1


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 0


def calibration_key(path: str, config: dict) -> str:
    """Hex SHA-256 of everything a calibration depends on (see the module's docstring)."""
    st, lib = os.stat(path), os.stat(_engine.__file__)
    facts = {"format": _FORMAT, "path": os.path.realpath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
             "config": config, "cpu": _cpu_model(), "cores": _cores(),
             "engine": [lib.st_size, lib.st_mtime_ns]}
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()


def _seed(engine, entry: Path) -> bool:
    """True if the entry was fresh and the engine took it."""
    try:
        data = json.loads(entry.read_bytes())
        if not 0 <= time.time() - float(data["measured_at"]) < MAX_AGE_S:
            return False
        engine.seed_costs(data["step_weights"], data["row_costs"])
        return True
    except FileNotFoundError:
        return False
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("calibration cache entry %s is unusable (%s): measuring again", entry, e)
        return False


def calibrate(engine, path: str, folder: Optional[Path] = None) -> str:
    """Calibrates `engine` (constructed with calibrate=False from the file at `path`): from the cache
    ("cached") or by measuring ("measured"; stored for the next load). folder: default cache_dir()."""
    folder = folder if folder is not None else cache_dir()
    config = engine.config
    if folder is None or not (config["target_itl"] > 0 or config["speculative_ngram"] > 0):
        engine.calibrate()
        return "measured"
    entry = folder / "calibration" / f"{calibration_key(path, config)}.json"
    if _seed(engine, entry):
        return "cached"
    engine.calibrate()
    data = {"measured_at": time.time(), **engine.calibration()}
    try:
        write_atomic(entry, json.dumps(data).encode())
    except OSError as e:
        log.warning("calibration cache: cannot write %s (%s)", entry, e)
    return "measured"
