"""The ASGI app (Quart-Trio): thin routes over the serving classes.

`create_app(engine, config)` builds it around an open AsyncLLM; `engine` may be None and set later with
`app.pyserve.set_engine(engine)` (the server listens while the model loads; /health answers 503 till then).
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import time
from dataclasses import dataclass
from typing import Any, Optional

import trio
from quart import request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from .chat_template import builtin_gemma_template
from .metrics import CONTENT_TYPE, Metrics, instrument
from .protocol import OpenAIError, bad_request, parse_chat, parse_completion, server_error
from .serving_chat import ChatServing
from .serving_completions import CompletionServing, error_response, json_response

log = logging.getLogger("pyserve.server")

_ARCH_BIG_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                  "tokenizer.ggml.merges", "tokenizer.chat_template")


@dataclass
class ServerConfig:
    served_model_name: Optional[str] = None
    chat_template: Optional[str] = None  # the template's source (from --chat-template FILE)
    api_key: Optional[str] = None


class ServerState:
    def __init__(self, config: ServerConfig):
        self.config = config
        self.engine = None
        self.served_model_name = config.served_model_name or "pyserve"
        self.chat_template: Optional[str] = None
        self.no_template_reason = ""
        self.draining = trio.Event()  # set at the drain deadline: in-flight responses end
        self.stopping = False  # set on the shutdown signal: new requests get 503
        self.inflight = 0
        self.created = int(time.time())
        self.metrics = Metrics()
        self.metrics.state = self

    def set_engine(self, engine) -> None:
        llm = engine.llm
        self.tokenizer = engine.tokenizer
        cfg = llm.engine.config
        self.n_vocab = llm.engine.hparams["n_vocab"]
        self.kv_tokens = cfg["num_kv_blocks"] * cfg["block_size"]
        self.max_model_len = min(cfg["n_ctx"], self.kv_tokens)
        if self.config.served_model_name is None:
            base = os.path.basename(llm.model_path)
            self.served_model_name = base[:-5] if base.endswith(".gguf") else base
        meta = llm.engine.metadata
        if self.config.chat_template is not None:
            self.chat_template = self.config.chat_template
        elif isinstance(meta.get("tokenizer.chat_template"), str):
            self.chat_template = meta["tokenizer.chat_template"]
        elif str(meta.get("general.architecture", "")).startswith("gemma"):
            self.chat_template = builtin_gemma_template()
        else:
            self.no_template_reason = ("this model has no chat template in its GGUF; start the server with "
                                       "--chat-template FILE or pass 'chat_template' in the request")
        self.engine = engine

    def model_names(self) -> set[str]:
        return {self.served_model_name}

    def require_engine(self):
        if self.engine is None:
            raise server_error("the model is still loading", 503)
        return self.engine

    def request_started(self) -> None:
        self.inflight += 1

    def request_finished(self, choices) -> None:
        self.inflight -= 1  # (token and outcome counts: the request's metrics.RequestTimer)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("pyserve")
    except Exception:  # noqa: BLE001 - not installed (in-place build)
        return "0.1.0"


async def _json_body() -> Any:
    data = await request.get_data()
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"the request body is not valid JSON: {e}") from None


def create_app(engine=None, config: Optional[ServerConfig] = None) -> QuartTrio:
    app = QuartTrio("pyserve")
    app.config["RESPONSE_TIMEOUT"] = None  # a stream may run for minutes
    app.config["BODY_TIMEOUT"] = 60
    app.config["MAX_CONTENT_LENGTH"] = 64 * 1024 * 1024
    state = ServerState(config or ServerConfig())
    app.pyserve = state
    if engine is not None:
        state.set_engine(engine)
    chat = ChatServing(state)
    completions = CompletionServing(state)

    @app.errorhandler(OpenAIError)
    async def _openai_error(e: OpenAIError):
        return error_response(e)

    @app.errorhandler(HTTPException)
    async def _http_error(e: HTTPException):
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(e.code)
        return error_response(OpenAIError(e.description or e.name, e.code or 500, "invalid_request_error", None,
                                          code))

    @app.errorhandler(Exception)
    async def _any_error(e: Exception):
        log.exception("request failed")
        return error_response(server_error(f"internal error: {type(e).__name__}"))

    @app.before_request
    async def _auth():
        if request.path in ("/health", "/metrics", "/ping"):
            return None
        key = state.config.api_key
        if key:
            given = request.headers.get("Authorization", "")
            scheme, _, token = given.partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), key.encode()):
                return error_response(OpenAIError("Incorrect API key provided.", 401, "invalid_request_error",
                                                  None, "invalid_api_key"))
        if state.stopping and request.method == "POST":
            return error_response(server_error("server shutting down", 503))
        return None

    @app.get("/health")
    async def health():
        if state.engine is None:
            return json_response({"status": "loading"}, 503)
        if state.stopping:
            return json_response({"status": "shutting down"}, 503)
        return json_response({"status": "ok"})

    def model_card() -> dict:
        return {"id": state.served_model_name, "object": "model", "created": state.created, "owned_by": "pyserve",
                "max_model_len": state.max_model_len}

    @app.get("/v1/models")
    async def models():
        state.require_engine()
        return json_response({"object": "list", "data": [model_card()]})

    @app.get("/v1/models/<path:model>")
    async def model(model: str):
        state.require_engine()
        if model not in state.model_names():
            raise OpenAIError(f"The model `{model}` does not exist.", 404, "invalid_request_error", "model",
                              "model_not_found")
        return model_card()

    @app.post("/v1/completions")
    async def v1_completions():
        req = parse_completion(await _json_body())
        state.require_engine()
        return await completions.create(req)

    @app.post("/v1/chat/completions")
    async def v1_chat():
        req = parse_chat(await _json_body())
        state.require_engine()
        return await chat.create(req)

    @app.post("/tokenize")
    async def tokenize():
        body = await _json_body()
        state.require_engine()
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object")
        add_special = body.get("add_special_tokens", True)
        if "messages" in body:
            text = await chat.render(body["messages"], body.get("chat_template"), body.get("chat_template_kwargs"),
                                     body.get("add_generation_prompt", True))
            ids = chat.encode_rendered(text)
        elif isinstance(body.get("prompt", body.get("content")), str):
            ids = state.tokenizer.encode(body.get("prompt", body.get("content")), add_special=bool(add_special),
                                         parse_special=True)
        else:
            raise bad_request("'prompt' (a string) or 'messages' is required", param="prompt")
        out = {"tokens": ids, "count": len(ids), "max_model_len": state.max_model_len}
        if body.get("return_token_strs"):
            out["token_strs"] = [chat.token_text(t)[0] for t in ids]
        return json_response(out)

    @app.post("/detokenize")
    async def detokenize():
        body = await _json_body()
        state.require_engine()
        ids = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise bad_request("'tokens' must be an array of token ids", param="tokens")
        if ids:
            chat.check_ids(ids, "tokens")
        return json_response({"prompt": state.tokenizer.decode(ids, skip_special=False)})

    @app.post("/apply-template")
    async def apply_template():
        body = await _json_body()
        state.require_engine()
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            raise bad_request("'messages' (an array) is required", param="messages")
        text = await chat.render(body["messages"], body.get("chat_template"), body.get("chat_template_kwargs"),
                                 body.get("add_generation_prompt", True))
        return json_response({"prompt": text})

    @app.get("/server_info")
    async def server_info():
        info = {"version": _version(), "model": state.served_model_name, "ready": state.engine is not None,
                "inflight": state.inflight}
        if state.engine is not None:
            llm = state.engine.llm
            info.update({"model_path": llm.model_path, "engine_config": llm.engine.config,
                         "max_model_len": state.max_model_len, "stats": state.engine.stats(),
                         "chat_template": state.chat_template})
        return json_response(info)

    @app.get("/model_info")
    async def model_info():
        state.require_engine()
        llm = state.engine.llm
        meta = {k: v for k, v in llm.engine.metadata.items() if k not in _ARCH_BIG_KEYS}
        return json_response({"model": state.served_model_name, "path": llm.model_path,
                              "hparams": llm.engine.hparams, "metadata": meta})

    @app.get("/metrics")
    async def metrics():
        return state.metrics.render(), 200, {"Content-Type": CONTENT_TYPE}

    _shield_final_send(app)
    instrument(app, state.metrics)  # outermost: the arrival time is taken before anything else runs
    return app


def _shield_final_send(app: QuartTrio) -> None:
    """Hypercorn closes an HTTP/1.0 or `Connection: close` connection inside the app's final `send`, after
    delivering http.disconnect, on which Quart-Trio cancels the request's nursery -- the very task that is
    closing the socket, so the close is cancelled and the connection never ends. The final send is shielded
    (with a deadline)."""
    inner = app.asgi_app

    async def asgi_app(scope, receive, send):
        if scope["type"] != "http":
            return await inner(scope, receive, send)

        async def guarded_send(message):
            if message.get("type") == "http.response.body" and not message.get("more_body", False):
                with trio.move_on_after(10) as cs:
                    cs.shield = True
                    await send(message)
            else:
                await send(message)

        return await inner(scope, receive, guarded_send)

    app.asgi_app = asgi_app
