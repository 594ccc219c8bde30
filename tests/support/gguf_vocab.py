"""Test helper: a GGUF file's metadata (key -> python value) through the engine's own reader, cached, and
llama.cpp's test vocabularies in tests/data/vocab (vocab-only GGUFs with their .inp/.out vectors)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pyserve import _engine
from pyserve.engine.tokenizer import Tokenizer

from .paths import DATA

VOCAB_DIR = DATA / "vocab"
SEP = "\n__ggml_vocab_test__\n"  # between the cases of a .inp file (tests/data/vocab/INDEX.md)

_CACHE: dict[str, dict[str, Any]] = {}
_TOKENIZERS: dict[str, Tokenizer] = {}


def load_gguf_metadata(path: str | os.PathLike) -> dict[str, Any]:
    key = os.path.realpath(path)
    if key not in _CACHE:
        _CACHE[key] = _engine.read_gguf(key)[0]
    return _CACHE[key]


def vocab_path(name: str) -> Path:
    return VOCAB_DIR / f"ggml-vocab-{name}.gguf"


def vocab_meta(name: str) -> dict[str, Any]:
    path = vocab_path(name)
    assert path.is_file(), f"missing test vocabulary {path}"
    return load_gguf_metadata(path)


def vocab_tokenizer(name: str) -> Tokenizer:
    tok = _TOKENIZERS.get(name)
    if tok is None:
        tok = _TOKENIZERS[name] = Tokenizer.from_gguf_metadata(vocab_meta(name))
    return tok


def read_vectors(name: str) -> list[tuple[str, list[int]]]:
    """(text, expected ids) pairs: the cases in .inp are split on the separator line, which may also end the
    last one (as upstream's test-tokenizer-0 reads them); .out has one line per case."""
    base = vocab_path(name)
    inp = base.with_name(base.name + ".inp").read_text(encoding="utf-8")
    out = base.with_name(base.name + ".out").read_text(encoding="utf-8")
    cases = inp.split(SEP)
    if inp.endswith(SEP):
        cases.pop()
    lines = out.split("\n")
    assert lines[-1] == ""
    lines = lines[:-1]
    assert len(cases) == len(lines), (len(cases), len(lines))
    return [(text, [int(x) for x in line.split()]) for text, line in zip(cases, lines)]


# the vocabularies of tests/data/vocab the tokenizer must match llama.cpp on, and the others it is checked on
REQUIRED = ["llama-spm", "phi-3", "llama-bpe", "qwen2", "qwen35", "gpt-2", "gemma-4"]
OTHERS = ["deepseek-llm", "deepseek-coder", "falcon", "starcoder", "refact", "mpt", "command-r"]
ALL_VOCABS = REQUIRED + OTHERS
