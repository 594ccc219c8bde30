"""The fill-in-the-middle prompt: prefix, suffix and extra files laid out in the model's FIM tokens, as
llama.cpp's format_prompt_infill (tools/server/server-common.cpp) lays them out (PSM order):

    [FIM_REP]myproject\\n [FIM_SEP]name0\\n text0 ... [FIM_SEP]filename\\n      (the extra files; without
        FIM_REP / FIM_SEP each file's text follows a "\\n\\n--- snippet ---\\n\\n" line instead)
    [BOS] [FIM_PRE] prefix prompt [FIM_SUF] suffix [FIM_MID]          → the model writes the middle

Trimmed to the context: the prefix keeps its last 3/4 of a batch, the suffix its first 1/4 of it (less the
prompt and 2), the extra files the last of what the context holds past the batch and twice the completion
bound. llama.cpp's batch is its -b (2048); pyserve's is min(2048, context / 2), so a small context keeps room
for the extra files. Texts are tokenized without parsing special tokens (code cannot write a FIM token).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

from ...engine.fim_tokens import FimTokens
from ..base.errors import bad_request
from ..base.served_model import ServedModel

_REPO = "myproject\n"  # llama.cpp's fixed names for the repository and the file being completed
_FILE = "filename\n"
_SNIPPET = "\n\n--- snippet ---\n\n"
_MAX_BATCH = 2048


@dataclass(frozen=True)
class FimParts:
    """What a request fills in: the text before the hole (or its token ids), after it, extra files
    ((filename, text) pairs, put before the prefix) and a prompt (token ids) that continues the prefix."""
    prefix: Union[str, list[int]]
    suffix: str
    extra: Sequence[tuple[str, str]] = ()
    prompt_ids: Sequence[int] = ()


def fim_tokens(model: ServedModel, param: str) -> FimTokens:
    """The model's FIM tokens; a 400 naming `param` where its vocabulary lacks one of the three needed."""
    fim = model.tokenizer.fim_tokens()
    if fim.complete:
        return fim
    missing = ", ".join(f"the {name} token" for name, tid in (("prefix", fim.pre), ("suffix", fim.suf),
                                                              ("middle", fim.mid)) if tid is None)
    raise bad_request(f"fill-in-the-middle is not supported by this model: its vocabulary has no "
                      f"fill-in-the-middle tokens ({missing} missing); '{param}' needs a code model with them "
                      f"(Qwen2.5-Coder, CodeGemma, StarCoder, DeepSeek-Coder, CodeLlama)", param=param,
                      code="unsupported")


def fim_prompt(model: ServedModel, parts: FimParts, max_tokens: Optional[int], param: str) -> list[int]:
    """The prompt's token ids; `max_tokens` is the completion bound asked (None: none), `param` the field a
    missing FIM token is reported under."""
    fim = fim_tokens(model, param)
    tok = model.tokenizer
    prefix = parts.prefix if not isinstance(parts.prefix, str) else _ids(model, parts.prefix)
    suffix, extra = _ids(model, parts.suffix), _extra_ids(model, fim, parts.extra)
    batch = min(_MAX_BATCH, model.max_model_len // 2)
    n_prefix = min(len(prefix), 3 * (batch // 4))
    n_suffix = min(len(suffix), max(0, batch // 4 - (2 + len(parts.prompt_ids))))
    n_extra = min(len(extra), max(0, model.max_model_len - batch - 2 * max(max_tokens or 1, 1)))
    head = [tok.bos_id] if tok.add_bos else []
    return (extra[len(extra) - n_extra:] + head + [fim.pre] + prefix[len(prefix) - n_prefix:]
            + list(parts.prompt_ids) + [fim.suf] + suffix[:n_suffix] + [fim.mid])


def _ids(model: ServedModel, text: str) -> list[int]:
    return model.tokenizer.encode(text, add_special=False, parse_special=False)


def _extra_ids(model: ServedModel, fim: FimTokens, extra: Sequence[tuple[str, str]]) -> list[int]:
    """The extra files as one run of tokens: repository and file separators where the vocabulary has them."""
    out = [fim.rep] + _ids(model, _REPO) if fim.rep is not None else []
    for filename, text in extra:
        out += [fim.sep] + _ids(model, filename + "\n") if fim.sep is not None else _ids(model, _SNIPPET)
        out += _ids(model, text)
    if fim.sep is not None:
        out += [fim.sep] + _ids(model, _FILE)
    return out


def check_sizes(model: ServedModel, fields: dict[str, int]) -> None:
    """Refuses texts (field → bytes) too long to tokenize at all: FIM trims what it takes to the context, so
    a text may be longer than the context, but not without bound (tokenizing megabytes stalls the server)."""
    for name, nbytes in fields.items():
        model.check_text_size(nbytes, name, factor=8)
