"""The `tokenizers` (HuggingFace) pipelines of the GGUF vocabularies that pyserve does not tokenize natively --
byte-level BPE ("gpt2", with llama.cpp's pre-tokenizer regexes) and Gemma 4's SentencePiece-style BPE -- and,
for SentencePiece BPE ("llama"), the reference twin of the native SpmTokenizer (csrc/tokenizer/spm_tokenizer.h): a BPE whose
merges are derived from the scores (~0.5 M for Gemma 3; ~0.6 s to build, which is why serving does not).

What each is built from is tokenizer.py's read_parts: a Recipe, the token texts and attributes.
"""
from __future__ import annotations

import threading
from typing import Iterable, NamedTuple, Sequence

from tokenizers import AddedToken, Regex
from tokenizers import Tokenizer as _HFTokenizer
from tokenizers import models, normalizers, pre_tokenizers

__all__ = ["Recipe", "HFEncoder", "spm_merges"]

_SPACE_MARK = "\u2581"  # ▁
TT_NORMAL = 1  # GGUF token type of normal text

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


class Recipe(NamedTuple):
    """What the `tokenizers` object is built from. kind: "spm" (SentencePiece BPE: merges from the scores, derived
    only for the reference twin; serving uses the native tokenizer), "spm_bpe" (gemma4) or "bpe" (byte-level)."""
    kind: str
    merges: list  # [(left, right)] in rank order (spm: empty; spm_merges derives them)
    byte_fallback: bool = False  # to the <0xNN> tokens
    unk_token: str | None = None
    add_space_prefix: bool = False  # spm: a leading ▁ on each stretch of text
    family: str = ""  # bpe: the pre-tokenizer family (_PRE_REGEXES)
    ignore_merges: bool = False  # bpe: a word that is a token is not merged


def spm_merges(tokens: list[str], types: Sequence[int], scores: Sequence[float]) -> list[tuple[str, str]]:
    """SentencePiece BPE's merges, derived from the scores (scores: [n] or empty for all 0).

    Every split of a normal token into two normal tokens is a merge; merges are ranked by the
    merged token's score (higher first; ties by lower id, then longer left part). This is what
    llama.cpp's SPM tokenizer does: merge the adjacent pair whose concatenation is the
    best-scoring vocabulary token.
    """
    if len(scores) < len(tokens):
        scores = [0.0] * len(tokens)
    normal = {t for t, ty in zip(tokens, types) if ty == TT_NORMAL}
    cand = [i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == TT_NORMAL and len(t) > 1]
    splits = [[k for k in range(len(t) - 1, 0, -1) if t[:k] in normal and t[k:] in normal]
              for t in [tokens[i] for i in cand]]
    neg_scores = [-float(scores[i]) for i in cand]
    order = sorted(range(len(cand)), key=neg_scores.__getitem__)  # stable: ties keep id order
    return [(t[:k], t[k:]) for j in order if splits[j] for t in (tokens[cand[j]],) for k in splits[j]]


class HFEncoder:
    """Text -> ids through a `tokenizers` object: specials parsed or not per call (its encode_special_tokens
    switch is shared state, hence the lock)."""

    def __init__(self, recipe: Recipe, tokens: list[str], special: Iterable[int], user: Iterable[int],
                 rstrip_ids: set[int]) -> None:
        self._hf = hf_from_recipe(recipe, {t: i for i, t in enumerate(tokens)})
        add_special_tokens(self._hf, tokens, special, user, rstrip_ids)
        self._lock = threading.Lock()
        self._hf.encode_special_tokens = self._unparsed = True  # True: special tokens NOT parsed

    def encode(self, text: str, parse_special: bool = False) -> list[int]:
        with self._lock:
            if self._unparsed == parse_special:
                self._hf.encode_special_tokens = self._unparsed = not parse_special
            return self._hf.encode(text, add_special_tokens=False).ids

    def token_to_id(self, text: str) -> int | None:
        return self._hf.token_to_id(text)


def hf_from_recipe(r: Recipe, token_to_id: dict[str, int]) -> _HFTokenizer:
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


def add_special_tokens(hf: _HFTokenizer, tokens: list[str], special: Iterable[int], user: Iterable[int],
                       rstrip_ids: set[int]) -> None:
    """Control / unknown tokens (`special`) as special tokens (``encode_special_tokens`` leaves those unparsed),
    user-defined ones (`user`) as plain added tokens (always parsed); both matched on the raw text."""
    special_added = [AddedToken(tokens[i], single_word=False, lstrip=False, rstrip=i in rstrip_ids,
                                normalized=False, special=True) for i in special]
    user_added = [AddedToken(tokens[i], single_word=False, lstrip=False, rstrip=i in rstrip_ids,
                             normalized=False, special=False) for i in user]
    if special_added:
        hf.add_special_tokens(special_added)
    if user_added:
        hf.add_tokens(user_added)
