"""Tool calling: what a chat request's `tools` and `tool_choice` make of its prompt, its grammar and the
parser of its output.

Two ways, chosen by the chat template:
- **native**: the template reads `tools` (Qwen's `<tool_call>`, Llama 3.1's JSON, Mistral's `[TOOL_CALLS]`, …):
  the tools go into the template, and the family's parser (tool_parsers.detect, or --tool-call-parser) reads
  the output;
- **polyfill** (the built-in Gemma format, base models, any template that knows no tools; llama.cpp's
  "generic" format): the tool definitions go into the system turn with a short instruction, assistant calls in
  the history are written as the JSON the model answers in, tool results become a user turn, and the model
  answers `{"tool_calls": [{"name", "arguments"}, …]}` or `{"response": "…"}` under a grammar.

`required` and a named tool are a grammar in both ways (vLLM's way): a JSON envelope over exactly the allowed
tools, each call's `arguments` under the tool's `parameters` schema, one call unless parallel_tool_calls.
`auto` is that grammar or a free answer (polyfill), or free text read by the family's parser (native);
`none` leaves the tools out of the prompt.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Optional

from ...engine.structured import StructuredOutputsParams, map_schemas
from .protocol import ChatPrompt
from .tool_parsers import ToolParser, get_tool_parser

ENVELOPE_PARSER = "json_envelope"
# Calls in one answer when parallel calls are allowed: one per tool plus one (the weather in two cities),
# at most 8. A bound, so that a small model cannot repeat calls until max_tokens; OpenAI states none.
MAX_PARALLEL_CALLS = 8


@dataclass
class ToolPlan:
    mode: str                      # "none", "auto", "required" or "named"
    native: bool                   # the template renders the tools itself
    tools: list[dict]              # the allowed tools' function definitions (named: that one)
    parallel: bool
    parser_name: Optional[str]     # native auto: the family's parser

    @classmethod
    def of(cls, req: ChatPrompt, template_parser: Optional[str]) -> "ToolPlan":
        """template_parser: the parser of the template's tool-call family (None: it knows no tools)."""
        mode = req.tool_mode()
        tools = [t.function.model_dump(exclude_none=True) for t in req.tools or ()]
        if mode == "named":
            tools = [t for t in tools if t["name"] == req.tool_choice.function.name]
        return cls(mode, template_parser is not None, tools, req.parallel_tool_calls is not False, template_parser)

    @property
    def active(self) -> bool:
        return self.mode != "none"

    @property
    def reads_markers(self) -> bool:
        """The output is free text read by the family's parser (its markers may be special tokens)."""
        return self.native and self.mode == "auto"

    def template_tools(self) -> Optional[list[dict]]:
        """`tools` for a native template (OpenAI's shape, as transformers passes them)."""
        if not (self.native and self.active):
            return None
        return [{"type": "function", "function": t} for t in self.tools]

    def messages(self, dicts: list[dict]) -> list[dict]:
        """The messages as the template gets them (polyfill: tools in the system turn, calls and results
        written as the envelope's JSON and user turns)."""
        if self.native:
            return dicts
        out = _polyfill_history(dicts)
        if self.active:
            out = _with_system(out, _instruction(self.tools, self.mode))
        return out

    def constraint(self) -> Optional[StructuredOutputsParams]:
        """The grammar the answer is drawn under (None: free text)."""
        if not self.active or self.reads_markers:
            return None
        calls = self._calls()
        if self.mode == "auto":
            return StructuredOutputsParams(json={"anyOf": [calls, _RESPONSE]})
        return StructuredOutputsParams(json=calls)

    def check(self) -> Optional[StructuredOutputsParams]:
        """What must compile besides the grammar, so that a `parameters` schema that does not compile is a 400
        whatever the mode: the calls' schema when the answer is free text (a grammar is compiled, and so
        checked, with the request's engine requests)."""
        return StructuredOutputsParams(json=self._calls()) if self.reads_markers else None

    def _calls(self) -> dict:
        parallel = min(MAX_PARALLEL_CALLS, len(self.tools) + 1)
        return _calls_schema(self.tools, 1 if self.mode == "named" or not self.parallel else parallel)

    def parser(self, new_id: Optional[Callable[[], str]] = None) -> Optional[ToolParser]:
        """A fresh parser for one choice's output (None: the output is plain content)."""
        if not self.active:
            return None
        name = self.parser_name if self.reads_markers else ENVELOPE_PARSER
        return get_tool_parser(name)(new_id=new_id, tools=self.tools)  # tag formats type arguments by schema


_RESPONSE = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"],
             "additionalProperties": False}


def _calls_schema(tools: list[dict], max_calls: int) -> dict:
    calls = [{"type": "object", "additionalProperties": False, "required": ["name", "arguments"],
              "properties": {"name": {"const": t["name"]},
                             "arguments": _closed(t.get("parameters") or {"type": "object"})}} for t in tools]
    array = {"type": "array", "minItems": 1, "maxItems": max_calls,
             "items": calls[0] if len(calls) == 1 else {"anyOf": calls}}
    return {"type": "object", "properties": {"tool_calls": array}, "required": ["tool_calls"],
            "additionalProperties": False}


def _closed(schema: dict) -> dict:
    """The schema with `additionalProperties: false` on every object that lists its properties and says
    nothing of others (what OpenAI's strict mode asks of a schema): still valid against the tool's schema,
    and a small model cannot invent arguments until max_tokens."""
    def close(s: dict) -> dict:
        if isinstance(s.get("properties"), dict) and "additionalProperties" not in s:
            s["additionalProperties"] = False
        return s
    return map_schemas(schema, close)


def _instruction(tools: list[dict], mode: str) -> str:
    listing = json.dumps(tools, ensure_ascii=False, indent=2)
    calls = '{"tool_calls": [{"name": "<tool name>", "arguments": {<its arguments>}}]}'
    if mode == "auto":
        how = f'To call tools, answer with {calls}; to answer directly, answer with {{"response": "<your answer>"}}.'
    elif mode == "named":
        how = f'Call the tool {tools[0]["name"]!r}: answer with {calls}.'
    else:
        how = f"Call one or more tools: answer with {calls}."
    return f"You can use these tools:\n{listing}\n{how} Answer with that JSON object only."


def _with_system(messages: list[dict], text: str) -> list[dict]:
    if messages and messages[0]["role"] == "system":
        first = dict(messages[0], content=f"{messages[0].get('content') or ''}\n\n{text}".lstrip())
        return [first, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def _polyfill_history(messages: list[dict]) -> list[dict]:
    """Assistant tool calls as the envelope's JSON; tool results as user turns (merged with a neighbouring
    user turn: templates that alternate roles see one)."""
    names: dict[str, str] = {}
    out: list[dict] = []
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in m["tool_calls"]]
            names.update((c["id"], c["function"]["name"]) for c in m["tool_calls"])
            m = {"role": "assistant", "content": json.dumps({"tool_calls": calls}, ensure_ascii=False)}
        elif m["role"] == "tool":
            result = {"tool_call_id": m.get("tool_call_id"), "name": names.get(m.get("tool_call_id"), m.get("name")),
                      "content": m.get("content", "")}
            m = {"role": "user", "content": json.dumps({"tool_response": result}, ensure_ascii=False)}
        if out and out[-1]["role"] == m["role"] == "user":
            out[-1] = {"role": "user", "content": f"{out[-1]['content']}\n\n{m['content']}"}
        else:
            out.append(m)
    return out
