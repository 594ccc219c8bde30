"""Tokenizer for GGUF models, built on the HuggingFace ``tokenizers`` package.

The behaviour follows llama.cpp's ``llama-vocab.cpp`` (the reference the engine is checked
against), reproduced with ``tokenizers`` building blocks:

* ``tokenizer.ggml.model == "llama"`` (SentencePiece BPE: gemma 1-3, llama 2, mistral, phi-3):
  a BPE model whose merges are derived from the token scores (every split of a normal token
  into two normal tokens, ranked by the merged token's score), with byte fallback to the
  ``<0xNN>`` tokens. Spaces become ``▁``; when ``add_space_prefix`` is on (llama.cpp's default
  for this model type) each stretch of text gets a leading ``▁``, as llama.cpp does.
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

import logging
import threading
from dataclasses import astuple, dataclass
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence

from tokenizers import AddedToken, Regex
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import models, normalizers, pre_tokenizers

from .fim_tokens import FimTokens, read_fim_tokens

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

# ---------------------------------------------------------------------------------------------
# pre-tokenizer regexes for byte-level BPE (from llama.cpp's llm_tokenizer_bpe)
# ---------------------------------------------------------------------------------------------

_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
_RE_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_RE_LLAMA3 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_RE_QWEN2 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_RE_QWEN35 = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_RE_SEED_CODER = (_CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
_RE_BAILING = (r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
               r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+")
_RE_TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
              r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
              r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_RE_GPT4O = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
             r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
             r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def _char_class(ranges: Iterable[tuple[int, int]]) -> str:
    parts = []
    for lo, hi in ranges:
        parts.append(chr(lo) if lo == hi else f"{chr(lo)}-{chr(hi)}")
    return "[" + "".join(parts) + "]"


# deepseek-llm's letter class, written by code point: the source text holds characters that
# Unicode normalisation would fold (U+1FBE, U+2126, U+212A, ...), so it is not copied as text.
_DEEPSEEK_LETTERS = _char_class([
    (0x41, 0x5A), (0x61, 0x7A), (0xB5, 0xB5), (0xC0, 0xD6), (0xD8, 0xF6), (0xF8, 0x1BA),
    (0x1BC, 0x1BF), (0x1C4, 0x293), (0x295, 0x2AF), (0x370, 0x373), (0x376, 0x377),
    (0x37B, 0x37D), (0x37F, 0x37F), (0x386, 0x386), (0x388, 0x38A), (0x38C, 0x38C),
    (0x38E, 0x3A1), (0x3A3, 0x3F5), (0x3F7, 0x481), (0x48A, 0x52F), (0x531, 0x556),
    (0x10A0, 0x10C5), (0x13A0, 0x13F5), (0x13F8, 0x13FD), (0x1C90, 0x1CBA), (0x1CBD, 0x1CBF),
    (0x1D00, 0x1D2B), (0x1D6B, 0x1D77), (0x1D79, 0x1D9A), (0x1E00, 0x1F15), (0x1F18, 0x1F1D),
    (0x1F20, 0x1F45), (0x1F48, 0x1F4D), (0x1F50, 0x1F57), (0x1F59, 0x1F59), (0x1F5B, 0x1F5B),
    (0x1F5D, 0x1F5D), (0x1F5F, 0x1F7D), (0x1F80, 0x1FB4), (0x1FB6, 0x1FBC), (0x1FBE, 0x1FBE),
    (0x1FC2, 0x1FC4), (0x1FC6, 0x1FCC), (0x1FD0, 0x1FD3), (0x1FD6, 0x1FDB), (0x1FE0, 0x1FEC),
    (0x1FF2, 0x1FF4), (0x1FF6, 0x1FFC), (0x2102, 0x2102), (0x2107, 0x2107), (0x210A, 0x2113),
    (0x2115, 0x2115), (0x2119, 0x211D), (0x2124, 0x2124), (0x2126, 0x2126), (0x2128, 0x2128),
    (0x212A, 0x212D), (0x212F, 0x2134), (0x2139, 0x2139), (0x213C, 0x213F), (0x2145, 0x2149),
    (0x214E, 0x214E), (0x2183, 0x2184), (0x2C00, 0x2C7B), (0x2C7E, 0x2CE4), (0x2CEB, 0x2CEE),
    (0x2CF2, 0x2CF3), (0xA640, 0xA66D), (0xA680, 0xA69B), (0xA722, 0xA76F), (0xA771, 0xA787),
    (0xA78B, 0xA78E), (0xAB70, 0xABBF), (0xFB00, 0xFB06), (0xFB13, 0xFB17), (0xFF21, 0xFF3A),
    (0xFF41, 0xFF5A), (0x10400, 0x1044F), (0x104B0, 0x104D3), (0x104D8, 0x104FB),
    (0x10C80, 0x10CB2), (0x10CC0, 0x10CF2), (0x118A0, 0x118DF), (0x1E900, 0x1E943),
])
_DEEPSEEK_PUNCT = _char_class([(0x21, 0x2F), (0x3A, 0x7E), (0xFF01, 0xFF0F), (0xFF1A, 0xFF5E),
                               (0x2018, 0x201F), (0x3000, 0x3002)])
_CJK_HANGUL = _char_class([(0x4E00, 0x9FA5), (0x0800, 0x4E00), (0xAC00, 0xD7FF)])

# pre-tokenizer family -> list of regexes applied in sequence
_PRE_REGEXES: dict[str, list[str]] = {
    "default": [r"[\p{P}\$\+<=>\^~\|]+", _RE_GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"],
    "llama3": [_RE_LLAMA3],
    "gpt2": [_RE_GPT2],
    "starcoder": [r"\p{N}", _RE_GPT2],
    "falcon": [r"[\p{P}\$\+<=>\^~\|`]+", _RE_GPT2, r"[0-9][0-9][0-9]"],
    "deepseek-llm": [r"[\r\n]", r"\s?" + _DEEPSEEK_LETTERS + "+", r"\s?" + _DEEPSEEK_PUNCT + "+",
                     r"\s+$", _CJK_HANGUL + "+", r"\p{N}+"],
    "deepseek-coder": [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK_HANGUL + "+", r"\p{N}"],
    "deepseek-v3": [r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+",
                    r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
                    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"],
    "qwen2": [_RE_QWEN2],
    "qwen35": [_RE_QWEN35],
    "poro": [r" ?[^(\s|.,!?…。，、।۔،)]+"],
    "viking": [r" ?[^(\s|.,!?…。，、।۔،)]+", r"\p{N}"],
    "tekken": [_RE_TEKKEN],
    "gpt4o": [_RE_GPT4O],
    "seed-coder": [_RE_SEED_CODER],
    "bailingmoe": [_RE_BAILING],
}

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


class Tokenizer:
    """Text <-> token ids for one GGUF vocabulary. Build with :meth:`from_gguf_metadata`."""

    def __init__(self, *, hf: _HFTokenizer, model: str, pre: str | None, tokens: list[str], attrs: list[int],
                 piece_bytes: list[bytes], specials: _Specials, eos_ids: tuple[int, ...],
                 fim: FimTokens = FimTokens()) -> None:
        self._hf = hf
        self.model = model
        self.pre = pre
        self._tokens = tokens
        self._attrs = attrs
        self._piece_bytes = piece_bytes
        self.bos_id = specials.bos_id
        self.eos_id = specials.eos_id
        self.eos_ids = eos_ids
        self.add_bos = specials.add_bos
        self.add_eos = specials.add_eos
        self.add_space_prefix = specials.add_space_prefix
        self.vocab_size = len(tokens)
        self._fim = fim
        self._lock = threading.Lock()
        self._encode_special = True  # state of hf.encode_special_tokens (True = specials NOT parsed)
        hf.encode_special_tokens = True

    # ------------------------------------------------------------------------------ building

    @classmethod
    def from_gguf_metadata(cls, meta: Mapping[str, Any]) -> "Tokenizer":
        """The tokenizer of a GGUF's ``tokenizer.ggml.*`` metadata, read as llama.cpp's vocab loader does."""
        return cls.from_parts(read_parts(meta))

    @classmethod
    def from_parts(cls, parts: Mapping[str, Any]) -> "Tokenizer":
        """The tokenizer of ``read_parts``'s plain values (what tokenizer_cache.py stores)."""
        tokens, attrs = parts["tokens"], parts["attrs"]
        hf = _hf_from_recipe(_Recipe(*parts["recipe"]), {t: i for i, t in enumerate(tokens)})
        _add_special_tokens(hf, tokens, attrs, set(parts["rstrip_ids"]))
        return cls(hf=hf, model=parts["model"], pre=parts["pre"], tokens=tokens, attrs=attrs,
                   piece_bytes=parts["piece_bytes"], specials=_Specials(*parts["specials"]),
                   eos_ids=tuple(parts["eos_ids"]), fim=FimTokens(*parts["fim"]))

    # ------------------------------------------------------------------------------ encode

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of ``text``.

        add_special: add BOS / EOS as the vocabulary asks (tokenizer.ggml.add_bos_token /
        add_eos_token); a BOS is not added when the text already starts with the BOS token
        (parsed from its text with ``parse_special``), likewise for a trailing EOS.
        parse_special: recognise control tokens (e.g. ``<start_of_turn>``) written in the text.
        User-defined tokens are always recognised.
        """
        if text:
            want = not parse_special
            with self._lock:
                if self._encode_special != want:
                    self._hf.encode_special_tokens = want
                    self._encode_special = want
                ids = self._hf.encode(text, add_special_tokens=False).ids
        else:
            ids = []
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

    def grammar_bytes(self, n_vocab: int) -> list[bytes]:
        """What each of the model's n_vocab ids writes, as a grammar engine sees it: a control or unknown
        token's bytes are 0xFF + its name (no text can spell it: 0xFF never occurs in UTF-8), ids past the
        vocabulary (a padded output layer) write nothing."""
        out = [b"\xff" + p if a & _A_SKIPPED else p
               for p, a in zip(self._piece_bytes[:n_vocab], self._attrs)]
        return out + [b""] * (n_vocab - len(out))

    def token_to_id(self, text: str) -> int | None:
        return self._hf.token_to_id(text)

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
            "bos_token": self._tokens[self.bos_id] if self.bos_id is not None else "",
            "eos_token": self._tokens[self.eos_id] if self.eos_id is not None else "",
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
        recipe = _spm_recipe(tokens, types, _get(meta, "tokenizer.ggml.scores"), token_to_id, specials.unk_id,
                             specials.add_space_prefix)
    elif model == "gemma4":
        recipe = _Recipe("spm_bpe", _read_merges(token_to_id, merges, model), True)
    else:
        recipe = _bpe_recipe(token_to_id, merges, pre)
    piece_bytes = _piece_bytes(tokens, attrs, _bytelevel_to_bytes if model == "gpt2" else _spm_normal_bytes)
    return {"model": model, "pre": pre, "tokens": tokens, "attrs": attrs, "piece_bytes": piece_bytes,
            "specials": astuple(specials), "eos_ids": eos_ids, "fim": astuple(fim), "recipe": tuple(recipe),
            "rstrip_ids": sorted(_rstrip_ids(meta, attrs, token_to_id))}


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


class _Recipe(NamedTuple):
    """What the `tokenizers` object is built from; the merges are the costly part to derive (SPM: ~0.5 M for
    Gemma 3's 262k tokens). kind: "spm" (merges from the scores), "spm_bpe" (gemma4) or "bpe" (byte-level)."""
    kind: str
    merges: list  # [(left, right)] in rank order
    byte_fallback: bool = False  # to the <0xNN> tokens
    unk_token: str | None = None
    add_space_prefix: bool = False  # spm: a leading ▁ on each stretch of text
    family: str = ""  # bpe: the pre-tokenizer family (_PRE_REGEXES)
    ignore_merges: bool = False  # bpe: a word that is a token is not merged


def _spm_recipe(tokens: list[str], types: list[int], scores: Sequence[float] | None, token_to_id: dict[str, int],
                unk_id: int | None, add_space_prefix: bool) -> _Recipe:
    """SentencePiece BPE as a `tokenizers` BPE: merges derived from the scores.

    Every split of a normal token into two normal tokens is a merge; merges are ranked by the
    merged token's score (higher first; ties by lower id, then longer left part). This is what
    llama.cpp's SPM tokenizer does: merge the adjacent pair whose concatenation is the
    best-scoring vocabulary token.
    """
    n = len(tokens)
    if scores is None or len(scores) < n:
        scores = [0.0] * n
    normal = {t for t, ty in zip(tokens, types) if ty == TT_NORMAL}
    cand = [i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == TT_NORMAL and len(t) > 1]
    splits = [[k for k in range(len(t) - 1, 0, -1) if t[:k] in normal and t[k:] in normal]
              for t in [tokens[i] for i in cand]]
    neg_scores = [-float(scores[i]) for i in cand]
    order = sorted(range(len(cand)), key=neg_scores.__getitem__)  # stable: ties keep id order
    merges = [(t[:k], t[k:]) for j in order if splits[j] for t in (tokens[cand[j]],) for k in splits[j]]
    has_bytes = all(f"<0x{b:02X}>" in token_to_id for b in range(256))
    return _Recipe("spm", merges, has_bytes, tokens[unk_id] if unk_id is not None else None, add_space_prefix)


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


def _bpe_recipe(token_to_id: dict[str, int], merges_raw: Sequence[str], pre: str | None) -> _Recipe:
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
    return _Recipe("bpe", merges, family=family, ignore_merges=ignore_merges)


def _hf_from_recipe(r: _Recipe, token_to_id: dict[str, int]) -> _HFTokenizer:
    """The `tokenizers` object of a recipe: spm (``▁`` for spaces, optional space prefix, byte fallback),
    spm_bpe (gemma4: ``▁`` for spaces, split only at newline runs, byte fallback) or byte-level bpe."""
    if r.kind == "bpe":
        hf = _HFTokenizer(models.BPE(vocab=token_to_id, merges=r.merges, ignore_merges=r.ignore_merges))
        steps = [pre_tokenizers.Split(Regex(x), behavior="isolated", invert=False) for x in _PRE_REGEXES[r.family]]
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
        hf.pre_tokenizer = pre_tokenizers.Sequence(steps)
        return hf
    hf = _HFTokenizer(models.BPE(vocab=token_to_id, merges=r.merges, byte_fallback=r.byte_fallback,
                                 unk_token=r.unk_token))
    if r.kind == "spm_bpe":
        hf.normalizer = normalizers.Replace(" ", _SPACE_MARK)
        hf.pre_tokenizer = pre_tokenizers.Split(Regex(r"[^\n]+|\n+"), behavior="isolated")
        return hf
    steps = [normalizers.Prepend(_SPACE_MARK)] if r.add_space_prefix else []
    steps.append(normalizers.Replace(" ", _SPACE_MARK))
    hf.normalizer = normalizers.Sequence(steps)
    return hf


def _add_special_tokens(hf: _HFTokenizer, tokens: list[str], attrs: list[int], rstrip_ids: set[int]) -> None:
    """Control / unknown tokens as special tokens (``encode_special_tokens`` leaves those unparsed),
    user-defined ones as plain added tokens (always parsed); both matched on the raw text."""
    special_added, user_added = [], []
    for i, a in enumerate(attrs):
        if a & (_A_CONTROL | _A_UNKNOWN):
            special_added.append(AddedToken(tokens[i], single_word=False, lstrip=False, rstrip=i in rstrip_ids,
                                            normalized=False, special=True))
        elif a & _A_USER_DEFINED:
            user_added.append(AddedToken(tokens[i], single_word=False, lstrip=False, rstrip=i in rstrip_ids,
                                         normalized=False, special=False))
    if special_added:
        hf.add_special_tokens(special_added)
    if user_added:
        hf.add_tokens(user_added)
