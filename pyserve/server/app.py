"""The ASGI app (Quart-Trio): `create_app(engine, config)` builds it around an open AsyncLLM.

`engine` may be None and set later with `app.pyserve.set_engine(engine)`: the server listens while the
model loads, and /health answers 503 till then. Layers: the edge (edge.py) runs before every route; routes
(routes.py) parse, hand the serving layer what it needs, and wrap what it returns; errors of any layer
become OpenAI's error JSON here, once.
"""
from __future__ import annotations

import logging
from typing import Optional

import trio
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from ..openai.context import RequestContext
from ..openai.errors import OpenAIError, loading, server_error
from ..openai.responses import ModelCard
from ..openai.served_model import ServedModel
from ..openai.serving_chat import ChatServing
from ..openai.serving_completions import CompletionServing
from ..openai.serving_embeddings import EmbeddingServing
from ..openai.serving_tokens import TokenServing
from .config import ServerConfig
from .edge import Edge
from .metrics import Metrics, instrument
from .responses import json_response
from .routes import add_routes

log = logging.getLogger("pyserve.server")
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 408: "request_timeout", 413: "request_too_large",
               415: "unsupported_media_type"}

__all__ = ["create_app", "ServerConfig"]


class Serving:
    """The serving objects of the loaded model."""

    def __init__(self, model: ServedModel):
        self.model = model
        self.chat = ChatServing(model)
        self.completions = CompletionServing(model)
        self.tokens = TokenServing(model, self.chat)
        self.embeddings = EmbeddingServing(model)

    def model_card(self) -> ModelCard:
        m = self.model
        return ModelCard(id=m.name, object="model", created=m.created, owned_by="pyserve", max_model_len=m.max_model_len)


class AppState:
    """The app's state: the config, the model's serving once loaded, the edge, the metrics, the drain."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.metrics = Metrics()
        self.edge = Edge(config, self.metrics, lambda: self.loaded.model.max_num_seqs if self.loaded else 64)
        self.loaded: Optional[Serving] = None
        self.draining = trio.Event()  # set at the drain deadline: in-flight responses end

    def set_engine(self, engine) -> None:
        c = self.config
        model = ServedModel.from_engine(engine, c.served_model_name, c.chat_template, c.trust_request_chat_template,
                                        c.pooling, c.normalize_embeddings, c.tool_call_parser)
        self.metrics.serve_model(model.name, engine.stats)
        self.loaded = Serving(model)

    def serving(self) -> Serving:
        if self.loaded is None:
            raise loading()
        return self.loaded

    def context(self) -> RequestContext:
        return self.edge.context(request, self.draining)

    @property
    def served_model_name(self) -> str:
        return self.loaded.model.name if self.loaded else (self.config.served_model_name or "pyserve")

    @property
    def stopping(self) -> bool:
        return self.edge.stopping

    @stopping.setter
    def stopping(self, value: bool) -> None:
        self.edge.stopping = value


def create_app(engine=None, config: Optional[ServerConfig] = None) -> QuartTrio:
    app = QuartTrio("pyserve")
    config = config or ServerConfig()
    app.config.update(RESPONSE_TIMEOUT=None, BODY_TIMEOUT=config.body_timeout,  # a stream may run for minutes
                      MAX_CONTENT_LENGTH=config.max_body_size, MAX_FORM_MEMORY_SIZE=config.max_body_size)
    state = app.pyserve = AppState(config)
    if engine is not None:
        state.set_engine(engine)
    _error_handlers(app)
    _edge_hooks(app, state.edge)
    add_routes(app, state)
    _shield_final_send(app)
    _refuse_websockets(app)
    instrument(app, state.metrics)  # outermost: the arrival time is taken before anything else runs
    return app


def _edge_hooks(app: QuartTrio, edge: Edge) -> None:
    @app.before_request
    async def before() -> Optional[Response]:
        return edge.before(request)

    @app.after_request
    async def after(resp: Response) -> Response:
        return edge.after(request, resp)


def _error_handlers(app: QuartTrio) -> None:
    @app.errorhandler(OpenAIError)
    async def openai_error(e: OpenAIError):
        return json_response(e.body(), e.status, e.headers)

    @app.errorhandler(HTTPException)
    async def http_error(e: HTTPException):
        status = e.code or 500
        if status >= 500:  # werkzeug's own 5xx would be a bug of ours; never hand them out as they are
            log.error("HTTP %d for %s %s: %s", status, request.method, request.path, e.description)
        err = OpenAIError(_http_message(e), status, "invalid_request_error", None, _HTTP_CODES.get(e.code))
        allow = getattr(e, "valid_methods", None) if status == 405 else None
        return json_response(err.body(), status, {"Allow": ", ".join(allow)} if allow else None)

    @app.errorhandler(Exception)
    async def any_error(e: Exception):
        log.exception("request failed")
        return json_response(server_error(f"internal error: {type(e).__name__}").body(), 500)


def _http_message(e: HTTPException) -> str:
    """What a client should read: for a 404, which path pyserve does not serve (not werkzeug's prose)."""
    if e.code == 404:
        return (f"{request.method} {request.path[:200]} is not supported by pyserve; see /openapi.json for the "
                f"endpoints it serves")
    return e.description or e.name


def _refuse_websockets(app: QuartTrio) -> None:
    """pyserve serves no WebSocket: a handshake is closed (Hypercorn answers 403) before Quart sees it. A
    client that sent garbage after its handshake has a connection Hypercorn already gave up on: the close
    then fails, and that failure is this connection's alone, so it is not raised into Hypercorn's log."""
    inner = app.asgi_app

    async def asgi_app(scope, receive, send):
        if scope["type"] != "websocket":
            return await inner(scope, receive, send)
        try:
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1008})
        except Exception as e:  # noqa: BLE001 - see above; Cancelled is not an Exception and passes
            log.info("websocket handshake from a client that broke it: %s", type(e).__name__)

    app.asgi_app = asgi_app


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
