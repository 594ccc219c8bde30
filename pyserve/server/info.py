"""/server_info and /model_info: what the server and its model are (for people and for routers)."""
from __future__ import annotations

from ..openai.served_model import ServedModel
from .worker_api import limits, sglang_model_info

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
        # model_path (the GGUF file here) without it, and replicas refuse that name (tests/test_router.py)
        info.update({"served_model_name": m.name, "model_path": m.engine.model_path, "engine_config": m.engine.config,
                     "max_model_len": m.max_model_len, "stats": m.engine.stats(), "chat_template": m.chat_template,
                     **limits(m.engine.config)})
    return info


def model_info(model: ServedModel) -> dict:
    engine = model.engine
    meta = {k: v for k, v in engine.metadata.items() if k not in _BIG_KEYS}
    return {"model": model.name, "path": engine.model_path, "hparams": dict(engine.hparams), "metadata": meta,
            **sglang_model_info(model)}  # sglang-router reads model_type and architectures here
