"""A built tokenizer cached on disk, so a server's second start skips deriving it from the GGUF vocabulary.

Reading Gemma 3's vocabulary (262k tokens: their attributes, every token's bytes) takes ~0.3 s; loading what it
read from here takes ~0.05 s, and the native SentencePiece tokenizer builds from it in milliseconds. For the
vocabularies `tokenizers` handles (byte-level BPE, Gemma 4) the entry holds the merges it is built from.

Where: user_cache.py's folder (``$PYSERVE_CACHE_DIR``, "off" for none; else ``$XDG_CACHE_HOME/pyserve`` or
``~/.cache/pyserve``), one file per vocabulary under ``tokenizers/``. The key is a SHA-256 of the vocabulary
metadata itself (every ``tokenizer.*`` key and ``general.name``, which the rules read) and of the code that
derives it (this package's tokenizer sources, the ``tokenizers`` and Python versions), so an edited file, a
different file with the same vocabulary, or a new pyserve each find the right entry or none.

An entry is: a magic line, the SHA-256 of the payload, the payload (``marshal`` of read_parts's plain values:
no code runs on load). One that does not check out (truncated, corrupt, wrong shape, another key) is logged,
rebuilt and written again; writes go to a temporary file renamed into place, so a reader never sees half of
one. Any OSError of the cache (read-only home, full disk) is logged and the tokenizer built as without it.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import logging
import marshal
import sys
from array import array
from pathlib import Path
from typing import Any, Mapping, Optional

import tokenizers

from .tokenizer import Tokenizer, read_parts
from .user_cache import cache_dir, write_atomic

log = logging.getLogger(__name__)

__all__ = ["load_tokenizer", "vocab_key"]

_MAGIC = b"pyserve-tokenizer 1\n"
_PARTS = ("model", "pre", "tokens", "types", "scores", "attrs", "piece_bytes", "specials", "eos_ids", "fim", "recipe", "rstrip_ids")
_SOURCES = ("tokenizer.py", "hf_tokenizer.py", "fim_tokens.py", "tokenizer_cache.py")  # the code whose output is cached
_code_digest: Optional[bytes] = None


def _dist_version() -> str:
    try:
        return importlib.metadata.version("pyserve")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _code() -> bytes:
    global _code_digest
    if _code_digest is None:
        h = hashlib.sha256(f"{tokenizers.__version__} {sys.version_info[:2]} {marshal.version}".encode())
        here = Path(__file__).resolve().parent
        for name in _SOURCES:
            try:
                h.update((here / name).read_bytes())
            except OSError:  # installed without its sources (only .pyc): the distribution's version stands in
                h.update(f"{name} {_dist_version()}".encode())
        _code_digest = h.digest()
    return _code_digest


def _value_bytes(v: Any) -> bytes:
    """A metadata value as bytes, deterministically (not marshal: its output depends on reference counts);
    the long lists (tokens, merges, scores, types) the fast way, with their type and length in front."""
    if isinstance(v, list) and v:  # GGUF arrays hold one type
        try:
            if type(v[0]) is str:
                text = "\0".join(v)
                if text.count("\0") == len(v) - 1:  # no string holds a NUL: the joined text splits one way only
                    return b"s%d:" % len(v) + text.encode("utf-8", "surrogatepass")
            if type(v[0]) in (int, float):
                code = "q" if type(v[0]) is int else "d"
                return code.encode() + b"%d:" % len(v) + array(code, v).tobytes()
        except (TypeError, OverflowError):  # mixed types, an int past 64 bits: the slow way
            pass
    return repr(v).encode("utf-8", "surrogatepass")


def vocab_key(meta: Mapping[str, Any]) -> str:
    """Hex SHA-256 of the vocabulary metadata and the deriving code (the cache entry's name)."""
    h = hashlib.sha256(_code())
    for k in sorted(k for k in meta if k.startswith("tokenizer.") or k == "general.name"):
        h.update(k.encode() + b"\0" + _value_bytes(meta[k]) + b"\0")
    return h.hexdigest()


def _read(path: Path, key: str) -> Optional[dict]:
    """The entry's parts, or None when there is none; ValueError when it does not check out."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    head = len(_MAGIC) + 32
    if not data.startswith(_MAGIC) or len(data) < head:
        raise ValueError("not a tokenizer cache entry")
    body = memoryview(data)[head:]
    if hashlib.sha256(body).digest() != data[len(_MAGIC):head]:
        raise ValueError("checksum mismatch")
    entry = marshal.loads(body)
    if not isinstance(entry, dict) or entry.get("key") != key or set(entry) != {"key", *_PARTS}:
        raise ValueError("another key, or parts missing")
    n = len(entry["tokens"])
    if n == 0 or len(entry["attrs"]) != n or len(entry["piece_bytes"]) != n:
        raise ValueError("parts of different lengths")
    return entry


def _write(path: Path, key: str, parts: Mapping[str, Any]) -> None:
    body = marshal.dumps({"key": key, **{k: parts[k] for k in _PARTS}})
    write_atomic(path, _MAGIC + hashlib.sha256(body).digest() + body)


def load_tokenizer(meta: Mapping[str, Any], folder: Optional[Path] = None) -> tuple[Tokenizer, str]:
    """(the tokenizer of `meta`, how: "cached", "built" (and stored), or "built, not cached" (caching off or
    failing)). folder: the cache folder (default cache_dir())."""
    folder = folder if folder is not None else cache_dir()
    if folder is None:
        return Tokenizer.from_gguf_metadata(meta), "built, not cached"
    key = vocab_key(meta)
    path = folder / "tokenizers" / f"{key}.bin"
    try:
        entry = _read(path, key)
        if entry is not None:
            return Tokenizer.from_parts(entry), "cached"
    except (ValueError, EOFError, TypeError, KeyError, IndexError, OSError) as e:
        log.warning("tokenizer cache entry %s is unusable (%s): rebuilding it", path, e)
    parts = read_parts(meta)
    tok = Tokenizer.from_parts(parts)
    try:
        _write(path, key, parts)
    except OSError as e:
        log.warning("tokenizer cache: cannot write %s (%s)", path, e)
        return tok, "built, not cached"
    return tok, "built"
