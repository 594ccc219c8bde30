"""The routes: each parses its input, hands the serving layer what it needs, and wraps what comes back.

The modules of the APIs fewer clients speak (infill, rerank, the Responses and Anthropic APIs, the OpenAPI
document) are imported by their routes at their first request, not at start-up: their protocol models take
~25 ms to build, on the way to a server's first /health 200."""
from __future__ import annotations

from quart import request
from quart_trio import QuartTrio

from ..openai.protocol import (ChatCompletionRequest, CompletionRequest, DetokenizeRequest, EmbeddingRequest,
                               TemplateRequest, TokenizeRequest, parse_body)
from ..openai.responses import ModelList
from .info import model_info, server_info, version
from .metrics import CONTENT_TYPE
from .responses import json_response, reply
from .routes_rerank import add_rerank_routes
from .routes_anthropic import add_anthropic_routes
from .routes_responses import add_responses_routes
from .webui import add_webui_routes
from .worker_api import add_worker_routes


async def _body(model: type):
    return parse_body(model, await request.get_data(cache=False))


def add_routes(app: QuartTrio, state) -> None:
    _generation_routes(app, state)
    add_responses_routes(app, state)  # /v1/responses (routes_responses.py)
    _token_routes(app, state)
    add_rerank_routes(app, state)  # /v1/rerank, /v1/score (routes_rerank.py)
    _info_routes(app, state)
    add_anthropic_routes(app, state)  # /v1/messages (Anthropic's Messages API)
    add_webui_routes(app)  # the chat page at /
    add_worker_routes(app, state)  # what SGLang's and vLLM's routers read (worker_api.py)


def _generation_routes(app: QuartTrio, state) -> None:
    @app.post("/v1/completions")
    @app.post("/completions")  # clients configured with a base URL without /v1 (llama.cpp's server takes both)
    async def completions():
        req = await _body(CompletionRequest)
        serving = await state.serving(req.model)
        return reply(await serving.completions.create(req, state.context()), bool(req.stream))

    @app.post("/infill")  # llama.cpp's fill-in-the-middle (serving_infill.py)
    async def infill():
        from ..openai.infill_protocol import InfillRequest

        req = await _body(InfillRequest)
        serving = await state.serving(req.model)
        return reply(await serving.infill.create(req, state.context()), bool(req.stream))

    @app.post("/v1/embeddings")
    @app.post("/embeddings")
    async def embeddings():
        req = await _body(EmbeddingRequest)
        serving = await state.serving(req.model)
        return json_response(await serving.embeddings.create(req, state.context()))

    @app.post("/v1/chat/completions")
    @app.post("/chat/completions")
    async def chat_completions():
        req = await _body(ChatCompletionRequest)
        serving = await state.serving(req.model)
        return reply(await serving.chat.create(req, state.context()), bool(req.stream))


def _token_routes(app: QuartTrio, state) -> None:
    @app.post("/tokenize")
    async def tokenize():
        req = await _body(TokenizeRequest)
        serving = await state.serving(req.model)
        return json_response(await serving.tokens.tokenize(req))

    @app.post("/detokenize")
    async def detokenize():
        req = await _body(DetokenizeRequest)
        serving = await state.serving(req.model)
        return json_response(serving.tokens.detokenize(req))

    @app.get("/tokenizer_info")
    async def tokenizer_info():
        serving = await state.serving(request.args.get("model"))
        return json_response(serving.tokens.tokenizer_info())

    @app.post("/apply-template")
    async def apply_template():
        req = await _body(TemplateRequest)
        serving = await state.serving(req.model)
        return json_response(await serving.tokens.apply_template(req))


def _info_routes(app: QuartTrio, state) -> None:
    @app.get("/health")
    async def health():
        if not state.ready:
            return json_response({"status": "loading"}, 503)
        if state.stopping:
            return json_response({"status": "shutting down"}, 503)
        return json_response({"status": "ok"})

    @app.get("/v1/models")
    @app.get("/models")
    async def models():
        return json_response(ModelList(object="list", data=await state.model_cards()))

    @app.get("/v1/models/<path:model>")
    @app.get("/models/<path:model>")
    async def model(model: str):
        return json_response(await state.model_card(model))

    @app.get("/openapi.json")
    async def openapi():
        from ..openai.openapi import openapi_document

        return json_response(openapi_document(version(), bool(state.edge.access.api_keys)))

    @app.get("/server_info")
    @app.get("/get_server_info")  # SGLang's name, which vllm-router reads
    async def info():
        return json_response(server_info(state))

    @app.get("/model_info")
    async def model_details():
        serving = await state.serving(request.args.get("model"))
        return json_response(model_info(serving.model))

    @app.get("/metrics")
    async def metrics():
        return state.metrics.render(), 200, {"Content-Type": CONTENT_TYPE}
