"""gpt-oss's harmony channels: ``<|channel|>analysis<|message|>REASONING<|end|>`` then
``<|start|>assistant<|channel|>final<|message|>CONTENT`` (the markers are special tokens, kept in the text the
parser reads). The final channel's header is dropped."""
from __future__ import annotations

from .base import ReasoningParser


class GptOssReasoningParser(ReasoningParser):
    name = "gpt_oss"
    start, end = "<|channel|>analysis<|message|>", "<|end|>"
    # the final channel's header, with or without the new message's start
    after = ("<|start|>assistant<|channel|>final<|message|>", "<|channel|>final<|message|>")
