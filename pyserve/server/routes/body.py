"""A request's body as its protocol model: parsed and validated in one pass (api/base/protocol.py: parse_body)."""
from __future__ import annotations

from quart import request

from ...api.base.protocol import parse_body


async def body(model: type):
    return parse_body(model, await request.get_data(cache=False))
