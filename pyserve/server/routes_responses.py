"""The Responses API's routes (/v1/responses)."""
from __future__ import annotations

from quart import request
from quart_trio import QuartTrio

from ..openai.protocol import parse_body
from ..openai.protocol_responses import ResponsesRequest
from ..openai.serving_responses import ResponsesServing
from .responses import json_response, reply


def add_responses_routes(app: QuartTrio, state) -> None:
    @app.post("/v1/responses")
    @app.post("/responses")
    async def responses():
        req = parse_body(ResponsesRequest, await request.get_data(cache=False))
        serving = await state.serving(req.model)
        return reply(await ResponsesServing(serving.chat).create(req, state.context()), bool(req.stream))

    @app.post("/v1/responses/input_tokens")
    async def responses_input_tokens():
        req = parse_body(ResponsesRequest, await request.get_data(cache=False))
        serving = await state.serving(req.model)
        return json_response(await ResponsesServing(serving.chat).input_tokens(req))
