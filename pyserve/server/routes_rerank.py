"""The reranker routes: Jina's / Cohere's /v1/rerank (and /rerank, as llama.cpp's server takes it, and Cohere's
/v2/rerank) and vLLM's /v1/score (and /score) (docs/RERANK.md)."""
from __future__ import annotations

from quart import request
from quart_trio import QuartTrio

from ..openai.protocol import parse_body
from .responses import json_response

# (paths, request model in protocol_rerank.py: imported at the first request (routes.py), the RerankServing
# method that answers it)
_ROUTES = ((("/v1/rerank", "/rerank", "/v2/rerank"), "RerankRequest", "rerank"),  # /v2: Cohere's ClientV2
           (("/v1/score", "/score"), "ScoreRequest", "score"))


def add_rerank_routes(app: QuartTrio, state) -> None:
    for paths, model, method in _ROUTES:
        _add(app, state, paths, model, method)


def _add(app: QuartTrio, state, paths: tuple[str, ...], model: str, method: str) -> None:
    async def endpoint():
        from ..openai import protocol_rerank

        req = parse_body(getattr(protocol_rerank, model), await request.get_data(cache=False))
        serving = await state.serving(req.model)
        return json_response(await getattr(serving.rerank, method)(req, state.context()))

    endpoint.__name__ = method
    for path in paths:
        app.post(path)(endpoint)
