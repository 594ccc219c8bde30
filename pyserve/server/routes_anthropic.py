"""Anthropic's Messages API routes (pyserve/anthropic/); its errors are shaped by path in app.py. Its modules
are imported at its first request (routes.py)."""
from __future__ import annotations

from quart import request
from quart_trio import QuartTrio

from ..openai.protocol import parse_body
from .responses import json_response, reply


def add_anthropic_routes(app: QuartTrio, state) -> None:
    @app.post("/v1/messages")
    async def messages():
        from ..anthropic.protocol import MessagesRequest
        from ..anthropic.serving import create_message

        req = parse_body(MessagesRequest, await request.get_data(cache=False))
        serving = await state.serving(req.model)
        return reply(await create_message(serving, req, state.context()), bool(req.stream))

    @app.post("/v1/messages/count_tokens")
    async def messages_count_tokens():
        from ..anthropic.protocol import CountTokensRequest
        from ..anthropic.serving import count_tokens

        req = parse_body(CountTokensRequest, await request.get_data(cache=False))
        serving = await state.serving(req.model)
        return json_response(await count_tokens(serving, req))
