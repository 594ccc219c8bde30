"""Tool-call parsers: a model's generated text → content and OpenAI tool calls, whole or streamed.

One module per family (vLLM's ``--tool-call-parser`` names): ``hermes``, ``llama3_json``, ``mistral``,
``pythonic``, ``granite``, ``glm45``, ``qwen3_coder``, ``gemma4``, ``openai`` (gpt-oss's harmony), and ``json_envelope`` (the polyfill's answer). ``detect_tool_parser(template_source)``
picks one from a chat template; ``get_tool_parser(name)`` is the registry. ``base`` has the shared machinery."""

from __future__ import annotations

from .base import ParseResult, StreamDelta, ToolCall, ToolParser, new_call_id
from .detect import detect_tool_parser, renders_tools
from .gemma4 import Gemma4ToolParser
from .glm45 import Glm45ToolParser
from .granite import GraniteToolParser
from .harmony import HarmonyToolParser
from .hermes import HermesToolParser
from .json_envelope import JsonEnvelopeToolParser
from .llama3_json import Llama3JsonToolParser
from .mistral import MistralToolParser, mistral_call_id
from .pythonic import PythonicToolParser
from .qwen3_coder import Qwen3CoderToolParser

__all__ = ["ParseResult", "StreamDelta", "TOOL_PARSERS", "ToolCall", "ToolParser", "detect_tool_parser",
           "get_tool_parser", "mistral_call_id", "new_call_id", "renders_tools"]

TOOL_PARSERS: dict[str, type[ToolParser]] = {cls.name: cls for cls in (
    HermesToolParser, Llama3JsonToolParser, MistralToolParser, PythonicToolParser, GraniteToolParser,
    Glm45ToolParser, Qwen3CoderToolParser, Gemma4ToolParser, HarmonyToolParser, JsonEnvelopeToolParser)}


def get_tool_parser(name: str) -> type[ToolParser]:
    """The parser class registered as ``name`` (``--tool-call-parser NAME``); ValueError naming the choices."""
    try:
        return TOOL_PARSERS[name]
    except KeyError:
        raise ValueError(f"unknown tool call parser {name!r}; choose one of {', '.join(TOOL_PARSERS)}") from None
