"""Conversation items of a stored Response: the request's input as Responses items with ids (what
/v1/responses/{id}/input_items lists) and the output as one chat assistant message (what a later
`previous_response_id` prepends)."""
from __future__ import annotations

from .protocol import ResponsesRequest


def _content(item: dict) -> list:
    content = item.get("content")
    if isinstance(content, list):
        return content
    kind = "output_text" if item.get("role") == "assistant" else "input_text"
    part = {"type": kind, "text": content or ""}
    return [{**part, "annotations": []} if kind == "output_text" else part]


def input_items(req: ResponsesRequest, rid: str) -> list[dict]:
    """This request's input items, each with an id (`{rid}_in{i}` unless the client gave one)."""
    items = [{"type": "message", "role": "user", "content": req.input}] if isinstance(req.input, str) else req.input
    out = []
    for i, item in enumerate(items):
        item = {"type": "message", **item, "id": item.get("id") or f"{rid}_in{i}"}
        if item["type"] == "message":
            item.update(content=_content(item), status="completed")
        elif item["type"] in ("function_call", "function_call_output"):
            item.setdefault("status", "completed")
        out.append(item)
    return out


def output_message(output: list[dict]) -> dict:
    """A Response's output items as the chat assistant message that produced them."""
    text = "".join(p.get("text", "") for o in output if o["type"] == "message" for p in o["content"])
    calls = [{"id": o["call_id"], "type": "function",
              "function": {"name": o["name"], "arguments": o["arguments"]}}
             for o in output if o["type"] == "function_call"]
    msg = {"role": "assistant", "content": text or None}
    return {**msg, "tool_calls": calls} if calls else msg
