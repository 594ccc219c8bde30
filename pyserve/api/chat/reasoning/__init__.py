"""Reasoning parsers: a model's generated text → its reasoning (``reasoning_content``) and its content, whole or
streamed, and what a chat request's reasoning options make of its prompt and its answer (``plan``).

One module per format (vLLM's ``--reasoning-parser`` names): ``qwen3``, ``deepseek_r1``, ``glm45``, ``gemma4``,
``gpt_oss``. ``detect_reasoning_parser(template_source)`` picks one from a chat template;
``get_reasoning_parser(name)`` is the registry; ``base`` has the shared machine."""
from __future__ import annotations

from .base import ReasoningDelta, ReasoningParser
from .deepseek_r1 import DeepSeekR1ReasoningParser
from .detect import detect_reasoning_parser
from .gemma4 import Gemma4ReasoningParser
from .glm45 import Glm45ReasoningParser
from .gpt_oss import GptOssReasoningParser
from .qwen3 import Qwen3ReasoningParser

__all__ = ["REASONING_PARSERS", "ReasoningDelta", "ReasoningParser", "detect_reasoning_parser",
           "get_reasoning_parser"]

REASONING_PARSERS: dict[str, type[ReasoningParser]] = {cls.name: cls for cls in (
    Qwen3ReasoningParser, DeepSeekR1ReasoningParser, Glm45ReasoningParser, Gemma4ReasoningParser,
    GptOssReasoningParser)}


def get_reasoning_parser(name: str) -> type[ReasoningParser]:
    """The parser class registered as ``name`` (``--reasoning-parser NAME``); ValueError naming the choices."""
    try:
        return REASONING_PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown reasoning parser {name!r}; choose one of {', '.join(REASONING_PARSERS)}") from None
