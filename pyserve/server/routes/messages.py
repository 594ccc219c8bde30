"""Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens; api/messages/); its errors are shaped by
path in app.py. Its modules are imported at its first request."""
from __future__ import annotations

from quart_trio import QuartTrio

from ..http.response import json_response, reply
from .body import body


def add_routes(app: QuartTrio, state) -> None:
    @app.post("/v1/messages")
    async def messages():
        from ...api.messages.protocol import MessagesRequest
        from ...api.messages.serving import create_message

        req = await body(MessagesRequest)
        serving = await state.serving(req.model)
        return reply(await create_message(serving, req, state.context()), bool(req.stream))

    @app.post("/v1/messages/count_tokens")
    async def messages_count_tokens():
        from ...api.messages.protocol import CountTokensRequest
        from ...api.messages.serving import count_tokens

        req = await body(CountTokensRequest)
        serving = await state.serving(req.model)
        return json_response(await count_tokens(serving, req))
