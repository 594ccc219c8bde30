"""Test helper: a GGUF file's metadata (key -> python value) through the engine's own reader, cached."""
from __future__ import annotations

import os
from typing import Any

from pyserve import _engine

_CACHE: dict[str, dict[str, Any]] = {}


def load_gguf_metadata(path: str | os.PathLike) -> dict[str, Any]:
    key = os.path.realpath(path)
    if key not in _CACHE:
        _CACHE[key] = _engine.read_gguf(key)[0]
    return _CACHE[key]
