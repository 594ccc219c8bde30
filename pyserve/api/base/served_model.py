"""ServedModel: what the serving layer knows of the model it serves, read once from the open engine."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Optional

from ..template.chat_template import builtin_gemma_template
from .errors import bad_request, model_not_found

_NO_TEMPLATE = ("this model has no chat template in its GGUF; start the server with --chat-template FILE")


@dataclass
class ServedModel:
    name: str  # what clients send as `model`
    engine: object  # the open AsyncLLM
    tokenizer: object
    max_model_len: int  # tokens a sequence may hold: min(context, KV cache)
    max_num_seqs: int
    max_token_bytes: int  # the longest token in bytes (0: unknown)
    chat_template: Optional[str]  # the template source, or None (then `no_template_reason`)
    no_template_reason: str
    trust_request_chat_template: bool  # a request may bring its own template (rendered with limits)
    created: int
    n_embd: int = 0  # an embedding's length
    pooling: str = "last"  # embeddings: the last token's hidden state, or the mean over the prompt
    normalize_embeddings: bool = True  # L2-normalised
    tool_call_parser: Optional[str] = None  # --tool-call-parser: the family of tool calls (None: from the template)
    aliases: tuple[str, ...] = ()  # other names clients may send as `model` for it
    reasoning_parser: str = "auto"  # --reasoning-parser: a format, auto (from the template) or none
    reasoning_budget: int = -1  # --reasoning-budget: tokens a reasoning may take by default (-1: no bound)

    @classmethod
    def from_engine(cls, engine, name: Optional[str] = None, chat_template: Optional[str] = None,
                    trust_request_chat_template: bool = False, pooling: str = "last",
                    normalize_embeddings: bool = True, tool_call_parser: Optional[str] = None,
                    aliases: tuple[str, ...] = (), reasoning_parser: str = "auto",
                    reasoning_budget: int = -1) -> "ServedModel":
        cfg, hp = engine.config, engine.hparams
        template = chat_template if chat_template is not None else _model_template(engine.metadata)
        return cls(name or _file_stem(engine.model_path), engine, engine.tokenizer,
                   engine.max_model_len, cfg["max_num_seqs"],
                   _longest_token(engine.tokenizer, hp["n_vocab"]), template,
                   "" if template is not None else _NO_TEMPLATE, trust_request_chat_template, int(time.time()),
                   hp["n_embd"], pooling, normalize_embeddings, tool_call_parser,
                   tuple(aliases), reasoning_parser, reasoning_budget)

    def check_name(self, name: Optional[str]) -> None:
        if name is not None and name != self.name and name not in self.aliases:
            raise model_not_found(name)

    def check_text_size(self, nbytes: int, param: str, factor: int = 1) -> None:
        """Refuses, without tokenizing it, text that cannot fit the context: tokenizing megabytes blocks the
        event loop for seconds. Each token covers at most `max_token_bytes` bytes, so the text holds at least
        nbytes / max_token_bytes tokens."""
        if not self.max_token_bytes:
            return
        at_least = -(-nbytes // self.max_token_bytes)
        if at_least > self.max_model_len * factor:
            raise bad_request(f"This model's maximum context length is {self.max_model_len} tokens. However, your "
                              f"prompt is at least {at_least} tokens ({nbytes} bytes; no token is longer than "
                              f"{self.max_token_bytes} bytes). Please reduce the length of the prompt.",
                              param=param, code="context_length_exceeded")

    def token_text(self, tid: int) -> tuple[str, bytes]:
        b = self.tokenizer.token_bytes(tid)
        return b.decode("utf-8", errors="replace"), b


def _file_stem(path: str) -> str:
    base = os.path.basename(path)
    return base[:-5] if base.endswith(".gguf") else base


def _model_template(meta: dict) -> Optional[str]:
    """The GGUF's own template, else the built-in Gemma format for gemma models (Gemma 3 270M ships none)."""
    if isinstance(meta.get("tokenizer.chat_template"), str):
        return meta["tokenizer.chat_template"]
    if str(meta.get("general.architecture", "")).startswith("gemma"):
        return builtin_gemma_template()
    return None


def _longest_token(tokenizer, n_vocab: int) -> int:
    try:  # a prompt longer than this x the context cannot fit
        return max(1, tokenizer.longest_token_bytes(n_vocab))
    except Exception:  # noqa: BLE001 - no bound then
        return 0
