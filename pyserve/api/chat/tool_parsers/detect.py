"""Which parser a chat template's tool format needs, as llama.cpp's common/chat.cpp tells the families apart:
by the markers in the template's source, checked in its order. Only for templates that render the tool list: one
that ignores ``tools`` (the built-in Gemma format, DeepSeek R1's, any base model's) gets None, the polyfill."""

from __future__ import annotations

from typing import Optional

from ...template.chat_template import ChatTemplate, ChatTemplateError

__all__ = ["detect_tool_parser", "renders_tools"]

# (parser, markers any of which names the family); the first family that matches wins
_FAMILIES = (
    ("granite", ("<|tool_call|>",)),
    # before hermes: these two wrap their calls in <tool_call> too
    ("glm45", ("<arg_key>",)),
    ("qwen3_coder", ("<parameter=",)),
    ("gemma4", ("<|tool_call>call:",)),
    ("openai", ("<|channel|>commentary",)),  # gpt-oss's harmony
    ("hermes", ("<tool_call>",)),
    ("pythonic", ("[func_name1(",)),  # vLLM's and Llama 4's instruction "[func_name1(params_name1=…), …]"
    ("llama3_json", ("<|start_header_id|>ipython<|end_header_id|>", "<|python_tag|>", '"parameters"')),
    ("mistral", ("[TOOL_CALLS]",)),
)

_PROBE = "pyserve_probe_tool"
_PROBE_TOOLS = [{"type": "function", "function": {
    "name": _PROBE, "description": "A probe.", "parameters": {"type": "object", "properties": {}}}}]


def renders_tools(source: str) -> bool:
    """Whether the template puts the ``tools`` it is given into the prompt (minja's capability probe). It renders
    without resource limits: for the operator's templates, not for one a request brings."""
    try:
        prompt = ChatTemplate(source, bos_token="", eos_token="").render(
            [{"role": "user", "content": "Hi"}], tools=_PROBE_TOOLS)
    except ChatTemplateError:
        return False
    return _PROBE in prompt


def detect_tool_parser(source: Optional[str]) -> Optional[str]:
    """The name of the parser for the template's tool calls, None when the template does not render tools or has
    a format none of the parsers reads (then the polyfill applies)."""
    if not source or not renders_tools(source):
        return None
    for name, markers in _FAMILIES:
        if any(marker in source for marker in markers):
            return name
    return None
