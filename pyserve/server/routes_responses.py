"""The Responses API's routes (/v1/responses, and the stored responses under /v1/responses/{id}). Its modules
are imported at its first request (routes.py)."""
from __future__ import annotations

from quart import current_app, request
from quart_trio import QuartTrio

from ..openai.protocol import parse_body
from .responses import json_response, reply


def add_responses_routes(app: QuartTrio, state) -> None:
    @app.post("/v1/responses")
    @app.post("/responses")
    async def responses():
        from ..openai.protocol_responses import ResponsesRequest
        from ..openai.serving_responses import ResponsesServing

        req = parse_body(ResponsesRequest, await request.get_data(cache=False))
        if req.background:
            return json_response(await _start_background(state, req))
        serving = await state.serving(req.model)
        return reply(await ResponsesServing(serving.chat, state.responses).create(req, state.context()),
                     bool(req.stream))

    @app.post("/v1/responses/input_tokens")
    async def responses_input_tokens():
        from ..openai.protocol_responses import ResponsesRequest
        from ..openai.serving_responses import ResponsesServing

        req = parse_body(ResponsesRequest, await request.get_data(cache=False))
        serving = await state.serving(req.model)
        return json_response(await ResponsesServing(serving.chat, state.responses).input_tokens(req, state.context()))

    _stored_routes(app, state)


async def _start_background(state, req) -> dict:
    """The queued Response of `req` (a ResponsesRequest); the job holds its own model lease (the request's ends
    with this reply)."""
    from ..openai.serving_background import BackgroundServing
    from ..openai.serving_responses import ResponsesServing

    lease = await state.lease(req.model)
    try:
        return BackgroundServing(ResponsesServing(lease.serving.chat, state.responses), state.background).start(
            req, state.context(), current_app.nursery, lease.release)
    except BaseException:
        lease.release()  # idempotent: the job, had it started, releases it too
        raise


def _stored_routes(app: QuartTrio, state) -> None:
    @app.get("/v1/responses/<rid>")
    async def response_get(rid: str):
        return json_response(state.responses.get(state.context().owner, rid).response)

    @app.delete("/v1/responses/<rid>")
    async def response_delete(rid: str):
        return json_response(state.responses.delete(state.context().owner, rid))

    @app.post("/v1/responses/<rid>/cancel")
    async def response_cancel(rid: str):
        from ..openai.serving_background import cancel_background

        return json_response(cancel_background(state.responses, state.background, state.context().owner, rid))

    @app.get("/v1/responses/<rid>/input_items")
    async def response_input_items(rid: str):
        order = request.args.get("order", "desc")
        return json_response(state.responses.input_list(state.context().owner, rid, order))
