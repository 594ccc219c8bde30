"""pyserve's folder in the user's cache, atomic writes into it, and the identity a stamp keeps of a file
(tokenizer_cache.py, model_source.py).

``$PYSERVE_CACHE_DIR`` if set ("off": no cache at all), else ``$XDG_CACHE_HOME/pyserve``, else
``~/.cache/pyserve``. Everything in it can be deleted at any time: it is rebuilt on the next load.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, Optional

__all__ = ["ENV", "cache_dir", "write_atomic", "write_file_atomic", "file_identity"]

ENV = "PYSERVE_CACHE_DIR"


def cache_dir() -> Optional[Path]:
    """pyserve's cache folder (None: caching is off)."""
    v = os.environ.get(ENV)
    if v:
        return None if v.lower() == "off" else Path(v).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "pyserve"


def file_identity(path: str, **extra) -> Optional[dict]:
    """What a stamp keeps of the file at `path` to know it again: path, size, mtime, inode, and `extra` (what
    it was checked against); None when it cannot be read. Any change to the file changes one of them."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return {"path": path, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "ino": st.st_ino, **extra}


def write_atomic(path: Path, data: bytes) -> None:
    """Writes `data` to a temporary file beside `path`, then renames it into place: a reader sees the old
    file or the new one, never half of one. Raises OSError (the temporary file removed)."""
    write_file_atomic(path, lambda tmp: Path(tmp).write_bytes(data))


def write_file_atomic(path: Path, write: Callable[[str], object]) -> None:
    """`write(tmp)` fills a temporary file beside `path` (``<name>.<random>.tmp``, created empty), which is then
    renamed into place: a reader sees the old file or the whole new one. What `write` raises, or an OSError,
    goes on to the caller, the temporary file removed."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
