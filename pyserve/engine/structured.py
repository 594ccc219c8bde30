"""Structured output: what a request constrains its text to (StructuredOutputsParams, vLLM's shape), and the
per-model compiler that turns it into an engine grammar (llguidance's matcher, driven by the C++ sampler).

Why llguidance: a Rust core with a C API (no torch), grammar compiles in about a millisecond and masks in tens
of microseconds on Gemma's 262k vocabulary (scripts/bench_structured.py), and it takes JSON schema, regex and
Lark / GBNF grammars alike. Its Python package is used here for the text side only (a schema or GBNF grammar
→ llguidance's grammar text); the engine calls its C API from the step's sampling loop.

JSON is compact by default (", " and ": " between items and keys, no other whitespace): a model cannot run
away into indentation until max_tokens. `whitespace_pattern` (vLLM's) replaces that with a regex of the
whitespace allowed between tokens.
"""
from __future__ import annotations

import functools
import importlib.util
import json
import threading
from collections import OrderedDict
from dataclasses import dataclass, fields
from typing import Any, Callable, Optional, Union

from .tokenizer import Tokenizer

__all__ = ["StructuredOutputsParams", "GrammarCompiler", "map_schemas"]

_COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_CACHE_SIZE = 64  # compiled grammars kept per model (agents send the same schema again and again)
# An integer the schema leaves unbounded stays within ±(2^53 - 1), the range every JSON parser keeps exactly
# (I-JSON, RFC 7493): without a bound, a small model can write digits until max_tokens.
_SAFE_INT = 2**53 - 1
_VALUE_KEYS = frozenset({"enum", "const", "default", "examples"})  # hold instances, not schemas


@dataclass(frozen=True)
class StructuredOutputsParams:
    """Exactly one of json (a schema, as a dict or its JSON text), regex, choice (the allowed strings), grammar
    (Lark or llama.cpp's GBNF) or json_object (any JSON object); whitespace_pattern applies to JSON."""
    json: Optional[Union[str, dict, bool]] = None
    regex: Optional[str] = None
    choice: Optional[tuple[str, ...]] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None
    whitespace_pattern: Optional[str] = None
    llguidance_grammar: Optional[str] = None  # a TopLevelGrammar's JSON (the server's own: reasoning + answer)

    def __post_init__(self) -> None:
        if isinstance(self.choice, list):
            object.__setattr__(self, "choice", tuple(self.choice))
        given = [f.name for f in fields(self) if f.name != "whitespace_pattern" and getattr(self, f.name) is not None
                 and not (f.name == "json_object" and self.json_object is False)]
        if len(given) != 1:
            raise ValueError(f"structured_outputs: exactly one of json, regex, choice, grammar, json_object, "
                             f"got {', '.join(given) or 'none'}")

    def key(self) -> tuple:
        """Hashable identity, for the compile cache."""
        schema = self.json if not isinstance(self.json, dict) else json.dumps(self.json, sort_keys=True)
        return (schema, self.regex, self.choice, self.grammar, self.json_object, self.whitespace_pattern,
                self.llguidance_grammar)

    def llguidance(self) -> tuple[str, str]:
        """(kind, text) for the engine's grammar compiler. ValueError for a schema that is not JSON, an empty
        choice, a grammar that is neither Lark nor GBNF."""
        from llguidance import LLMatcher
        from llguidance.gbnf_to_lark import any_to_lark

        if self.regex is not None:
            return "regex", self.regex
        if self.llguidance_grammar is not None:
            return "llguidance", self.llguidance_grammar
        if self.choice is not None:
            if not all(isinstance(c, str) for c in self.choice) or not self.choice:
                raise ValueError("choice: a non-empty list of strings")
            return "lark", "start: " + " | ".join(json.dumps(c, ensure_ascii=False) for c in self.choice)
        if self.grammar is not None:
            try:
                return "lark", any_to_lark(self.grammar)
            except Exception as e:  # the converter's own errors (unbalanced rules, bad escapes)
                raise ValueError(f"grammar: {e}") from None
        schema = _bound_integers(_parse_schema(self.json if self.json is not None else {"type": "object"}))
        return "llguidance", LLMatcher.grammar_from_json_schema(schema, defaults=_COMPACT,
                                                                 overrides=self._whitespace())

    def _whitespace(self) -> Optional[dict]:
        if self.whitespace_pattern is None:
            return None
        return {"whitespace_flexible": True, "whitespace_pattern": self.whitespace_pattern,
                "item_separator": ",", "key_separator": ":"}


def _parse_schema(schema: Union[str, dict, bool]) -> dict:
    """The schema as an object: JSON text parsed, `true` (anything) as {}; `false` admits nothing."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as e:
            raise ValueError(f"json: the schema is not valid JSON: {e}") from None
    if schema is True:
        return {}
    if schema is False:
        raise ValueError("json: the schema `false` admits no document")
    if not isinstance(schema, dict):
        raise ValueError(f"json: a schema is an object or a boolean, got {type(schema).__name__}")
    return schema


def map_schemas(schema: Any, fn: Callable[[dict], dict]) -> Any:
    """A copy of the schema with fn applied to every (sub)schema object, innermost first; instances (enum,
    const, default, examples) are left as they are."""
    if isinstance(schema, list):
        return [map_schemas(s, fn) for s in schema]
    if not isinstance(schema, dict):
        return schema
    return fn({k: v if k in _VALUE_KEYS else map_schemas(v, fn) for k, v in schema.items()})


def _bound_integers(schema: Any) -> Any:
    """Every integer without a bound on a side gets the I-JSON one."""
    return map_schemas(schema, _bound_integer)


def _bound_integer(s: dict) -> dict:
    t = s.get("type")
    if t == "integer" or (isinstance(t, list) and "integer" in t):
        if "minimum" not in s and "exclusiveMinimum" not in s:
            s["minimum"] = -_SAFE_INT
        if "maximum" not in s and "exclusiveMaximum" not in s:
            s["maximum"] = _SAFE_INT
    return s


class GrammarCompiler:
    """Compiles StructuredOutputsParams into engine grammars for one model. Thread-safe: the server calls it
    on worker threads. The vocabulary (llguidance's tokenizer) is built on first use, from the engine's own
    tokens: a special token's bytes are 0xFF + its name (so no text can spell it), every end-of-generation
    id ends a grammar."""

    def __init__(self, tokenizer: Tokenizer, n_vocab: int):
        self._tokenizer = tokenizer
        self._n_vocab = n_vocab
        self._vocab = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple, Any] = OrderedDict()

    def compile(self, so: StructuredOutputsParams):
        """The grammar of `so` in its initial state (an _engine.Grammar; the engine clones it per sample).
        ValueError with the compiler's message when it does not compile or uses what it cannot enforce."""
        key = so.key()
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        kind, text = so.llguidance()
        grammar = _engine().Grammar.compile(self.vocab(), kind, text)
        with self._lock:
            self._cache[key] = grammar
            while len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        return grammar

    def vocab(self):
        with self._lock:
            if self._vocab is None:
                self._vocab = _engine().GrammarVocab(self._tokenizer.grammar_bytes(self._n_vocab),
                                                     list(self._tokenizer.eos_ids))
            return self._vocab


@functools.lru_cache(maxsize=None)
def _engine():
    """The extension, with llguidance's library loaded into it (found through the installed package; once)."""
    from .. import _engine as ext

    spec = importlib.util.find_spec("llguidance._lib")
    if spec is None or not spec.origin:
        raise RuntimeError("structured output needs the llguidance package (pip install llguidance)")
    ext.load_llguidance(spec.origin)
    return ext
