"""A vocabulary's fill-in-the-middle tokens, found as llama.cpp's vocab loader finds them: the GGUF keys
``tokenizer.ggml.fim_{pre,suf,mid,pad,rep,sep}_token_id`` (and the older ``prefix/suffix/middle_token_id``),
else the token texts each family uses (Qwen2.5-Coder and CodeGemma ``<|fim_prefix|>``, StarCoder and Granite
``<fim_prefix>``, DeepSeek-Coder ``<｜fim▁begin｜>``, CodeLlama ``<PRE>`` / ``▁<PRE>``, ...)."""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Mapping, Optional

_PREFIX = "tokenizer.ggml."
# role -> (its key, the deprecated key llama.cpp reads after it, the texts it looks for when neither is set)
_ROLES: dict[str, tuple[str, Optional[str], tuple[str, ...]]] = {
    "pre": ("fim_pre_token_id", "prefix_token_id",
            ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
             "<|code_prefix|>", "<|prefix|>")),
    "suf": ("fim_suf_token_id", "suffix_token_id",
            ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
             "<|code_suffix|>", "<|suffix|>")),
    "mid": ("fim_mid_token_id", "middle_token_id",
            ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
             "<|code_middle|>", "<|middle|>")),
    "pad": ("fim_pad_token_id", None, ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")),
    "rep": ("fim_rep_token_id", None, ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")),
    "sep": ("fim_sep_token_id", None, ("<|file_sep|>",)),
}


@dataclass(frozen=True)
class FimTokens:
    """Token ids (None: the vocabulary has none): prefix, suffix, middle, pad, repository name, file separator."""
    pre: Optional[int] = None
    suf: Optional[int] = None
    mid: Optional[int] = None
    pad: Optional[int] = None
    rep: Optional[int] = None
    sep: Optional[int] = None

    @property
    def complete(self) -> bool:
        """The three a fill-in-the-middle prompt needs are there."""
        return None not in (self.pre, self.suf, self.mid)

    def ids(self) -> list[int]:
        return [i for i in (getattr(self, f.name) for f in fields(self)) if i is not None]

    def end_ids(self) -> list[int]:
        """The ones llama.cpp also ends generation on (a model writing one has finished the middle)."""
        return [i for i in (self.pad, self.rep, self.sep) if i is not None]


def _key_id(meta: Mapping[str, Any], key: Optional[str], n: int) -> Optional[int]:
    v = meta.get(_PREFIX + key) if key else None
    return int(v) if v is not None and 0 <= int(v) < n else None


def read_fim_tokens(meta: Mapping[str, Any], token_to_id: Mapping[str, int]) -> FimTokens:
    """The vocabulary's FIM tokens: the keys (the deprecated one wins where both are set, as llama.cpp reads
    it later), else the first of the role's texts the vocabulary holds."""
    n, found = len(token_to_id), {}
    for role, (key, old, texts) in _ROLES.items():
        tid = _key_id(meta, old, n)
        tid = _key_id(meta, key, n) if tid is None else tid
        if tid is None:
            tid = next((token_to_id[t] for t in texts if t in token_to_id), None)
        found[role] = tid
    return FimTokens(**found)
