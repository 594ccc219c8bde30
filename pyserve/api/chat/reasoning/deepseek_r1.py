"""DeepSeek-R1 (and its distills): ``<think>…</think>``; its template's generation prompt opens the block in the
later releases (``<｜Assistant｜><think>\\n``), which the prompt's end tells."""
from __future__ import annotations

from .base import ReasoningParser


class DeepSeekR1ReasoningParser(ReasoningParser):
    name = "deepseek_r1"
    start, end = "<think>", "</think>"
