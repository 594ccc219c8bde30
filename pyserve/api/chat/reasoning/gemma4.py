"""Gemma 4's thinking channel: ``<|channel>thought\\n…<channel|>`` (control tokens); the template writes an empty
channel into the generation prompt when thinking is off."""
from __future__ import annotations

from .base import ReasoningParser


class Gemma4ReasoningParser(ReasoningParser):
    name = "gemma4"
    start, end = "<|channel>thought", "<channel|>"
