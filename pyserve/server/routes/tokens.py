"""/tokenize, /detokenize, /tokenizer_info and /apply-template: the prompt a request would give the model."""
from __future__ import annotations

from quart import request
from quart_trio import QuartTrio

from ...api.tokens.protocol import DetokenizeRequest, TemplateRequest, TokenizeRequest
from ..http.response import json_response
from .body import body


def add_routes(app: QuartTrio, state) -> None:
    @app.post("/tokenize")
    async def tokenize():
        req = await body(TokenizeRequest)
        serving = await state.serving(req.model)
        return json_response(await serving.tokens.tokenize(req))

    @app.post("/detokenize")
    async def detokenize():
        req = await body(DetokenizeRequest)
        serving = await state.serving(req.model)
        return json_response(serving.tokens.detokenize(req))

    @app.get("/tokenizer_info")
    async def tokenizer_info():
        serving = await state.serving(request.args.get("model"))
        return json_response(serving.tokens.tokenizer_info())

    @app.post("/apply-template")
    async def apply_template():
        req = await body(TemplateRequest)
        serving = await state.serving(req.model)
        return json_response(await serving.tokens.apply_template(req))
