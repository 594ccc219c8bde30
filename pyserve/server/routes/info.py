"""What the server tells of itself: /health, /v1/models (also without /v1), /openapi.json (its module imported at
its first request), /server_info and /model_info (for people and for routers), /metrics."""
from __future__ import annotations

from quart import request
from quart_trio import QuartTrio

from ...api.base.replies import ModelList
from ...api.base.served_model import ServedModel
from ..http.response import json_response
from .worker import limits, sglang_model_info

_BIG_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
             "tokenizer.ggml.merges", "tokenizer.chat_template")


def version() -> str:
    try:
        from importlib.metadata import version as dist_version

        return dist_version("pyserve")
    except Exception:  # noqa: BLE001 - not installed (in-place build)
        return "0.1.0"


def server_info(state) -> dict:
    edge = state.edge
    info = {"version": version(), "model": state.served_model_name, "ready": state.loaded is not None,
            "inflight": state.metrics.inflight.count, "auth_failures": edge.auth_failures,
            "rate_limited": edge.rate_limiter.refused, "admission": {
                "refused": edge.queue.refused, "admitted": edge.queue.admitted, "in_system": edge.queue.in_system,
                "max_waiting": edge.queue.max_waiting, "max_queue_wait": edge.queue.max_queue_wait}}
    if state.loaded is not None:
        m = state.loaded.model
        # served_model_name (SGLang's key): the name a router lists and sends; sglang-router falls back to
        # model_path (the GGUF file here) without it, and replicas refuse that name (tests/clients/test_router.py)
        info.update({"served_model_name": m.name, "model_path": m.engine.model_path, "engine_config": m.engine.config,
                     "max_model_len": m.max_model_len, "stats": m.engine.stats(), "chat_template": m.chat_template,
                     **limits(m.engine.config)})
    return info


def model_info(model: ServedModel) -> dict:
    engine = model.engine
    meta = {k: v for k, v in engine.metadata.items() if k not in _BIG_KEYS}
    return {"model": model.name, "path": engine.model_path, "hparams": dict(engine.hparams), "metadata": meta,
            **sglang_model_info(model)}  # sglang-router reads model_type and architectures here


def add_routes(app: QuartTrio, state) -> None:
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
        from .openapi import openapi_document

        return json_response(openapi_document(version(), bool(state.edge.access.api_keys)))

    _worker_info_routes(app, state)


def _worker_info_routes(app: QuartTrio, state) -> None:
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
        return state.metrics.render(), 200, {"Content-Type": state.metrics.content_type}
