"""The ASGI app (Quart-Trio): `create_app(engine, config)` builds it around an open AsyncLLM.

`engine` may be None and set later with `app.pyserve.set_engine(engine)`, or the models given as a Catalog
with `app.pyserve.serve_models(catalog, preload)` (`pyserve serve`: loaded on demand by the ModelRegistry,
model_registry.py): the server listens while the models load, and /health answers 503 till then. Each
request's model is chosen by its `model` field; the request holds a lease on it until its last byte.
Layers: the edge (edge.py) runs before every route; routes (routes/, a module per endpoint family) parse,
hand the serving layer what it needs, and wrap what it returns; errors of any layer become OpenAI's error
JSON here, once.
"""
from __future__ import annotations

import logging
from functools import cached_property
from typing import Optional

import trio
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from ..api.base.context import RequestContext
from ..api.base.errors import OpenAIError, loading, server_error
from ..api.base.served_model import ServedModel
from ..api.chat.serving import ChatServing
from ..api.completions.serving import CompletionServing
from ..api.messages.errors import anthropic_body, wants_anthropic
from ..api.pooling.embeddings import EmbeddingServing
from ..api.responses.jobs import BackgroundJobs
from ..api.responses.store import ResponseStore
from ..api.tokens.serving import TokenServing
from .config import ServerConfig
from .edge import Edge
from .http.response import json_response
from .metrics import TIMER_KEY, Metrics, instrument
from .model_catalog import Catalog, ModelSpec
from .model_registry import ModelLimits, ModelRegistry
from .routes import add_routes

log = logging.getLogger("pyserve.server")
LEASES_KEY = "pyserve.leases"  # the request's model leases in the ASGI scope, released after its last byte
_HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 408: "request_timeout", 413: "request_too_large",
               415: "unsupported_media_type"}

__all__ = ["create_app", "ServerConfig"]


class Serving:
    """The serving objects of one loaded model. Those of the APIs fewer clients speak (rerank, infill) are made
    at their first request, their modules imported then: not at start-up (see routes/__init__.py)."""

    def __init__(self, model: ServedModel):
        self.model = model
        self.chat = ChatServing(model)
        self.completions = CompletionServing(model)
        self.tokens = TokenServing(model, self.chat)
        self.embeddings = EmbeddingServing(model)

    @cached_property
    def rerank(self):
        from ..api.pooling.rerank import RerankServing

        return RerankServing(self.model)

    @cached_property
    def infill(self):
        from ..api.infill.serving import InfillServing

        return InfillServing(self.model)


class AppState:
    """The app's state: the config, the models (the registry), the edge, the metrics, the drain."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.metrics = Metrics()
        self.edge = Edge(config, self.metrics,
                         lambda: sum(s.model.max_num_seqs for s in self.models.ready_models) or 64)
        self.models = ModelRegistry(self.metrics, self._serving_for, ModelLimits(
            config.max_loaded_models, config.models_memory, config.max_queue_wait, config.keep_alive))
        self.ready = False  # the models to load at start are loaded
        self.draining = trio.Event()  # set at the drain deadline: in-flight responses end
        self.responses = ResponseStore(config.response_store_size, config.response_store_ttl,
                                       config.response_store_bytes)
        self.background = BackgroundJobs()  # the running background responses (their tasks: the app's nursery)

    def _serving_for(self, engine, spec: Optional[ModelSpec]) -> Serving:
        """An open engine's Serving (a worker thread may build it: reading the vocabulary takes a while)."""
        c = self.config
        name, aliases = (spec.name, spec.aliases) if spec else (c.served_model_name, tuple(c.aliases))
        template = spec.chat_template if spec and spec.chat_template is not None else c.chat_template
        return Serving(ServedModel.from_engine(engine, name, template, c.trust_request_chat_template, c.pooling,
                                               c.normalize_embeddings, c.tool_call_parser, aliases,
                                               c.reasoning_parser, c.reasoning_budget))

    def set_engine(self, engine) -> None:
        """Serves an engine the caller opened (and closes), as the one model."""
        serving = self._serving_for(engine, None)
        self.metrics.model_name = serving.model.name
        self.models.add_open(serving)
        self.ready = True

    def serve_models(self, catalog: Catalog, preload: list[str]) -> None:
        """Serves the catalog's models (the registry's `running` block loads them); one model given alone is
        the default of requests that name none, and the label of the server-wide series."""
        names = catalog.names()
        single = len(names) == 1 and not catalog.dynamic
        self.metrics.model_name = names[0] if single else ""
        self.models.serve(catalog, names[0] if single else (catalog.resolve(preload[0]) if preload else None))

    async def lease(self, name: Optional[str]):
        """A lease on the model `name` answers to (None: the default) that the caller releases."""
        if not self.ready:
            raise loading()
        return await self.models.acquire(name)

    async def serving(self, name: Optional[str]) -> Serving:
        """The Serving of the model `name` answers to (None: the default), leased until the request ends."""
        lease = await self.lease(name)
        request.scope[LEASES_KEY].append(lease)
        timer = request.scope.get(TIMER_KEY)
        if timer is not None:
            timer.model = lease.serving.model.name
        return lease.serving

    async def model_cards(self) -> list:
        """/v1/models: every model, loaded or not."""
        if not self.ready:
            raise loading()
        return await self.models.cards()

    async def model_card(self, name: str):
        if not self.ready:
            raise loading()
        return await self.models.card(name)

    def context(self) -> RequestContext:
        return self.edge.context(request, self.draining)

    @property
    def loaded(self) -> Optional[Serving]:
        """The default model's Serving while it is loaded."""
        return self.models.loaded(None) if self.models.default else None

    @property
    def served_model_name(self) -> str:
        return self.models.default or self.config.served_model_name or "pyserve"

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
    _hold_leases(app)
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
        return json_response(_error_body(e), e.status, e.headers)

    @app.errorhandler(HTTPException)
    async def http_error(e: HTTPException):
        status = e.code or 500
        if status >= 500:  # werkzeug's own 5xx would be a bug of ours; never hand them out as they are
            log.error("HTTP %d for %s %s: %s", status, request.method, request.path, e.description)
        err = OpenAIError(_http_message(e), status, "invalid_request_error", None, _HTTP_CODES.get(e.code))
        allow = getattr(e, "valid_methods", None) if status == 405 else None
        return json_response(_error_body(err), status, {"Allow": ", ".join(allow)} if allow else None)

    @app.errorhandler(Exception)
    async def any_error(e: Exception):
        log.exception("request failed")
        return json_response(_error_body(server_error(f"internal error: {type(e).__name__}")), 500)


def _error_body(e: OpenAIError) -> dict:
    """The error in the shape of the API the path belongs to: Anthropic's on /v1/messages, else OpenAI's."""
    return anthropic_body(e) if wants_anthropic(request.path) else e.body()


def _http_message(e: HTTPException) -> str:
    """What a client should read: for a 404, which path pyserve does not serve (not werkzeug's prose)."""
    if e.code == 404:
        return (f"{request.method} {request.path[:200]} is not supported by pyserve; see /openapi.json for the "
                f"endpoints it serves")
    return e.description or e.name


def _hold_leases(app: QuartTrio) -> None:
    """A request's model leases (AppState.serving) are released when its ASGI call returns: after the last
    body write of a stream, or when it is cancelled (a client gone)."""
    inner = app.asgi_app

    async def asgi_app(scope, receive, send):
        if scope["type"] != "http":
            return await inner(scope, receive, send)
        leases = scope[LEASES_KEY] = []
        try:
            return await inner(scope, receive, send)
        finally:
            for lease in leases:
                lease.release()

    app.asgi_app = asgi_app


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
