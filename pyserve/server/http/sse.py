"""Server-sent events: how the serving layer's events (api/base/streaming.py) and response models go on the wire.

A response model is serialized without the fields it did not set (`exclude_unset`: every field of a response
shape is passed explicitly, see api/base/replies.py), compact UTF-8 JSON.
"""
from __future__ import annotations

import json
from typing import AsyncIterator

from pydantic import BaseModel

from ...api.base.streaming import DONE, KEEP_ALIVE, EventStream, Named

HEADERS = {"Content-Type": "text/event-stream; charset=utf-8", "Cache-Control": "no-cache",
           "X-Accel-Buffering": "no"}
_DONE = b"data: [DONE]\n\n"
_KEEP_ALIVE = b": keep-alive\n\n"  # a comment line: every SSE parser skips it (WHATWG's event-stream rules)


def dumps(obj) -> bytes:
    """JSON as compact UTF-8; a response model without the fields it did not set."""
    if isinstance(obj, BaseModel):
        return obj.model_dump_json(exclude_unset=True).encode()
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def frame(event) -> bytes:
    """One event's SSE bytes."""
    if event is DONE:
        return _DONE
    if event is KEEP_ALIVE:
        return _KEEP_ALIVE
    if isinstance(event, Named):
        return b"event: " + event.name.encode() + b"\ndata: " + dumps(event.data) + b"\n\n"
    return b"data: " + dumps(event) + b"\n\n"


async def body(stream: EventStream) -> AsyncIterator[bytes]:
    """The response body: each batch of events in one write (a batch with nothing to say writes nothing). The
    stream's generator is closed with the body, so a client's disconnect reaches it as Cancelled."""
    batches = stream.batches
    try:
        async for batch in batches:
            data = b"".join(frame(e) for e in batch)
            if data:
                yield data
    finally:
        await batches.aclose()
