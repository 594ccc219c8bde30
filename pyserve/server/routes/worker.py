"""The worker endpoints that SGLang's and vLLM's routers read, answered the way an SGLang worker does, so
pyserve replicas can sit behind sglang-router (sgl-model-gateway 0.3.2) or vllm-router (0.1.17) unchanged.

What each router reads (their sources, and what they sent a replica on the wire; tests/server/test_worker_api.py):
- GET /health: 200 to take a worker in, anything else (or no answer) to take it out. pyserve answers 503
  while the model loads and from the first SIGTERM on (info.py);
- GET /server_info (sglang-router, at registration; vllm-router reads /get_server_info for `dp_size`):
  `served_model_name` (else `model_path`) is the model id it lists; `dp_size`, `max_total_tokens`,
  `max_running_requests`, `max_prefill_tokens` must be unsigned integers when present, or the router drops
  every field of the answer;
- GET /model_info and /get_model_info: SGLang's fields (`model_path`, `tokenizer_path`, `is_generation`,
  `model_type`, `architectures`, ...); `model_path` is the served name, the name clients send;
- GET /get_load (the routers' load monitors, for load-based policies): a list with one entry per
  data-parallel rank, `num_tokens` summed as the worker's load and `num_waiting_reqs` as its queue.
"""
from __future__ import annotations

from quart import request

from ...api.base.served_model import ServedModel
from ..http.response import json_response


def limits(engine_config: dict) -> dict:
    """/server_info's capacity fields under SGLang's server_args names: tokens the KV cache holds, sequences
    in a batch, tokens per engine step (a prompt chunk), one data-parallel rank."""
    c = engine_config
    return {"dp_size": 1, "max_total_tokens": c["num_kv_blocks"] * c["block_size"],
            "max_running_requests": c["max_num_seqs"], "max_prefill_tokens": c["max_num_batched_tokens"]}


def sglang_model_info(model: ServedModel) -> dict:
    """SGLang's /get_model_info. model_type and architectures: the GGUF's `general.architecture` (e.g.
    "gemma3"), not a Hugging Face class name (a GGUF has none); the routers only label workers with them."""
    arch = str(model.engine.metadata.get("general.architecture", "")) or None
    return {"model_path": model.name, "tokenizer_path": model.name, "is_generation": True,
            "preferred_sampling_params": None, "weight_version": "default", "has_image_understanding": False,
            "has_audio_understanding": False, "model_type": arch, "architectures": [arch] if arch else None}


def load(stats: dict, block_size: int) -> list[dict]:
    """SGLang's /get_load for the one rank. Sequences, not requests (a request with n=4 is four); num_tokens:
    KV cache tokens held by sequences (SGLang adds its waiting prompts' tokens; the engine's stats do not
    carry those). The fields after num_tokens are pyserve's."""
    running, waiting = stats["running"], stats["waiting"]
    used, total = stats["blocks_used"], stats["blocks_total"]
    return [{"dp_rank": 0, "num_reqs": running + waiting, "num_waiting_reqs": waiting, "num_tokens": used * block_size,
             "num_running_reqs": running, "kv_blocks_used": used, "kv_blocks_total": total,
             "kv_usage": round(used / total, 4) if total else 0.0}]


def add_routes(app, state) -> None:
    @app.get("/get_model_info")
    async def get_model_info():
        return json_response(sglang_model_info((await state.serving(request.args.get("model"))).model))

    @app.get("/get_load")
    async def get_load():
        engine = (await state.serving(None)).model.engine  # the default model's (several: see /metrics)
        return json_response(load(engine.stats(), engine.config["block_size"]))
