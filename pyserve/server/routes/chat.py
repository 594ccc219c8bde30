"""/v1/chat/completions (also without /v1)."""
from __future__ import annotations

from quart_trio import QuartTrio

from ...api.chat.protocol import ChatCompletionRequest
from ..http.response import reply
from .body import body


def add_routes(app: QuartTrio, state) -> None:
    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    async def chat_completions():
        req = await body(ChatCompletionRequest)
        serving = await state.serving(req.model)
        return reply(await serving.chat.create(req, state.context()), bool(req.stream))
