"""Speculative decoding's one setting: how many tokens a stream may draft per step (0: off).

pyserve drafts by prompt lookup (csrc/ngram_draft.h): `speculative_ngram=K`, or vLLM's spelling of the same,
`speculative_config={"method": "ngram", "num_speculative_tokens": K}` (its `prompt_lookup_max` may be given
up to the index's 4; `prompt_lookup_min` is accepted). Draft models are not supported.

Hybrid models (recurrent layers, e.g. qwen35) cannot roll a rejected draft back out of their state: the engine
refuses speculation on them, naming the option. `pyserve serve`'s default K means "where the model allows it":
served_speculation turns it off for them (any other K still reaches the engine and is refused).
"""
from __future__ import annotations

import dataclasses
import json
from typing import Optional, Union

from .. import _engine
from .options import EngineOptions, option

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


def served_speculation(options, path: str):
    """`options` for serving the model at `path`: the serve default K (its EngineOptions serve_default) off where the
    model has recurrent layers; anything else unchanged (an unreadable file too: loading it reports why)."""
    default = next(option(f).serve_default for f in dataclasses.fields(EngineOptions) if f.name == "speculative_ngram")
    if options.speculative_ngram != default:
        return options
    try:
        recurrent = options.kv_geometry(path)["hparams"]["n_recurrent"] > 0
    except (ValueError, TypeError, OSError):
        return options
    return options.replace(speculative_ngram=0) if recurrent else options
