"""The Responses API's routes (/v1/responses, and the stored responses under /v1/responses/{id})."""
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
        return reply(await ResponsesServing(serving.chat, state.responses).create(req, state.context()),
                     bool(req.stream))

    @app.post("/v1/responses/input_tokens")
    async def responses_input_tokens():
        req = parse_body(ResponsesRequest, await request.get_data(cache=False))
        serving = await state.serving(req.model)
        return json_response(await ResponsesServing(serving.chat, state.responses).input_tokens(req, state.context()))

    _stored_routes(app, state)


def _stored_routes(app: QuartTrio, state) -> None:
    @app.get("/v1/responses/<rid>")
    async def response_get(rid: str):
        return json_response(state.responses.get(state.context().owner, rid).response)

    @app.delete("/v1/responses/<rid>")
    async def response_delete(rid: str):
        return json_response(state.responses.delete(state.context().owner, rid))

    @app.get("/v1/responses/<rid>/input_items")
    async def response_input_items(rid: str):
        order = request.args.get("order", "desc")
        return json_response(state.responses.input_list(state.context().owner, rid, order))
