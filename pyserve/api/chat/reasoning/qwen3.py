"""Qwen3's and Qwen3.5's thinking: ``<think>…</think>`` before the answer (Qwen3.5's generation prompt opens
the block itself; ``enable_thinking: false`` renders an empty one)."""
from __future__ import annotations

from .base import ReasoningParser


class Qwen3ReasoningParser(ReasoningParser):
    name = "qwen3"
    start, end = "<think>", "</think>"
