"""OpenAI's Responses API (/v1/responses, and the stored responses under /v1/responses/{id}; api/responses/).
Its modules are imported at its first request."""
from __future__ import annotations

from quart import current_app, request
from quart_trio import QuartTrio

from ..http.response import json_response, reply
from .body import body


def add_routes(app: QuartTrio, state) -> None:
    @app.post("/v1/responses")
    @app.post("/responses")
    async def responses():
        from ...api.responses.protocol import ResponsesRequest
        from ...api.responses.serving import ResponsesServing

        req = await body(ResponsesRequest)
        if req.background:
            return json_response(await _start_background(state, req))
        serving = await state.serving(req.model)
        return reply(await ResponsesServing(serving.chat, state.responses).create(req, state.context()),
                     bool(req.stream))

    @app.post("/v1/responses/input_tokens")
    async def responses_input_tokens():
        from ...api.responses.protocol import ResponsesRequest
        from ...api.responses.serving import ResponsesServing

        req = await body(ResponsesRequest)
        serving = await state.serving(req.model)
        return json_response(await ResponsesServing(serving.chat, state.responses).input_tokens(req, state.context()))

    _stored_routes(app, state)


async def _start_background(state, req) -> dict:
    """The queued Response of `req` (a ResponsesRequest); the job holds its own model lease (the request's ends
    with this reply)."""
    from ...api.responses.background import BackgroundServing
    from ...api.responses.serving import ResponsesServing

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
        from ...api.responses.background import cancel_background

        return json_response(cancel_background(state.responses, state.background, state.context().owner, rid))

    @app.get("/v1/responses/<rid>/input_items")
    async def response_input_items(rid: str):
        order = request.args.get("order", "desc")
        return json_response(state.responses.input_list(state.context().owner, rid, order))
