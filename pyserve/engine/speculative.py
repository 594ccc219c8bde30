"""Speculative decoding's settings: how many tokens a stream may draft per step (0: off), and from where.

pyserve drafts by prompt lookup (csrc/scheduler/ngram_draft.h): `speculative_ngram=K`, or vLLM's spelling of the same,
`speculative_config={"method": "ngram", "num_speculative_tokens": K}` (its `prompt_lookup_max` may be given
up to the index's 4; `prompt_lookup_min` is accepted). Models whose file carries a multi-token-prediction
(NextN) layer — Qwen3.5/3.6, GLM-4.5 — draft with it: `speculative_method="mtp"`, or vLLM's
`{"method": "mtp"}` (and its model-named spellings, "qwen3_next_mtp", "deepseek_mtp", "glm4_moe_mtp", …).
The MTP layer guesses one token ahead a step, so one drafted token a step whatever K. Separate draft models
are not supported. Outputs are the same either way, bit for bit: the target verifies every draft.

Hybrid models (recurrent layers, e.g. qwen35) draft as every other model does: the engine keeps the recurrent
state after each drafted row and rolls a rejected draft back to the last accepted one (docs/design/recurrent-state.md).
"""
from __future__ import annotations

import json
from typing import Union

from .. import _engine

MAX_NGRAM = _engine.NgramIndex.max_ngram  # the longest suffix the index looks up
_KNOWN = {"method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"}


def speculation(speculative_config: Union[str, dict]) -> dict:
    """vLLM's speculative_config → the engine options it sets ({speculative_ngram, speculative_method});
    ValueError naming the field it cannot take."""
    cfg = json.loads(speculative_config) if isinstance(speculative_config, str) else speculative_config
    if not isinstance(cfg, dict):
        raise ValueError("speculative_config must be an object, e.g. {\"method\": \"ngram\", "
                         "\"num_speculative_tokens\": 7}")
    unknown = sorted(set(cfg) - _KNOWN)
    if unknown:
        raise ValueError(f"speculative_config: unknown key {unknown[0]!r} (known: {', '.join(sorted(_KNOWN))})")
    method = _method(cfg.get("method", "ngram"))
    if _count("prompt_lookup_max", cfg.get("prompt_lookup_max", MAX_NGRAM)) > MAX_NGRAM:
        raise ValueError(f"speculative_config: prompt_lookup_max must be at most {MAX_NGRAM}")
    _count("prompt_lookup_min", cfg.get("prompt_lookup_min", 1))
    default_k = 1 if method == "mtp" else 0  # vLLM: an MTP model's own number of predicted tokens
    k = _count("speculative_config.num_speculative_tokens", cfg.get("num_speculative_tokens", default_k))
    return {"speculative_ngram": k, "speculative_method": method}


def _method(method) -> str:
    if method == "ngram":
        return "ngram"
    if method == "mtp" or (isinstance(method, str) and method.endswith("_mtp")):  # vLLM's model-named ones
        return "mtp"
    raise ValueError(f"speculative_config: method {method!r} is not supported (only 'ngram', prompt lookup, "
                     "and 'mtp', the model's own multi-token-prediction layer; no draft models)")


def _count(field: str, value) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{field} must be an integer >= 0, got {value!r}")
    return value
