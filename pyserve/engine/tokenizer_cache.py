"""A built tokenizer cached on disk, so a server's second start skips deriving it from the GGUF vocabulary.

Reading Gemma 3's vocabulary (262k tokens: their attributes, every token's bytes) takes ~0.3 s; loading what it
read from here takes ~0.05 s, and the native SentencePiece tokenizer builds from it in milliseconds. For the
vocabularies `tokenizers` handles (byte-level BPE, Gemma 4) the entry holds the merges it is built from.

A server's start (load_tokenizer_of_file) finds the entry without reading the vocabulary: a stamp per file
(``tokenizers/files/``: path, size, mtime, inode, the code's digest -> the key) names it; a stamp that no longer
matches, or an entry that is gone, sends it the long way (the metadata read whole, the key hashed).

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
import json
import logging
import marshal
import os
import sys
from array import array
from pathlib import Path
from typing import Any, Mapping, Optional

import tokenizers

from .. import _engine
from .tokenizer import Tokenizer, read_parts
from .user_cache import cache_dir, file_identity, write_atomic

log = logging.getLogger(__name__)

__all__ = ["load_tokenizer", "load_tokenizer_of_file", "vocab_key"]

_MAGIC = b"pyserve-tokenizer 1\n"
_PARTS = ("model", "pre", "texts", "types", "scores", "attrs", "piece_bytes", "specials", "eos_ids", "fim", "recipe",
          "added")
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
    n = len(entry["attrs"])
    if n == 0 or len(entry["texts"][1]) != 4 * n or len(entry["piece_bytes"][1]) != 4 * n or len(entry["types"]) != n:
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
    return _cached(folder, key) or _build(meta, folder, key)


def load_tokenizer_of_file(path: str, folder: Optional[Path] = None) -> tuple[Tokenizer, str]:
    """load_tokenizer of the GGUF at `path`, as a server's start needs it: a file seen before (same path, size,
    mtime, inode, and the same deriving code) names its entry in a stamp, so its vocabulary (~260k strings) is
    not read into Python, nor hashed; otherwise the metadata is read whole, and the stamp written."""
    folder = folder if folder is not None else cache_dir()
    if folder is None:
        return load_tokenizer(_engine.read_gguf(path)[0], folder)
    stamp = folder / "tokenizers" / "files" / (hashlib.sha256(os.path.realpath(path).encode()).hexdigest() + ".json")
    seen = _stamp_key(stamp, path)
    found = _cached(folder, seen) if seen else None
    if found:
        return found
    meta = _engine.read_gguf(path)[0]
    key = vocab_key(meta)
    tok, how = (_cached(folder, key) if key != seen else None) or _build(meta, folder, key)
    if how != "built, not cached":
        _write_stamp(stamp, path, key)
    return tok, how


def _identity(path: str) -> Optional[dict]:
    return file_identity(os.path.realpath(path), code=_code().hex())


def _stamp_key(stamp: Path, path: str) -> Optional[str]:
    """The vocabulary key the stamp names, if it is of this file as it is now (else None)."""
    ident = _identity(path)
    try:
        data = json.loads(stamp.read_text())
        return data["key"] if ident is not None and data["file"] == ident else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_stamp(stamp: Path, path: str, key: str) -> None:
    ident = _identity(path)
    if ident is None:
        return
    try:
        write_atomic(stamp, json.dumps({"file": ident, "key": key}).encode())
    except OSError as e:
        log.warning("tokenizer cache: cannot write %s (%s)", stamp, e)


def _cached(folder: Path, key: str) -> Optional[tuple[Tokenizer, str]]:
    path = folder / "tokenizers" / f"{key}.bin"
    try:
        entry = _read(path, key)
        if entry is not None:
            return Tokenizer.from_parts(entry), "cached"
    except (ValueError, EOFError, TypeError, KeyError, IndexError, OSError) as e:
        log.warning("tokenizer cache entry %s is unusable (%s): rebuilding it", path, e)
    return None


def _build(meta: Mapping[str, Any], folder: Path, key: str) -> tuple[Tokenizer, str]:
    parts = read_parts(meta)
    tok = Tokenizer.from_parts(parts)
    path = folder / "tokenizers" / f"{key}.bin"
    try:
        _write(path, key, parts)
    except OSError as e:
        log.warning("tokenizer cache: cannot write %s (%s)", path, e)
        return tok, "built, not cached"
    return tok, "built"
