"""The response shapes the Messages API sends (dicts as Anthropic's JSON), made from the chat layer's."""
from __future__ import annotations

import json
from typing import Optional

_STOP = {"tool_calls": "tool_use", "length": "max_tokens"}


def message_id(chat_id: str) -> str:
    return "msg_" + chat_id.removeprefix("chatcmpl-")


def tool_id(call_id: str) -> str:
    """Anthropic's tool_use id for a chat tool call's (the chat layer's `call_…`)."""
    return "toolu_" + call_id.removeprefix("call_")


def stop_reason(finish: Optional[str], matched: Optional[str]) -> tuple[Optional[str], Optional[str]]:
    """(stop_reason, stop_sequence) of a chat finish_reason and the stop string that ended it."""
    if finish is None:
        return None, None
    if finish == "stop" and matched is not None:
        return "stop_sequence", matched
    return _STOP.get(finish, "end_turn"), None


def usage(u) -> dict:
    """Anthropic counts the prompt tokens the cache served apart from input_tokens."""
    cached = u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details else 0
    return prompt_usage(u.prompt_tokens, cached, u.completion_tokens)


def prompt_usage(prompt: int, cached: int, output: int = 0) -> dict:
    return {"input_tokens": prompt - cached, "output_tokens": output, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached}


def message(rid: str, model: str, content: list, stop: tuple, u: Optional[dict]) -> dict:
    return {"id": message_id(rid), "type": "message", "role": "assistant", "model": model, "content": content,
            "stop_reason": stop[0], "stop_sequence": stop[1],
            "usage": u or {"input_tokens": 0, "output_tokens": 0}}


def content(msg) -> list:
    """A chat message's content blocks: thinking, text, tool uses."""
    out = []
    thinking = getattr(msg, "reasoning_content", None)
    if thinking:
        out.append({"type": "thinking", "thinking": thinking, "signature": ""})
    if msg.content:
        out.append({"type": "text", "text": msg.content})
    for c in msg.tool_calls or ():
        out.append({"type": "tool_use", "id": tool_id(c["id"]), "name": c["function"]["name"],
                    "input": json.loads(c["function"]["arguments"] or "{}")})
    return out or [{"type": "text", "text": ""}]


def response(chat) -> dict:
    """The Message of a (one-choice) chat completion."""
    ch = chat.choices[0]
    return message(chat.id, chat.model, content(ch.message),
                   stop_reason(ch.finish_reason, getattr(ch, "stop_reason", None)), usage(chat.usage))
