"""EngineOptions: the one definition of the engine's options.

`LLM`, `AsyncLLM.open`, `pyserve serve` / `pyserve generate` (their flags and help are generated from these
fields: `Option.flag`), and `--models-config` tables (their keys: `Option.key`) all take them from here; the
C++ EngineConfig (csrc/engine/engine.h) has the same names and defaults (tests/engine/test_engine_options.py holds them
together) and its check (`_engine.check_engine_config`) is the rule for their values. A new option is one
field here and one in EngineConfig.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from .. import _engine


def byte_size(value) -> int:
    """A byte count: an int, or text with an optional K/M/G/T suffix (powers of 1024): "256M", "1.5G"."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    t = str(value).strip().upper().removesuffix("B").removesuffix("I")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(t[-1:], 1)
    try:
        return int(float(t[:-1] if mult > 1 else t) * mult)
    except ValueError:
        raise ValueError(f"not a size in bytes: {value!r}") from None


@dataclass(frozen=True)
class Option:
    """How one option is spelled outside Python: its flag, its help, how text becomes its value, and what
    `pyserve serve` defaults it to when that differs from the offline API's default."""
    flag: str
    help: str
    parse: Optional[Callable[[Any], Any]] = None  # text (or a config file's value) → value; None: the field's type
    serve_default: Any = None  # None: the field's default
    metavar: Optional[str] = None
    exclusive: str = ""  # flags of the same group exclude each other
    zero_means: str = ""  # what a default of 0 stands for, in the help

    @property
    def key(self) -> str:
        """Its key in a --models-config table: the flag's name, '_' for '-'."""
        return self.flag.removeprefix("--").replace("-", "_")


def _option(default, flag: str, help: str, **kw):
    return field(default=default, metadata={"option": Option(flag, help, **kw)})


@dataclass(frozen=True)
class EngineOptions:
    n_threads: int = _option(0, "--threads", "engine threads", zero_means="one per core")
    n_ctx: int = _option(0, "--ctx-size", "max tokens per sequence", zero_means="the model's, at most 8192")
    num_kv_blocks: int = _option(0, "--num-kv-blocks", "KV cache blocks (of --block-size tokens)", exclusive="kv",
                                 zero_means="from --kv-cache-memory")
    kv_cache_memory: int = _option(0, "--kv-cache-memory", "KV cache size in bytes (K/M/G suffixes allowed); a hybrid "
                                   "model's recurrent state comes out of it too",
                                   parse=byte_size, metavar="BYTES", exclusive="kv",
                                   zero_means="512M, and at least one full context")
    block_size: int = _option(16, "--block-size", "tokens per KV cache block")
    max_num_seqs: int = _option(64, "--max-num-seqs", "sequences running at once at most")
    max_num_batched_tokens: int = _option(
        512, "--max-num-batched-tokens", "tokens per engine step at most; with --target-itl a hard cap, without "
        "it the budget (a smaller one cuts prompts into more chunks, so streams wait less)")
    enable_prefix_caching: bool = _option(True, "--enable-prefix-caching",
                                          "reuse the KV blocks of prompt prefixes seen before")
    # The serve default (docs/BENCHMARKS.md: how it was chosen): a step beside running streams takes only the
    # prompt tokens that keep it under this, so inter-token latency stays steady while new prompts still go in
    target_itl: float = _option(
        0.0, "--target-itl", "step-time target while streams run: each step takes only the prompt tokens that "
        "keep its predicted time under this, so inter-token latency holds under load (0: the fixed "
        "--max-num-batched-tokens budget)", serve_default=0.020, metavar="SECONDS")
    # The serve default (docs/BENCHMARKS.md): outputs are bit-identical either way; a stream whose text does not
    # copy stops drafting
    speculative_ngram: int = _option(
        0, "--speculative-ngram", "speculative decoding by prompt lookup: each step drafts up to K tokens per "
        "stream from earlier text that its last tokens match, verified in the same forward pass; outputs are "
        "unchanged, bit for bit (0: off)", serve_default=7, metavar="K")
    # Off: every step drafts where the lookup matches — for measuring speculation itself, or a machine whose
    # load-time forwards were timed while it was busy
    speculative_price_drafts: bool = _option(
        True, "--speculative-price-drafts", "with speculation: draft only as many tokens as the forward times "
        "measured at load say pay for themselves (off: every match is drafted)")
    # "mtp": the file's multi-token-prediction (NextN) layer drafts, one token ahead a step (Qwen3.5/3.6, GLM)
    speculative_method: str = _option(
        "ngram", "--speculative-method", "where drafted tokens come from: ngram (prompt lookup) or mtp (the "
        "model's own multi-token-prediction layer, where its file has one: one drafted token a step)",
        metavar="{ngram,mtp}")
    # docs/BENCHMARKS.md (2026-12-02): q8_0's accuracy cost against f32 on the default model
    kv_cache_dtype: str = _option(
        "f16", "--kv-cache-dtype", "how the KV cache stores K and V: f16, bf16, f32, q8_0 (34 bytes per 32 "
        "values: ~1.9x the tokens of f16 in the same memory; the model's head widths must be multiples of 32)",
        metavar="{f16,bf16,f32,q8_0}")
    kv_cache_dir: str = _option(
        "", "--kv-cache-dir", "the prefix cache's disk tier: full prompt blocks evicted from memory (and those "
        "cached at shutdown) are kept here and read back instead of recomputed, across restarts and by other "
        "servers of the same model file on the same directory (default: off)", metavar="DIR")
    kv_cache_disk: int = _option(0, "--kv-cache-disk", "bytes the disk tier may hold (K/M/G/T suffixes), the least "
                                 "recently used dropped", parse=byte_size, metavar="BYTES", zero_means="16G")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            _check_type(f.name, getattr(self, f.name), f.type)
        _engine.check_engine_config(**self.as_dict())  # the engine's rules: ValueError naming the field

    @classmethod
    def serving(cls, **overrides) -> "EngineOptions":
        """The defaults of `pyserve serve` (serve_default where a field has one), then `overrides`."""
        base = {f.name: option(f).serve_default for f in dataclasses.fields(cls)
                if option(f).serve_default is not None}
        return cls(**{**base, **overrides})

    @classmethod
    def from_config(cls, config: dict) -> "EngineOptions":
        """The options as an engine resolved them (Engine.config: n_threads, n_ctx, num_kv_blocks filled in)."""
        return cls(**{f.name: config[f.name] for f in dataclasses.fields(cls)})

    def as_dict(self) -> dict:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def replace(self, **changes) -> "EngineOptions":
        """A copy with `changes` (field names); TypeError naming an unknown one."""
        unknown = sorted(set(changes) - set(FIELDS))
        if unknown:
            raise TypeError(f"unknown engine option {unknown[0]!r} (known: {', '.join(FIELDS)})")
        return dataclasses.replace(self, **changes)

    def kv_geometry(self, path: str) -> dict:
        """What an engine with these options makes of the model at `path`, from its header alone: {n_ctx,
        num_kv_blocks, block_size, bytes_per_block, max_model_len, hparams}. Raises what loading would
        (GGUFError / ModelError / ValueError)."""
        return _engine.kv_geometry(path, **self.as_dict())


def option(f: dataclasses.Field) -> Option:
    return f.metadata["option"]


FIELDS = tuple(f.name for f in dataclasses.fields(EngineOptions))
BY_KEY = {option(f).key: f for f in dataclasses.fields(EngineOptions)}  # --models-config key → field


def parse_value(f: dataclasses.Field, value):
    """A flag's text or a config file's value → the field's value; ValueError naming the option."""
    opt = option(f)
    try:
        if opt.parse is not None:
            return opt.parse(value)
        if f.type in ("bool", bool) and isinstance(value, str):
            return {"true": True, "1": True, "false": False, "0": False}[value.strip().lower()]
        return value if not isinstance(value, str) else {"int": int, "float": float, "str": str}[str(f.type)](value)
    except (ValueError, KeyError):
        raise ValueError(f"{f.name}: expected {_KIND[str(f.type)]}, got {value!r}") from None


_KIND = {"int": "an integer", "float": "a number", "bool": "true or false", "str": "text"}


def _check_type(name: str, value, kind) -> None:
    kind = str(getattr(kind, "__name__", kind))
    ok = {"int": isinstance(value, int) and not isinstance(value, bool),
          "float": isinstance(value, (int, float)) and not isinstance(value, bool),
          "bool": isinstance(value, bool), "str": isinstance(value, str)}[kind]
    if not ok:
        raise ValueError(f"{name} must be {_KIND[kind]}, got {value!r}")
