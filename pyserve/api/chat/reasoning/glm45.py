"""GLM-4.5 / 4.6 / 4.7: ``<think>…</think>`` after ``<|assistant|>``; GLM-4.7's generation prompt opens the block,
or writes ``</think>`` alone when thinking is off (then everything is content)."""
from __future__ import annotations

from .base import ReasoningParser


class Glm45ReasoningParser(ReasoningParser):
    name = "glm45"
    start, end = "<think>", "</think>"
