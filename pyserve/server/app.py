"""The ASGI app (Quart-Trio): thin routes over the serving classes.

`create_app(engine, config)` builds it around an open AsyncLLM; `engine` may be None and set later with
`app.pyserve.set_engine(engine)` (the server listens while the model loads; /health answers 503 till then).
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any, Optional

import trio
from quart import Response, g, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from ..openai.chat_template import builtin_gemma_template
from .admission import AdmissionQueue, RateLimiter
from .auth import AccessConfig, auth_error, bearer_token, cors_headers, match_key, origin_allowed
from .metrics import CONTENT_TYPE, Metrics, instrument
from ..openai.openapi import openapi_document
from ..openai.protocol import (OpenAIError, bad_request, check_vocab, parse_chat, parse_completion, parse_json,
                       parse_template_request, server_error)
from ..openai.serving_chat import ChatServing
from ..openai.serving_completions import CompletionServing, error_response, json_response

log = logging.getLogger("pyserve.server")

_ARCH_BIG_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                  "tokenizer.ggml.merges", "tokenizer.chat_template")


@dataclass
class ServerConfig:
    served_model_name: Optional[str] = None
    chat_template: Optional[str] = None  # the template's source (from --chat-template FILE)
    api_key: Optional[str] = None  # one key (kept for callers of the first version); merged into api_keys
    api_keys: list = field(default_factory=list)
    metrics_require_key: bool = False
    allowed_origins: list = field(default_factory=list)  # CORS: off unless set ("*": any origin)
    rate_limit_rpm: int = 0  # per key; 0: off
    rate_limit_tpm: int = 0  # per key, prompt + max_tokens; 0: off
    default_completion_estimate: int = 256  # tokens counted for a request without max_tokens
    max_waiting: int = 0  # sequences waiting beyond the running capacity; 0: unbounded
    max_queue_wait: float = 0.0  # seconds a request may be expected to wait before it starts; 0: no bound
    max_body_size: int = 8 * 1024 * 1024  # bytes; larger bodies get 413
    body_timeout: float = 30.0  # seconds to receive a request body; slower gets 408
    stalled_client_timeout: float = 30.0  # seconds a stream write may wait on a client that is not reading


# POST endpoints that take a JSON body
_JSON_POSTS = ("/v1/completions", "/v1/chat/completions", "/tokenize", "/detokenize", "/apply-template")


class ServerState:
    def client_stalled(self) -> None:
        self.stalled_clients += 1

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
        keys = list(config.api_keys) + ([config.api_key] if config.api_key else [])
        self.access = AccessConfig(list(dict.fromkeys(keys)), config.metrics_require_key,
                                   list(config.allowed_origins))
        self.auth_failures = 0  # 401s answered (for the metrics)
        self.stalled_clients = 0  # streams aborted because the client stopped reading
        self.auth_log_window, self.auth_logged = 0.0, 0
        self.max_num_seqs = 64
        self.rate_limiter = RateLimiter(config.rate_limit_rpm, config.rate_limit_tpm)
        self.admission = AdmissionQueue(lambda: self.max_num_seqs, config.max_waiting, config.max_queue_wait)

    def set_engine(self, engine) -> None:
        llm = engine.llm
        self.tokenizer = engine.tokenizer
        cfg = llm.engine.config
        self.n_vocab = llm.engine.hparams["n_vocab"]
        self.kv_tokens = cfg["num_kv_blocks"] * cfg["block_size"]
        self.max_model_len = min(cfg["n_ctx"], self.kv_tokens)
        self.max_num_seqs = int(cfg.get("max_num_seqs", 64))
        try:  # the longest token, in bytes: a prompt longer than this x the context cannot fit
            self.max_token_bytes = max(1, max(len(self.tokenizer.token_bytes(i)) for i in range(self.n_vocab)))
        except Exception:  # noqa: BLE001 - no bound then
            self.max_token_bytes = 0
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
            err = server_error("the model is still loading", 503)
            err.headers["Retry-After"] = "5"
            raise err
        return self.engine

    def check_text_size(self, nbytes: int, param: str, factor: int = 1) -> None:
        """Refuses, without tokenizing it, text that cannot fit the context: tokenizing megabytes blocks the
        event loop for seconds. Each token covers at most `max_token_bytes` bytes, so the text holds at least
        nbytes / max_token_bytes tokens."""
        if not self.max_token_bytes:
            return
        at_least = -(-nbytes // self.max_token_bytes)
        if at_least > self.max_model_len * factor:
            raise bad_request(f"This model's maximum context length is {self.max_model_len} tokens. However, your "
                              f"prompt is at least {at_least} tokens ({nbytes} bytes; no token is longer than "
                              f"{self.max_token_bytes} bytes). Please reduce the length of the prompt.",
                              param=param, code="context_length_exceeded")

    def admit(self, jobs: list, req) -> None:
        """Rate limits (tokens) and queue admission for a request's jobs; raises a 429 OpenAIError. The
        ticket rides on the jobs and is released by `release(jobs)` (or when the jobs are garbage collected)."""
        key = g.get("client_key", "-")
        if self.rate_limiter.tpm:
            est = self.config.default_completion_estimate
            cost = sum(len(j.prompt_ids) + (req.max_tokens if req.max_tokens is not None
                                            else min(est, j.params.max_tokens)) for j in jobs)
            self.rate_limiter.check_tokens(key, cost)
        ticket = self.admission.admit(len(jobs))
        for j in jobs:
            j.ticket = ticket

    @staticmethod
    def release(jobs) -> None:
        for j in jobs:
            t = getattr(j, "ticket", None)
            if t is not None:
                t.release()

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


def _content_bytes(messages: list) -> int:
    n = 0
    for m in messages:
        c = m.get("content")
        if isinstance(c, str):
            n += len(c.encode())
        elif isinstance(c, list):
            n += sum(len(p.get("text", "").encode()) for p in c if isinstance(p, dict))
    return n


async def _json_body() -> Any:
    return parse_json(await request.get_data(cache=False))


def create_app(engine=None, config: Optional[ServerConfig] = None) -> QuartTrio:
    app = QuartTrio("pyserve")
    app.config["RESPONSE_TIMEOUT"] = None  # a stream may run for minutes
    config = config or ServerConfig()
    app.config["BODY_TIMEOUT"] = config.body_timeout
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_size
    app.config["MAX_FORM_MEMORY_SIZE"] = config.max_body_size
    state = ServerState(config)
    app.pyserve = state
    if engine is not None:
        state.set_engine(engine)
    chat = ChatServing(state)
    completions = CompletionServing(state)

    def openai_error(e: OpenAIError) -> Response:
        resp = error_response(e)
        for k, v in e.headers.items():
            resp.headers[k] = v
        return resp

    @app.errorhandler(OpenAIError)
    async def _openai_error(e: OpenAIError):
        return openai_error(e)

    @app.errorhandler(HTTPException)
    async def _http_error(e: HTTPException):
        code = {404: "not_found", 405: "method_not_allowed", 408: "request_timeout", 413: "request_too_large",
                415: "unsupported_media_type"}.get(e.code)
        status = e.code or 500
        if status >= 500:  # werkzeug's own 5xx would be a bug of ours; never hand them out as they are
            log.error("HTTP %d for %s %s: %s", status, request.method, request.path, e.description)
        resp = error_response(OpenAIError(e.description or e.name, status, "invalid_request_error", None, code))
        if status == 405 and getattr(e, "valid_methods", None):
            resp.headers["Allow"] = ", ".join(e.valid_methods)
        return resp

    @app.errorhandler(Exception)
    async def _any_error(e: Exception):
        log.exception("request failed")
        return error_response(server_error(f"internal error: {type(e).__name__}"))

    access = state.access

    @app.before_request
    async def _edge():
        origin = request.headers.get("Origin")
        # CORS preflight: answered here, before auth (browsers send no credentials on a preflight)
        if request.method == "OPTIONS" and origin and "Access-Control-Request-Method" in request.headers:
            if not origin_allowed(origin, access.allowed_origins):
                return Response("", 403)
            return Response("", 204, cors_headers(origin, access.allowed_origins, preflight=True,
                                                  request_headers=request.headers.get("Access-Control-Request-Headers")))
        path = request.path
        key = None
        if access.requires_key(path):
            token = bearer_token(request.headers.get("Authorization"))
            key = match_key(token, access.api_keys)
            if key is None:
                state.auth_failures += 1
                now = time.monotonic()
                if now - state.auth_log_window >= 60:
                    state.auth_log_window, state.auth_logged = now, 0
                state.auth_logged += 1
                if state.auth_logged <= 10:  # at most 10 lines a minute; the key itself is never logged
                    log.warning("401 for %s %s from %s (%s)%s", request.method, path, request.remote_addr,
                                "no key" if token is None else "wrong key",
                                "; further 401s this minute are not logged" if state.auth_logged == 10 else "")
                return openai_error(auth_error(token is None))
        if request.method == "POST":
            if state.stopping:
                return error_response(server_error("server shutting down", 503))
            if path in _JSON_POSTS:
                ctype = request.mimetype or ""
                if ctype and ctype != "application/json" and not ctype.endswith("+json"):
                    return openai_error(OpenAIError(
                        f"Content-Type must be application/json, got {ctype!r}", 415, "invalid_request_error",
                        None, "unsupported_media_type"))
                g.client_key = key or f"addr:{request.remote_addr}"
                state.rate_limiter.check_request(g.client_key)
        return None

    @app.after_request
    async def _cors(resp):
        origin = request.headers.get("Origin")
        if origin_allowed(origin, access.allowed_origins) and "Access-Control-Allow-Origin" not in resp.headers:
            resp.headers.update(cors_headers(origin, access.allowed_origins))
        return resp

    @app.get("/openapi.json")
    async def openapi():
        return json_response(openapi_document(_version(), bool(access.api_keys)))

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
        check_vocab(req, state.n_vocab)
        for p in req.prompts:
            if isinstance(p, str):
                state.check_text_size(len(p.encode()), "prompt")
        return await completions.create(req)

    @app.post("/v1/chat/completions")
    async def v1_chat():
        req = parse_chat(await _json_body())
        state.require_engine()
        check_vocab(req, state.n_vocab)
        state.check_text_size(_content_bytes(req.messages), "messages")
        return await chat.create(req)

    @app.post("/tokenize")
    async def tokenize():
        body = await _json_body()
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object")
        for name in ("add_special_tokens", "return_token_strs", "add_generation_prompt"):
            if body.get(name) is not None and not isinstance(body[name], bool):
                raise bad_request(f"'{name}' must be a boolean", param=name)
        add_special = body.get("add_special_tokens", True) is not False
        if "messages" in body:
            treq = parse_template_request(body)
            state.require_engine()
            text = await chat.render(treq.messages, treq.chat_template, treq.chat_template_kwargs,
                                     treq.add_generation_prompt)
            ids = chat.encode_rendered(text)
        else:
            prompt = body.get("prompt", body.get("content"))
            if not isinstance(prompt, str):
                raise bad_request("'prompt' (a string) or 'messages' is required", param="prompt")
            state.require_engine()
            state.check_text_size(len(prompt.encode()), "prompt", factor=4)
            ids = state.tokenizer.encode(prompt, add_special=add_special, parse_special=True)
        out = {"tokens": ids, "count": len(ids), "max_model_len": state.max_model_len}
        if body.get("return_token_strs"):
            out["token_strs"] = [chat.token_text(t)[0] for t in ids]
        return json_response(out)

    @app.post("/detokenize")
    async def detokenize():
        body = await _json_body()
        ids = body.get("tokens") if isinstance(body, dict) else None
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise bad_request("'tokens' must be an array of token ids", param="tokens")
        state.require_engine()
        if ids:
            chat.check_ids(ids, "tokens")
        return json_response({"prompt": state.tokenizer.decode(ids, skip_special=False)})

    @app.post("/apply-template")
    async def apply_template():
        treq = parse_template_request(await _json_body())
        state.require_engine()
        text = await chat.render(treq.messages, treq.chat_template, treq.chat_template_kwargs,
                                 treq.add_generation_prompt)
        return json_response({"prompt": text})

    @app.get("/server_info")
    async def server_info():
        info = {"version": _version(), "model": state.served_model_name, "ready": state.engine is not None,
                "inflight": state.inflight, "auth_failures": state.auth_failures,
                "rate_limited": state.rate_limiter.refused, "admission": {
                    "refused": state.admission.refused, "admitted": state.admission.admitted,
                    "in_system": state.admission.in_system, "max_waiting": state.admission.max_waiting,
                    "max_queue_wait": state.admission.max_queue_wait}}
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
