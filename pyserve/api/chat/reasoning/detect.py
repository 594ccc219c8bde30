"""Which reasoning parser a chat template needs, by the markers in its source (checked in this order): harmony's
analysis channel, Gemma 4's thought channel, then ``<think>`` by the family's turn markers. None: the template
knows no reasoning (the default Gemma 3 model, any base model)."""
from __future__ import annotations

from typing import Optional

__all__ = ["detect_reasoning_parser"]

_FAMILIES = (
    ("gpt_oss", ("<|channel|>analysis", "<|channel|>")),
    ("gemma4", ("<|channel>thought", "<|channel>")),
    ("glm45", ("<think>", "<|assistant|>")),
    ("deepseek_r1", ("<think>", "Assistant｜>")),
    ("qwen3", ("<think>",)),
)


def detect_reasoning_parser(source: Optional[str]) -> Optional[str]:
    """The parser for the template's reasoning: the first family all of whose markers are in the source."""
    if not source:
        return None
    for name, markers in _FAMILIES:
        if all(m in source for m in markers):
            return name
    return None
