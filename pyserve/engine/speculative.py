"""Speculative decoding's one setting: how many tokens a stream may draft per step (0: off).

pyserve drafts by prompt lookup (csrc/ngram_draft.h): `speculative_ngram=K`, or vLLM's spelling of the same,
`speculative_config={"method": "ngram", "num_speculative_tokens": K}` (its `prompt_lookup_max` may be given
up to the index's 4; `prompt_lookup_min` is accepted). Draft models are not supported.

Hybrid models (recurrent layers, e.g. qwen35) draft as every other model does: the engine keeps the recurrent
state after each drafted row and rolls a rejected draft back to the last accepted one (docs/ARCHITECTURE.md).
"""
from __future__ import annotations

import json
from typing import Optional, Union

from .. import _engine

MAX_NGRAM = _engine.NgramIndex.max_ngram  # the longest suffix the index looks up
_KNOWN = {"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"}


def draft_tokens(speculative_ngram: Optional[int], speculative_config: Union[None, str, dict] = None) -> int:
    """K from either spelling (the config wins when both are given); ValueError naming the field otherwise."""
    if speculative_config is None:
        k = 0 if speculative_ngram is None else speculative_ngram
        return _count("speculative_ngram", k)
    cfg = json.loads(speculative_config) if isinstance(speculative_config, str) else speculative_config
    if not isinstance(cfg, dict):
        raise ValueError("speculative_config must be an object, e.g. {\"method\": \"ngram\", "
                         "\"num_speculative_tokens\": 7}")
    unknown = sorted(set(cfg) - _KNOWN)
    if unknown:
        raise ValueError(f"speculative_config: unknown key {unknown[0]!r} (known: {', '.join(sorted(_KNOWN))})")
    if cfg.get("method", "ngram") != "ngram":
        raise ValueError(f"speculative_config: method {cfg['method']!r} is not supported (only 'ngram': prompt "
                         "lookup, no draft model)")
    if _count("prompt_lookup_max", cfg.get("prompt_lookup_max", MAX_NGRAM)) > MAX_NGRAM:
        raise ValueError(f"speculative_config: prompt_lookup_max must be at most {MAX_NGRAM}")
    _count("prompt_lookup_min", cfg.get("prompt_lookup_min", 1))
    return _count("speculative_config.num_speculative_tokens", cfg.get("num_speculative_tokens", 0))


def _count(field: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{field} must be an integer >= 0, got {value!r}")
    return value

