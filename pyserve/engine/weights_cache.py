"""The packed-weights cache: a model's weights as the engine packs them for its kernels (csrc/gguf/packed_file.h),
kept in pyserve's cache folder so that a later load maps them instead of packing them again.

Packing copies every matrix into fresh memory, and on this machine half a load's engine time is the kernel
zeroing those new pages (Gemma 3 270M: 0.3-0.6 s of one core). A mapped entry comes from the page cache: no
zeroing, no copy, one copy in memory for every process that maps it (a server's replicas).

An entry is `<cache>/weights/<key>.packed`, the key a hash of the model file's identity (user_cache.py: path,
size, mtime, inode) and the engine's packed layout (`_engine.packed_layout`): a changed file or another build
misses, and the engine itself maps only a file whose header and table fit the model (any other: it packs).
An entry is written after a load that packed, when the packed weights are at least MIN_BYTES (below that
packing costs less than the file: tiny test models) and the disk keeps twice their size free; the folder keeps
the MAX_ENTRIES entries used last. A write that fails is a warning: the next load packs again. A load writes
its entry in the background (keep_in_background: a first start of a 4B model would otherwise wait seconds
for the disk), in a thread that holds the engine until it is done and that the interpreter's exit waits for.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import threading
import time
from pathlib import Path
from typing import Optional

from .. import _engine
from .user_cache import cache_dir, file_identity, write_file_atomic

__all__ = ["entry_of", "keep", "keep_in_background", "wait_writes"]

MIN_BYTES = 32 << 20
MAX_ENTRIES = 4
_STALE_TMP = 600.0  # seconds: a temporary file this old is a killed writer's

log = logging.getLogger(__name__)
_writers: list[threading.Thread] = []
_writers_lock = threading.Lock()


def entry_of(path: str) -> Optional[Path]:
    """The cache entry for the model file at `path` (None: caching is off, or the file cannot be read)."""
    folder = cache_dir()
    ident = file_identity(os.path.realpath(path), layout=_engine.packed_layout)
    if folder is None or ident is None:
        return None
    key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:32]
    return folder / "weights" / f"{key}.packed"


def keep(engine, entry: Optional[Path]) -> str:
    """After a load with packed_weights=entry: "mapped" (the entry served it; marked used), "written" (it
    packed, and the entry now holds its weights) or "packed" (not kept: no cache, small, no room, or a failed
    write, logged)."""
    if entry is not None and engine.packed_from_file:
        _touch(entry)
        return "mapped"
    if not _worth_writing(engine, entry) or not _room_for(entry.parent, engine.packed_bytes):
        return "packed"
    try:
        write_file_atomic(entry, engine.save_packed_weights)
        _touch(entry)
    except (OSError, RuntimeError) as e:
        log.warning("cannot keep the packed weights in %s (%s): the next load packs them again", entry, e)
        return "packed"
    _prune(entry.parent)
    return "written"


def keep_in_background(engine, entry: Optional[Path]) -> str:
    """keep() in a thread when it has an entry to write: "mapped", "packed" (nothing to write), or "packed,
    writing the cache" (wait_writes() waits for it)."""
    if not _worth_writing(engine, entry):
        return keep(engine, entry)
    # not a daemon, whatever thread loads (trio's workers are daemons): the interpreter's exit waits for it
    writer = threading.Thread(target=keep, args=(engine, entry), name="pyserve-weights-cache", daemon=False)
    with _writers_lock:
        _writers[:] = [w for w in _writers if w.is_alive()] + [writer]
    writer.start()
    return "packed, writing the cache"


def wait_writes() -> None:
    """Returns once every background write begun so far has ended."""
    with _writers_lock:
        writers = list(_writers)
    for w in writers:
        w.join()


def _worth_writing(engine, entry: Optional[Path]) -> bool:
    """A cache to write to, weights that were packed (not mapped), and enough of them (MIN_BYTES)."""
    return entry is not None and not engine.packed_from_file and engine.packed_bytes >= MIN_BYTES


def _room_for(folder: Path, size: int) -> bool:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return shutil.disk_usage(folder).free >= 2 * size
    except OSError:
        return False


def _touch(entry: Path) -> None:
    """Marks `entry` used now (what _prune orders by), from the clock in nanoseconds: the file system's own
    stamps come from a coarse clock, and two loads a few milliseconds apart would tie."""
    now = time.time_ns()
    try:
        os.utime(entry, ns=(now, now))
    except OSError:
        pass


def _prune(folder: Path) -> None:
    """The MAX_ENTRIES entries used last stay; older ones, and stale temporary files, go."""
    try:
        entries = sorted(folder.glob("*.packed"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
        stale = [p for p in folder.glob("*.tmp") if time.time() - p.stat().st_mtime > _STALE_TMP]
    except OSError:
        return
    for p in entries[MAX_ENTRIES:] + stale:
        try:
            p.unlink()
        except OSError:
            pass
