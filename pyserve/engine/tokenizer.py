"""Tokenizer for GGUF models: SentencePiece BPE natively, the others on the HuggingFace ``tokenizers`` package.

The behaviour follows llama.cpp's ``llama-vocab.cpp`` (the reference the engine is checked
against):

* ``tokenizer.ggml.model == "llama"`` (SentencePiece BPE: gemma 1-3, llama 2, mistral, phi-3):
  merge the adjacent pair of normal tokens whose concatenation is the best-scoring normal token,
  with byte fallback to the ``<0xNN>`` tokens. Spaces become ``▁``; when ``add_space_prefix`` is on
  (llama.cpp's default for this model type) each stretch of text gets a leading ``▁``, as llama.cpp
  does. Serving uses the native SpmTokenizer (csrc/tokenizer/spm_tokenizer.h: built in milliseconds, the GIL
  released while it encodes); its twin, a ``tokenizers`` BPE whose merges are derived from the
  scores (hf_tokenizer.py; ~0.6 s to build for Gemma 3), is the reference tests hold it to
  (``reference_encoder``).
* ``tokenizer.ggml.model == "gpt2"`` (byte-level BPE with ``tokenizer.ggml.merges``): the
  pre-tokenizer regexes that llama.cpp uses for ``tokenizer.ggml.pre``, applied in sequence
  (each one splits the pieces of the previous one, keeping unmatched text as pieces), then the
  GPT-2 byte-to-unicode mapping.
* ``tokenizer.ggml.model == "gemma4"`` (SentencePiece-style BPE with ``tokenizer.ggml.merges``):
  spaces become ``▁`` (no space prefix), the text is split only into runs of newlines and runs of
  other characters, merges run by rank on the raw characters (no byte-level mapping), and what no
  merge resolves falls back to the ``<0xNN>`` tokens. llama.cpp looks a run of newlines up whole
  before merging (its Gemma 4 fix); ranked BPE here already ends on that one token for every run the
  vocabulary holds (1 to 31 newlines, tested), so nothing extra is done. BOS is always added
  (llama.cpp forces ``add_bos_token`` on for this model).

Special tokens: user-defined tokens (type 4) are always matched whole in the text; control
(type 3) and unknown (type 2) tokens only when ``parse_special`` is asked for. Matching is on
the raw text (before any normalisation), like llama.cpp.

Decoding concatenates each token's bytes (``token_bytes``) and decodes them as UTF-8 with
replacement, so it is context free and lossless; llama.cpp's optional "clean up tokenization
spaces" pass for some BPE vocabularies is deliberately not applied (it is not applied to
streamed text in llama.cpp either).
"""
from __future__ import annotations

import itertools
import logging
import operator
from array import array
from dataclasses import astuple, dataclass
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Protocol, Sequence

from .. import _engine
from .fim_tokens import FimTokens, read_fim_tokens
from .hf_tokenizer import HFEncoder, Recipe, spm_merges

logger = logging.getLogger(__name__)

__all__ = ["Tokenizer", "SUPPORTED_MODELS", "read_parts"]

SUPPORTED_MODELS = ("llama", "gpt2", "gemma4")

# GGUF token types (llama.cpp's LLAMA_TOKEN_TYPE_*)
TT_UNDEFINED, TT_NORMAL, TT_UNKNOWN, TT_CONTROL, TT_USER_DEFINED, TT_UNUSED, TT_BYTE = range(7)

# attribute bits, as llama.cpp's LLAMA_TOKEN_ATTR_* (only the ones used here)
_A_UNKNOWN = 1 << 1
_A_UNUSED = 1 << 2
_A_NORMAL = 1 << 3
_A_CONTROL = 1 << 4
_A_USER_DEFINED = 1 << 5
_A_BYTE = 1 << 6
_TYPE_TO_ATTR = {
    TT_NORMAL: _A_NORMAL,
    TT_UNKNOWN: _A_UNKNOWN,
    TT_CONTROL: _A_CONTROL,
    TT_USER_DEFINED: _A_USER_DEFINED,
    TT_UNUSED: _A_UNUSED,
    TT_BYTE: _A_BYTE,
}
_A_SKIPPED = _A_UNKNOWN | _A_CONTROL  # rendered as "" when special tokens are skipped

_SPACE_MARK = "\u2581"  # ▁

# tokenizer.ggml.pre -> (family, ignore_merges, default add_bos); from llama.cpp's vocab loader
_PRE_TABLE: dict[str, tuple[str, bool, bool]] = {}


def _register(names: Iterable[str], family: str, ignore_merges: bool = False, add_bos: bool = False) -> None:
    for n in names:
        _PRE_TABLE[n] = (family, ignore_merges, add_bos)


_register(["default"], "default")
_register(["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
           "jina-v5-nano"], "llama3", ignore_merges=True, add_bos=True)
_register(["dbrx", "smaug-bpe", "glm4", "chatglm-bpe"], "llama3")
_register(["deepseek-llm"], "deepseek-llm")
_register(["deepseek-coder"], "deepseek-coder")
_register(["deepseek-v3", "hunyuan-dense", "joyai-llm"], "deepseek-v3")
_register(["falcon"], "falcon")
_register(["starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b",
           "mellum2"], "starcoder")
_register(["gpt-2", "phi-2", "jina-es", "jina-de", "gigachat", "jina-v2-es", "jina-v2-de", "a.x-4.0",
           "mellum", "modern-bert", "jina-v1-en", "jina-v2-code", "roberta-bpe", "mpt", "olmo", "jais",
           "trillion", "granite-docling", "exaone4"], "gpt2")
_register(["qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "stablelm2", "hunyuan", "megrez",
           "solar-open"], "qwen2")
_register(["qwen35"], "qwen35")
_register(["poro-chat", "bloom", "gpt3-finnish"], "poro")
_register(["viking"], "viking")
_register(["tekken"], "tekken", ignore_merges=True, add_bos=True)
_register(["gpt-4o", "llama4", "kanana2", "talkie"], "gpt4o")
_register(["seed-coder"], "seed-coder")
_register(["bailingmoe", "bailingmoe2", "llada-moe"], "bailingmoe")

# token texts that llama.cpp treats as end-of-turn / end-of-generation markers
_EOT_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
              "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>")
_EOG_TEXTS = ("<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
              "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
              "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
              "<｜end▁of▁sentence｜>", "[e~[")


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable unicode character table."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


_BYTE_DECODER_TABLE = {ord(c): chr(b) for b, c in bytes_to_unicode().items()}


def _bytelevel_to_bytes(text: str) -> bytes:
    """Bytes of a byte-level BPE token text (each char one byte); other chars as UTF-8."""
    try:
        return text.translate(_BYTE_DECODER_TABLE).encode("latin-1")
    except UnicodeEncodeError:
        return b"".join(_BYTE_DECODER_TABLE[ord(c)].encode("latin-1") if ord(c) in _BYTE_DECODER_TABLE
                        else c.encode("utf-8") for c in text)


def _get(meta: Mapping[str, Any], key: str, default: Any = None) -> Any:
    v = meta.get(key, default)
    return default if v is None else v


class PackedTexts(NamedTuple):
    """The token texts as one UTF-8 blob (surrogate escapes kept as their bytes) and each text's end in it
    (uint32): what the cache stores and the native tokenizer takes without 262k Python strings."""
    blob: bytes
    ends: bytes  # [n_vocab] uint32, native byte order

    @classmethod
    def pack(cls, texts: list[str]) -> "PackedTexts":
        return cls.pack_bytes([t.encode("utf-8", "surrogateescape") for t in texts])

    @classmethod
    def pack_bytes(cls, data: list[bytes]) -> "PackedTexts":
        return cls(b"".join(data), array("I", itertools.accumulate(map(len, data))).tobytes())

    def text(self, i: int) -> str:
        ends = memoryview(self.ends).cast("I")
        return self.blob[ends[i - 1] if i else 0:ends[i]].decode("utf-8", "surrogateescape")

    def unpack(self) -> list[str]:
        ends = memoryview(self.ends).cast("I")
        starts = itertools.chain((0,), ends)
        return [self.blob[a:b].decode("utf-8", "surrogateescape") for a, b in zip(starts, ends)]


class Pieces:
    """Token id -> the bytes it stands for, sliced from a PackedTexts of them: a list of 262k bytes objects took
    25-50 ms of a server's start to unmarshal from the cache, holding the GIL beside the server's imports."""

    __slots__ = ("_blob", "_ends", "_longest")

    def __init__(self, blob: bytes, ends: bytes, longest: int) -> None:
        """longest: the most bytes a token stands for (the server's bound on a prompt's characters, asked for at
        every load: read from the cache rather than found again, ~20 ms)."""
        self._blob, self._ends, self._longest = blob, memoryview(ends).cast("I"), longest

    @classmethod
    def parts(cls, pieces: list[bytes]) -> tuple[bytes, bytes, int]:
        """What makes a Pieces of `pieces` (marshal can store it)."""
        return (*PackedTexts.pack_bytes(pieces), max(map(len, pieces), default=0))

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, i: int) -> bytes:
        """IndexError for an id outside the vocabulary (a negative one too)."""
        ends = self._ends
        if i > 0:
            return self._blob[ends[i - 1]:ends[i]]
        if i == 0:
            return self._blob[:ends[0]]
        raise IndexError(f"token id {i} is negative")

    def first(self, n: int) -> Iterable[bytes]:
        """The first n (at most all) tokens' bytes."""
        return map(self.__getitem__, range(min(n, len(self))))

    def longest(self, n: int) -> int:
        """The most bytes one of the first n tokens stands for (0 for none)."""
        if n >= len(self):
            return self._longest
        ends = self._ends[:n]
        return max(map(operator.sub, ends, itertools.chain((0,), ends)), default=0)


class Encoder(Protocol):
    """Text -> ids without BOS/EOS: _engine.SpmTokenizer or hf_tokenizer.HFEncoder."""

    def encode(self, text: str, parse_special: bool = False) -> list[int]: ...

    def token_to_id(self, text: str) -> int | None: ...


class Tokenizer:
    """Text <-> token ids for one GGUF vocabulary. Build with :meth:`from_gguf_metadata`."""

    def __init__(self, *, encoder: Encoder, model: str, pre: str | None, texts: PackedTexts, attrs: bytes,
                 piece_bytes: Pieces, specials: _Specials, eos_ids: tuple[int, ...],
                 fim: FimTokens = FimTokens(), parts: Mapping[str, Any] | None = None) -> None:
        self._encoder = encoder
        self._parts = parts  # read_parts's values (what reference_encoder builds from)
        self.model = model
        self.pre = pre
        self._texts = texts
        self._attrs = attrs
        self._piece_bytes = piece_bytes
        self.bos_id = specials.bos_id
        self.eos_id = specials.eos_id
        self.eos_ids = eos_ids
        self.add_bos = specials.add_bos
        self.add_eos = specials.add_eos
        self.add_space_prefix = specials.add_space_prefix
        self.vocab_size = len(texts.ends) // 4  # uint32 each
        self._fim = fim

    # ------------------------------------------------------------------------------ building

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any]) -> "Tokenizer":
        """The tokenizer of a GGUF's ``tokenizer.ggml.*`` metadata, read as llama.cpp's vocab loader does."""
        return cls.from_parts(read_parts(meta))

    @classmethod
    def from_parts(cls, parts: Mapping[str, Any]) -> "Tokenizer":
        """The tokenizer of ``read_parts``'s plain values (what tokenizer_cache.py stores)."""
        recipe = Recipe(*parts["recipe"])
        encoder = _native_spm(parts) if recipe.kind == "spm" else _hf_encoder(parts, recipe)
        return cls(encoder=encoder, model=parts["model"], pre=parts["pre"], texts=PackedTexts(*parts["texts"]),
                   attrs=parts["attrs"], piece_bytes=Pieces(*parts["piece_bytes"]),
                   specials=_Specials(*parts["specials"]),
                   eos_ids=tuple(parts["eos_ids"]), fim=FimTokens(*parts["fim"]), parts=parts)

    def reference_encoder(self) -> Encoder:
        """The `tokenizers` pipeline of this vocabulary (for SentencePiece BPE the native tokenizer's twin, its
        merges derived from the scores: slow to build; tests compare the two)."""
        recipe = Recipe(*self._parts["recipe"])
        if recipe.kind == "spm":
            p = self._parts
            recipe = recipe._replace(merges=spm_merges(PackedTexts(*p["texts"]).unpack(), p["types"],
                                                       array("f", p["scores"])))
        return _hf_encoder(self._parts, recipe)

    # ------------------------------------------------------------------------------ encode

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of ``text``.

        add_special: add BOS / EOS as the vocabulary asks (tokenizer.ggml.add_bos_token /
        add_eos_token); a BOS is not added when the text already starts with the BOS token
        (parsed from its text with ``parse_special``), likewise for a trailing EOS.
        parse_special: recognise control tokens (e.g. ``<start_of_turn>``) written in the text.
        User-defined tokens are always recognised.
        """
        ids = self._encoder.encode(text, parse_special) if text else []
        if add_special:
            if self.add_bos and not (ids and ids[0] == self.bos_id):
                ids.insert(0, self.bos_id)
            if self.add_eos and not (len(ids) > (1 if self.add_bos else 0) and ids[-1] == self.eos_id):
                ids.append(self.eos_id)
        return ids

    # ------------------------------------------------------------------------------ decode

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes token ``token_id`` contributes to the text (special tokens: their text)."""
        return self._piece_bytes[token_id]

    id_to_piece = token_bytes

    def longest_token_bytes(self, n_vocab: int) -> int:
        """The most bytes one of the first ``n_vocab`` tokens contributes (0 for none)."""
        return self._piece_bytes.longest(n_vocab)

    def grammar_bytes(self, n_vocab: int) -> list[bytes]:
        """What each of the model's n_vocab ids writes, as a grammar engine sees it: a control or unknown
        token's bytes are 0xFF + its name (no text can spell it: 0xFF never occurs in UTF-8), ids past the
        vocabulary (a padded output layer) write nothing."""
        out = [b"\xff" + p if a & _A_SKIPPED else p
               for p, a in zip(self._piece_bytes.first(n_vocab), self._attrs)]
        return out + [b""] * (n_vocab - len(out))

    def token_to_id(self, text: str) -> int | None:
        return self._encoder.token_to_id(text)

    def piece(self, token_id: int, skip_special: bool = True) -> bytes:
        """Bytes of one token as ``decode`` uses them (b"" for a skipped special token)."""
        if skip_special and self._attrs[token_id] & _A_SKIPPED:
            return b""
        return self._piece_bytes[token_id]

    def decode_bytes(self, ids: Sequence[int], skip_special: bool = True) -> bytes:
        """Concatenated token bytes. When the vocabulary adds a SentencePiece space prefix
        (``add_space_prefix``), the space that starts the text is dropped, so that
        ``decode(encode(x)) == x`` (a leading BOS does not count as text)."""
        attrs, pieces = self._attrs, self._piece_bytes
        if skip_special:
            data = b"".join([pieces[i] for i in ids if not attrs[i] & _A_SKIPPED])
        else:
            data = b"".join([pieces[i] for i in ids])
        if self.add_space_prefix and data[:1] == b" ":
            data = data[1:]
        return data

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        """Text of ``ids``. skip_special: leave out control / unknown tokens (BOS, EOS,
        ``<end_of_turn>``, ...); user-defined tokens are always rendered."""
        return self.decode_bytes(ids, skip_special).decode("utf-8", errors="replace")

    # ------------------------------------------------------------------------------ misc

    def fim_tokens(self) -> FimTokens:
        """The fill-in-the-middle tokens (fim_tokens.py: the GGUF keys, else the family's token texts)."""
        return self._fim

    def special_texts(self) -> dict[str, str]:
        """bos_token / eos_token strings for chat templates ("" where the vocab has none)."""
        return {
            "bos_token": self._texts.text(self.bos_id) if self.bos_id is not None else "",
            "eos_token": self._texts.text(self.eos_id) if self.eos_id is not None else "",
        }

    def __repr__(self) -> str:
        return (f"Tokenizer(model={self.model!r}, pre={self.pre!r}, vocab_size={self.vocab_size}, "
                f"bos_id={self.bos_id}, eos_ids={self.eos_ids}, add_bos={self.add_bos})")


# ---------------------------------------------------------------------------------------------
# reading the GGUF vocabulary (as llama.cpp's llama_vocab::load)
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Specials:
    """Special token ids (None: the vocabulary has none) and the add-BOS/EOS/space-prefix flags."""
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    eot_id: int | None
    eom_id: int | None
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool


def read_parts(meta: Mapping[str, Any]) -> dict[str, Any]:
    """Everything a Tokenizer is made of, derived from the metadata, as plain values (str, int, bytes, lists,
    tuples: ``marshal`` can store them); the `tokenizers` object itself is built from them by ``from_parts``."""
    model = _get(meta, "tokenizer.ggml.model")
    if model not in SUPPORTED_MODELS:
        raise ValueError(f"unsupported tokenizer.ggml.model {model!r}; supported: {', '.join(SUPPORTED_MODELS)}")
    tokens, types, token_to_id = _read_tokens(meta)
    pre = _get(meta, "tokenizer.ggml.pre")
    specials = _read_specials(meta, model, pre, len(tokens))
    fim = read_fim_tokens(meta, token_to_id)
    eos_ids = _eog_ids(specials, types, token_to_id, fim.end_ids())
    attrs = [_TYPE_TO_ATTR.get(t, 0) for t in types]
    _force_control(attrs, types, token_to_id, (specials.eot_id, specials.eom_id, *fim.ids()))
    merges = _get(meta, "tokenizer.ggml.merges", [])
    if model == "llama":
        has_bytes = all(f"<0x{b:02X}>" in token_to_id for b in range(256))
        unk = tokens[specials.unk_id] if specials.unk_id is not None else None
        recipe = Recipe("spm", [], has_bytes, unk, specials.add_space_prefix)  # merges: the native tokenizer's
    elif model == "gemma4":
        recipe = Recipe("spm_bpe", _read_merges(token_to_id, merges, model), True)
    else:
        recipe = _bpe_recipe(token_to_id, merges, pre)
    piece_bytes = _piece_bytes(tokens, attrs, _bytelevel_to_bytes if model == "gpt2" else _spm_normal_bytes)
    rstrip = _rstrip_ids(meta, attrs, token_to_id)
    return {"model": model, "pre": pre, "texts": tuple(PackedTexts.pack(tokens)),
            "types": bytes(t if 0 <= t < 256 else 0 for t in types),
            "scores": _scores(meta, len(tokens)) if model == "llama" else b"", "attrs": bytes(attrs),
            "piece_bytes": Pieces.parts(piece_bytes), "specials": astuple(specials), "eos_ids": eos_ids,
            "fim": astuple(fim), "recipe": tuple(recipe), "added": _added(attrs, rstrip)}


def _scores(meta: Mapping[str, Any], n: int) -> bytes:
    """tokenizer.ggml.scores as float32 bytes; b"" (every score 0) where they are missing or too few."""
    scores = _get(meta, "tokenizer.ggml.scores")
    if scores is None or len(scores) < n:
        return b""
    return array("f", [float(x) for x in scores[:n]]).tobytes()


def _read_tokens(meta: Mapping[str, Any]) -> tuple[list[str], list[int], dict[str, int]]:
    """(token texts, token types, text -> id), validated; empty texts renamed as llama.cpp does."""
    tokens = list(_get(meta, "tokenizer.ggml.tokens", []))
    n = len(tokens)
    if n == 0:
        raise ValueError("GGUF metadata has no tokenizer.ggml.tokens")
    if isinstance(tokens[0], (bytes, bytearray)):
        tokens = [bytes(t).decode("utf-8", errors="replace") for t in tokens]
    types = [int(t) for t in _get(meta, "tokenizer.ggml.token_type", [])] or [TT_NORMAL] * n
    if len(types) < n:
        raise ValueError("tokenizer.ggml.token_type is shorter than tokenizer.ggml.tokens")
    for i, t in enumerate(tokens):
        if not t:
            tokens[i] = f"[EMPTY_{i}]"
    token_to_id = {t: i for i, t in enumerate(tokens)}
    if len(token_to_id) != n:
        raise ValueError("duplicate token texts in tokenizer.ggml.tokens")
    return tokens, types[:n], token_to_id


def _special_id(meta: Mapping[str, Any], key: str, default: int | None, n: int) -> int | None:
    """The id under ``key``; the default where it is absent or out of [0, n) (None if that is too)."""
    fallback = default if default is not None and 0 <= default < n else None
    v = meta.get(key)
    if v is None:
        return fallback
    v = int(v)
    if not 0 <= v < n:
        logger.warning("bad special token %s = %d (vocab size %d)", key, v, n)
        return fallback
    return v


def _flag(meta: Mapping[str, Any], key: str, default: bool) -> bool:
    v = meta.get(key)
    return default if v is None else bool(v)


def _read_specials(meta: Mapping[str, Any], model: str, pre: str | None, n: int) -> _Specials:
    """Special ids and flags, with llama.cpp's per-model defaults where the metadata is silent."""
    if model == "llama":
        bos, eos, unk, add_bos = 1, 2, 0, True
    elif model == "gemma4":
        bos, eos, unk, add_bos = None, None, None, True
    else:
        fam = _PRE_TABLE.get(pre) if pre else None
        bos, eos, unk, add_bos = 11, 11, None, fam[2] if fam else False
    sp = _Specials(
        bos_id=_special_id(meta, "tokenizer.ggml.bos_token_id", bos, n),
        eos_id=_special_id(meta, "tokenizer.ggml.eos_token_id", eos, n),
        unk_id=_special_id(meta, "tokenizer.ggml.unknown_token_id", unk, n),
        eot_id=_special_id(meta, "tokenizer.ggml.eot_token_id", None, n),
        eom_id=_special_id(meta, "tokenizer.ggml.eom_token_id", None, n),
        # gemma4: llama.cpp turns BOS on even where the file says false (the model needs it)
        add_bos=model == "gemma4" or _flag(meta, "tokenizer.ggml.add_bos_token", add_bos),
        add_eos=_flag(meta, "tokenizer.ggml.add_eos_token", False),
        # only SentencePiece vocabularies have a space prefix
        add_space_prefix=model == "llama" and _flag(meta, "tokenizer.ggml.add_space_prefix", True))
    if sp.add_bos and sp.bos_id is None:
        raise ValueError("tokenizer.ggml.add_bos_token is true, but there is no BOS token")
    if sp.add_eos and sp.eos_id is None:
        raise ValueError("tokenizer.ggml.add_eos_token is true, but there is no EOS token")
    return sp


def _marker_ids(texts: Iterable[str], types: list[int], token_to_id: Mapping[str, int]) -> list[int]:
    """Ids of the tokens spelled by ``texts`` that the file types as special (control or user-defined).
    One typed as normal text is a word, not a marker: ``</s>`` in Qwen 2 or Gemma 4 (llama.cpp takes
    every match, then hands Gemma 4's ``</s>`` back to the text)."""
    ids = (token_to_id.get(t) for t in texts)
    return [i for i in ids if i is not None and types[i] in (TT_CONTROL, TT_USER_DEFINED)]


def _eog_ids(sp: _Specials, types: list[int], token_to_id: Mapping[str, int],
             fim_end_ids: Iterable[int] = ()) -> tuple[int, ...]:
    """End-of-generation ids: eos, eot/eom from the metadata, the well-known end-of-turn texts
    that the vocabulary marks as special (Gemma 4's user-defined ``<|tool_response>`` too: the model
    stops there to wait for the tool), and FIM pad / repo / file-separator tokens (as llama.cpp: a
    coder model writing one has finished); the first one found leads, the rest by id."""
    eog: list[int] = []
    for i in (sp.eos_id, sp.eot_id, sp.eom_id, *_marker_ids(_EOG_TEXTS, types, token_to_id), *fim_end_ids):
        if i is not None and i not in eog:
            eog.append(i)
    eog = _harmony_end_goes_on(eog, token_to_id)
    return tuple(eog[:1] + sorted(eog[1:]))


def _harmony_end_goes_on(eog: list[int], token_to_id: Mapping[str, int]) -> list[int]:
    """gpt-oss's harmony (and Solar Open's) ``<|end|>`` closes a message, not the turn: with ``<|return|>`` and
    ``<|call|>`` (or ``<|calls|>`` and ``<|flush|>``) among the end ids it is not one (llama.cpp's rule)."""
    have = {t for t in ("<|return|>", "<|call|>", "<|calls|>", "<|flush|>", "<|end|>")
            if token_to_id.get(t) in eog}
    if "<|end|>" in have and have & {"<|call|>", "<|calls|>"} and have & {"<|return|>", "<|flush|>"}:
        return [i for i in eog if i != token_to_id["<|end|>"]]
    return eog


def _force_control(attrs: list[int], types: list[int], token_to_id: Mapping[str, int],
                   extra_ids: Iterable[int | None]) -> None:
    """Sets the control attribute on end-of-turn-looking tokens and on ``extra_ids`` (eot/eom), in place:
    llama.cpp does, so that they are only parsed with parse_special, even where the file calls them
    user-defined (not where it calls them normal text: see _marker_ids)."""
    texts = set(_EOT_TEXTS) | set(_EOG_TEXTS) | {"<|eom_id|>"}
    for i in _marker_ids(texts, types, token_to_id):
        attrs[i] |= _A_CONTROL
    for i in extra_ids:
        if i is not None:
            attrs[i] |= _A_CONTROL


def _rstrip_ids(meta: Mapping[str, Any], attrs: list[int], token_to_id: Mapping[str, int]) -> set[int]:
    """Special tokens that swallow the spaces after them when matched (llama.cpp sets this for phi-3 only)."""
    name = str(_get(meta, "general.name", "")).lower()
    if "phi-3" not in name and "phi3" not in name:
        return set()
    ids = {i for i, a in enumerate(attrs) if a & (_A_CONTROL | _A_USER_DEFINED | _A_UNKNOWN)}
    for text, on in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
        i = token_to_id.get(text)
        if i is not None:
            (ids.add if on else ids.discard)(i)
    return ids


# ---------------------------------------------------------------------------------------------
# builders
# ---------------------------------------------------------------------------------------------

def _piece_bytes(tokens: list[str], attrs: list[int], normal: Callable[[str], bytes]) -> list[bytes]:
    """The bytes each token stands for; `normal` decodes a normal token's text (SPM or byte-level BPE)."""
    out: list[bytes] = []
    append = out.append
    for text, a in zip(tokens, attrs):
        if a & (_A_CONTROL | _A_UNKNOWN | _A_USER_DEFINED):
            append(text.encode("utf-8"))
        elif a & _A_NORMAL:
            append(normal(text))
        elif a & _A_BYTE:
            append(_byte_token_value(text))
        else:  # unused / undefined: rendered as nothing (llama.cpp)
            append(b"")
    return out


def _spm_normal_bytes(text: str) -> bytes:
    return text.replace(_SPACE_MARK, " ").encode("utf-8")


def _byte_token_value(text: str) -> bytes:
    if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
        try:
            return bytes([int(text[3:5], 16)])
        except ValueError:
            pass
    return text.encode("utf-8")


def _read_merges(token_to_id: Mapping[str, int], merges_raw: Sequence[str], model: str) -> list[tuple[str, str]]:
    """``tokenizer.ggml.merges`` ("left right", in rank order) as pairs; a merge whose parts or result
    are not tokens can never apply, so it is dropped (with a warning)."""
    if merges_raw is None or len(merges_raw) == 0:
        raise ValueError(f"tokenizer.ggml.model is {model!r} but tokenizer.ggml.merges is missing")
    merges: list[tuple[str, str]] = []
    dropped = 0
    for m in merges_raw:
        pos = m.find(" ", 1)
        a, b = (m[:pos], m[pos + 1:]) if pos > 0 else ("", "")
        if a in token_to_id and b in token_to_id and (a + b) in token_to_id:
            merges.append((a, b))
        else:
            dropped += 1
    if dropped:
        logger.warning("ignored %d BPE merges whose parts or result are not in the vocabulary", dropped)
    return merges


def _bpe_recipe(token_to_id: dict[str, int], merges_raw: Sequence[str], pre: str | None) -> Recipe:
    """Byte-level BPE (GPT-2 style) with llama.cpp's pre-tokenizer regexes for ``pre``."""
    merges = _read_merges(token_to_id, merges_raw, "gpt2")
    fam = _PRE_TABLE.get(pre) if pre else None
    if fam is None:
        if pre:
            logger.warning("unknown tokenizer.ggml.pre %r; falling back to the gpt-2 pre-tokenizer "
                           "(tokenization may differ from the model's own)", pre)
            fam = _PRE_TABLE["gpt-2"]
        else:
            logger.warning("tokenizer.ggml.pre is missing; using llama.cpp's 'default' pre-tokenizer")
            fam = _PRE_TABLE["default"]
    family, ignore_merges, _ = fam
    return Recipe("bpe", merges, family=family, ignore_merges=ignore_merges)


# ---------------------------------------------------------------------------------------------
# encoders
# ---------------------------------------------------------------------------------------------

def _added(attrs: list[int], rstrip: set[int]) -> list[tuple[int, bool, bool]]:
    """The tokens matched whole in the raw text: (id, special, rstrip). special: control / unknown, matched only
    with parse_special; else user-defined, always matched; rstrip: it takes the whitespace after it."""
    out = []
    for i, a in enumerate(attrs):
        if a & (_A_CONTROL | _A_UNKNOWN | _A_USER_DEFINED):
            out.append((i, bool(a & (_A_CONTROL | _A_UNKNOWN)), i in rstrip))
    return out


def _native_spm(parts: Mapping[str, Any]) -> Encoder:
    recipe, specials = Recipe(*parts["recipe"]), _Specials(*parts["specials"])
    blob, ends = parts["texts"]
    return _engine.SpmTokenizer(blob, ends, parts["scores"], parts["types"], parts["added"], specials.unk_id,
                                recipe.byte_fallback, recipe.add_space_prefix)


def _hf_encoder(parts: Mapping[str, Any], recipe: Recipe) -> Encoder:
    added = parts["added"]
    return HFEncoder(recipe, PackedTexts(*parts["texts"]).unpack(), [i for i, sp, _ in added if sp],
                     [i for i, sp, _ in added if not sp], {i for i, _, r in added if r})
