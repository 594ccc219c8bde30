"""The chat chunk stream as Anthropic's SSE events (`event: <type>` lines, api/base/streaming.py's Named).

message_start (once the prompt is admitted: its usage says how many prompt tokens the prefix cache served, as
Anthropic's does; the chat stream's prompt progress tells it, and keep-alive comments cover the wait), ping, then
per block content_block_start / content_block_delta (thinking_delta, text_delta,
input_json_delta) / content_block_stop, then message_delta (stop_reason, usage) and message_stop. The chat
stream's in-band error ends it with `event: error` in Anthropic's shape. Cancellation passes through: the chat
stream's generator is closed with this one, which aborts the engine request.
"""
from __future__ import annotations

from typing import AsyncIterator

from ..base.streaming import DONE, KEEP_ALIVE, EventStream, Named
from . import shapes
from .errors import from_openai_body


class _Blocks:
    """The open content block and what has been said of the message so far."""

    def __init__(self, model: str):
        self.model = model
        self.index, self.kind, self.call = -1, None, None
        self.stop, self.usage = (None, None), None
        self.started = False
        self.id = ""

    def start(self, c) -> list:
        """message_start and a ping, before the first chunk that says something (the prompt's progress, text,
        the end): the chat stream's opening role chunk is not yet the message."""
        if self.started:
            return []
        self.id = getattr(c, "id", self.id)
        p = getattr(c, "prompt_progress", None)
        if c is not None and p is None and c.choices and all(getattr(ch.delta, "role", None) for ch in c.choices):
            return []  # the opening role chunk
        self.started = True
        u = shapes.prompt_usage(p["total"], p["cache"]) if p else None
        start = shapes.message(self.id, self.model, [], (None, None), u)
        return [Named("message_start", {"type": "message_start", "message": start}), Named("ping", {"type": "ping"})]

    def open(self, kind: str, block: dict, call=None) -> list:
        out = self.close()
        self.index, self.kind, self.call = self.index + 1, kind, call
        return out + [Named("content_block_start", {"type": "content_block_start", "index": self.index,
                                                    "content_block": block})]

    def close(self) -> list:
        if self.kind is None:
            return []
        self.kind = None
        return [Named("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def delta(self, delta: dict) -> Named:
        return Named("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def text(self, kind: str, text: str) -> list:
        out = [] if self.kind == kind else self.open(kind, {"type": "text", "text": ""} if kind == "text" else
                                                     {"type": "thinking", "thinking": "", "signature": ""})
        d = {"type": "text_delta", "text": text} if kind == "text" else {"type": "thinking_delta", "thinking": text}
        return out + [self.delta(d)]

    def tool(self, entry: dict) -> list:
        out = []
        if self.kind != "tool_use" or self.call != entry["index"]:
            out = self.open("tool_use", {"type": "tool_use", "id": shapes.tool_id(entry.get("id", "")),
                                         "name": entry["function"].get("name", ""), "input": {}}, entry["index"])
        args = entry["function"].get("arguments")
        return out + ([self.delta({"type": "input_json_delta", "partial_json": args})] if args else [])

    def chunk(self, c) -> list:
        if c.usage is not None:
            self.usage = shapes.usage(c.usage)
        out = []
        for ch in c.choices:
            d = ch.delta
            if getattr(d, "reasoning_content", None):
                out += self.text("thinking", d.reasoning_content)
            if d.content:
                out += self.text("text", d.content)
            for entry in d.tool_calls or ():
                out += self.tool(entry)
            if ch.finish_reason:
                self.stop = shapes.stop_reason(ch.finish_reason, getattr(ch, "stop_reason", None))
        return out

    def end(self) -> list:
        out = self.close() if self.index >= 0 else self.open("text", {"type": "text", "text": ""}) + self.close()
        u = self.usage or {"output_tokens": 0}
        return out + [Named("message_delta", {"type": "message_delta",
                                              "delta": {"stop_reason": self.stop[0], "stop_sequence": self.stop[1]},
                                              "usage": u}),
                      Named("message_stop", {"type": "message_stop"})]


def message_events(chat: EventStream, model: str) -> EventStream:
    return EventStream(_events(chat, model))


async def _events(chat: EventStream, model: str) -> AsyncIterator[list]:
    blocks = _Blocks(model)
    batches = chat.batches
    try:
        async for batch in batches:
            out = []
            for e in batch:
                if e is KEEP_ALIVE:
                    out.append(e)
                elif e is DONE:
                    out += blocks.start(None) + blocks.end()
                elif isinstance(e, dict) and "error" in e:
                    out.append(Named("error", from_openai_body(e)))
                else:
                    out += blocks.start(e) + blocks.chunk(e)
            yield out
            if any(isinstance(x, Named) and x.name == "error" for x in out):
                return
    finally:
        await batches.aclose()
