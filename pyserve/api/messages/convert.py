"""An Anthropic request as the chat completion request the chat layer serves (one rendering, one set of rules).

Shapes: `system` → a system message; a user turn's `tool_result` blocks → `tool` messages (in block order, text
between them a user message); an assistant turn's `tool_use` blocks → its `tool_calls` (input as JSON text),
its `thinking` → `reasoning_content` (what reasoning templates read); `redacted_thinking` is dropped (pyserve
made none). tool_choice any → required, tool → named, disable_parallel_tool_use → parallel_tool_calls false;
thinking enabled → thinking_token_budget, disabled → reasoning_effort "none".
"""
from __future__ import annotations

import json
from typing import Union

from ..base.errors import bad_request
from ..chat.protocol import ChatCompletionRequest
from .protocol import CountTokensRequest, MessagesRequest, TextBlock, ThinkingBlock, ToolResultBlock, ToolUseBlock


def chat_request(req: Union[MessagesRequest, CountTokensRequest]) -> ChatCompletionRequest:
    """The chat request (validated by the chat layer's own rules) the Anthropic request means."""
    body = {"model": req.model, "messages": _system(req.system) + _messages(req.messages)}
    body.update(_tools(req))
    body.update(_thinking(req.thinking))
    if _marks_cache(req):
        body["prompt_cache_key"] = "cache_control"  # a breakpoint: the prefix is written through to disk
    if isinstance(req, MessagesRequest):
        body.update(_sampling(req))
    return ChatCompletionRequest.model_validate(body)


def _marks_cache(req) -> bool:
    """Whether any system block, tool or message block carries a cache_control breakpoint."""
    blocks = list(req.system) if isinstance(req.system, list) else []
    blocks += list(req.tools or ())
    for m in req.messages:
        blocks += [] if isinstance(m.content, str) else m.content
    return any(getattr(b, "cache_control", None) is not None for b in blocks)


def _sampling(req: MessagesRequest) -> dict:
    out = {"max_tokens": req.max_tokens, "stream": bool(req.stream)}
    if req.stream:
        out["stream_options"] = {"include_usage": True}  # message_delta's usage
        out["return_progress"] = True  # message_start's: the prompt's tokens and the cache's share, once admitted
    for name, value in (("stop", req.stop_sequences), ("temperature", req.temperature), ("top_p", req.top_p),
                        ("top_k", req.top_k)):
        if value is not None:
            out[name] = value
    return out


def _system(system) -> list[dict]:
    if system is None:
        return []
    text = system if isinstance(system, str) else "\n".join(b.text for b in system)
    return [{"role": "system", "content": text}]


def _messages(messages) -> list[dict]:
    out = []
    for m in messages:
        out += _assistant(m.blocks()) if m.role == "assistant" else _user(m.blocks())
    return out


def _user(blocks: list) -> list[dict]:
    """One user turn: tool results as tool messages, the text around them as user messages, in order."""
    out, text = [], []
    for b in blocks:
        if isinstance(b, ToolResultBlock):
            if text:
                out.append({"role": "user", "content": "\n".join(text)})
                text = []
            out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": b.text()})
        elif isinstance(b, TextBlock):
            text.append(b.text)
        elif isinstance(b, ToolUseBlock):
            raise bad_request("a 'tool_use' block belongs to an assistant message", param="messages")
    if text or not out:
        out.append({"role": "user", "content": "\n".join(text)})
    return out


def _assistant(blocks: list) -> list[dict]:
    text = "".join(b.text for b in blocks if isinstance(b, TextBlock))
    msg = {"role": "assistant", "content": text}
    thinking = "".join(b.thinking for b in blocks if isinstance(b, ThinkingBlock))
    if thinking:
        msg["reasoning_content"] = thinking
    calls = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(b.input)}}
             for b in blocks if isinstance(b, ToolUseBlock)]
    if calls:
        msg["tool_calls"] = calls
    if any(isinstance(b, ToolResultBlock) for b in blocks):
        raise bad_request("a 'tool_result' block belongs to a user message", param="messages")
    return [msg]


def _tools(req) -> dict:
    if not req.tools:
        if req.tool_choice is not None and req.tool_choice.type != "none":
            raise bad_request("'tool_choice' needs 'tools'", param="tool_choice")
        return {}
    out = {"tools": [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                        "parameters": t.input_schema}} for t in req.tools]}
    c = req.tool_choice
    if c is None:
        return out
    if c.type == "tool":
        if not c.name:
            raise bad_request("'tool_choice.name' is required for type 'tool'", param="tool_choice.name")
        out["tool_choice"] = {"type": "function", "function": {"name": c.name}}
    else:
        out["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[c.type]
    if c.disable_parallel_tool_use:
        out["parallel_tool_calls"] = False
    return out


def _thinking(thinking) -> dict:
    if thinking is None or thinking.type == "adaptive":
        return {}
    if thinking.type == "disabled":
        return {"reasoning_effort": "none"}
    if thinking.budget_tokens is None:
        raise bad_request("'thinking.budget_tokens' is required for type 'enabled'", param="thinking.budget_tokens")
    return {"thinking_token_budget": thinking.budget_tokens}
