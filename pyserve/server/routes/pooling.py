"""The prefill-only endpoints: /v1/embeddings (also without /v1), and the reranker's — Jina's / Cohere's
/v1/rerank (and /rerank, as llama.cpp's server takes it, and Cohere's /v2/rerank) and vLLM's /v1/score (and
/score) (docs/RERANK.md), whose modules are imported at their first request."""
from __future__ import annotations

from quart_trio import QuartTrio

from ...api.pooling.protocol import EmbeddingRequest
from ..http.response import json_response
from .body import body

# (paths, request model in api/pooling/score_protocol.py, the RerankServing method that answers it)
_SCORE_ROUTES = ((("/v1/rerank", "/rerank", "/v2/rerank"), "RerankRequest", "rerank"),  # /v2: Cohere's ClientV2
                 (("/v1/score", "/score"), "ScoreRequest", "score"))


def add_routes(app: QuartTrio, state) -> None:
    @app.post("/v1/embeddings")
    @app.post("/embeddings")
    async def embeddings():
        req = await body(EmbeddingRequest)
        serving = await state.serving(req.model)
        return json_response(await serving.embeddings.create(req, state.context()))

    for paths, model, method in _SCORE_ROUTES:
        _add_score_route(app, state, paths, model, method)


def _add_score_route(app: QuartTrio, state, paths: tuple[str, ...], model: str, method: str) -> None:
    async def endpoint():
        from ...api.pooling import score_protocol

        req = await body(getattr(score_protocol, model))
        serving = await state.serving(req.model)
        return json_response(await getattr(serving.rerank, method)(req, state.context()))

    endpoint.__name__ = method
    for path in paths:
        app.post(path)(endpoint)
