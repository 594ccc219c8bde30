"""`pyserve serve`: Hypercorn (trio worker) around the app, the models it loads at start loaded while it
listens (the others on demand: model_registry.py), and a drain on SIGINT / SIGTERM.

Shutdown: the first signal answers /health and new requests 503 (a router in front takes the replica out of
rotation and retries those requests elsewhere); in-flight requests run on until they finish or the drain
deadline passes, then every remaining stream ends with an error chunk ("server shutting down") and [DONE];
the listener closes, the engine aborts what is left, and the process exits 0. A second signal skips the wait.
"""
from __future__ import annotations

import gc
import logging
import os
import signal
import sys
from dataclasses import dataclass, field
from functools import partial
from typing import Optional

if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from ..api.base.protocol import build_deferred
from ..engine.model_load import discard_early
from ..engine.options import EngineOptions
from .app import create_app
from .auth import load_keys
from .config import ServerConfig
from .http import connection
from .model_options import build_catalog

log = logging.getLogger("pyserve.server")
@dataclass
class ServeOptions:
    models: list = field(default_factory=list)  # each PATH or NAME=PATH; none (and no models_dir): the default
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: list = field(default_factory=list)  # the one model's name, then its aliases
    models_dir: Optional[str] = None
    models_config: Optional[str] = None
    max_loaded_models: int = 1  # 0: no bound
    models_memory: int = 0
    keep_alive: float = 0.0
    preload: list = field(default_factory=list)  # names loaded at start (one model given alone: it)
    chat_template: Optional[str] = None  # a file path
    api_key: Optional[str] = None
    api_keys: list = field(default_factory=list)
    api_key_file: Optional[str] = None
    metrics_require_key: bool = False
    allowed_origins: list = field(default_factory=list)
    rate_limit_rpm: int = 0
    rate_limit_tpm: int = 0
    max_waiting: int = 0
    max_queue_wait: float = 0.0
    max_body_size: int = 8 * 1024 * 1024
    body_timeout: float = 30.0
    keep_alive_timeout: float = 15.0
    drain_timeout: float = 30.0
    stalled_client_timeout: float = 30.0
    sse_keepalive: float = 10.0
    shared_prefix_cache: bool = False
    engine: EngineOptions = field(default_factory=EngineOptions.serving)  # every model's, unless its table says
    trust_request_chat_template: bool = False
    pooling: str = "last"
    normalize_embeddings: bool = True
    tool_call_parser: Optional[str] = None
    reasoning_parser: str = "auto"
    reasoning_budget: int = -1
    response_store_size: int = 1000
    response_store_ttl: float = 3600.0
    response_store_bytes: int = 256 << 20


def _app(opts: ServeOptions):
    template = None
    if opts.chat_template:
        with open(opts.chat_template, encoding="utf-8") as f:
            template = f.read()
    keys = load_keys(list(opts.api_keys) + ([opts.api_key] if opts.api_key else []), opts.api_key_file)
    if keys:
        log.info("API keys required (%d configured)", len(keys))
    names = list(opts.served_model_name)
    return create_app(None, ServerConfig(
        names[0] if names else None, template, None, api_keys=keys, metrics_require_key=opts.metrics_require_key,
        allowed_origins=list(opts.allowed_origins), rate_limit_rpm=opts.rate_limit_rpm,
        rate_limit_tpm=opts.rate_limit_tpm, max_waiting=opts.max_waiting, max_queue_wait=opts.max_queue_wait,
        max_body_size=opts.max_body_size, body_timeout=opts.body_timeout,
        stalled_client_timeout=opts.stalled_client_timeout, sse_keepalive=opts.sse_keepalive,
        shared_prefix_cache=opts.shared_prefix_cache,
        trust_request_chat_template=opts.trust_request_chat_template, pooling=opts.pooling,
        normalize_embeddings=opts.normalize_embeddings, tool_call_parser=opts.tool_call_parser,
        reasoning_parser=opts.reasoning_parser, reasoning_budget=opts.reasoning_budget,
        aliases=names[1:], max_loaded_models=opts.max_loaded_models,
        models_memory=opts.models_memory, keep_alive=opts.keep_alive,
        response_store_size=opts.response_store_size, response_store_ttl=opts.response_store_ttl,
        response_store_bytes=opts.response_store_bytes))


def _hypercorn_config(opts: ServeOptions, metrics, draining) -> HypercornConfig:
    hc = HypercornConfig()
    fault = os.environ.get("PYSERVE_FAULT_MARKER")  # tests only: see http/connection.py
    connection.configure(hc, metrics.connection_errors, fault.encode() if fault else None, draining)
    hc.bind = [f"[{opts.host}]:{opts.port}" if ":" in opts.host else f"{opts.host}:{opts.port}"]
    hc.graceful_timeout = opts.drain_timeout + 5.0
    hc.accesslog = None
    hc.errorlog = logging.getLogger("hypercorn.error")
    # A connection idle between requests (or dribbling its request headers) is closed after
    # keep_alive_timeout; a body slower than body_timeout gets 408 (Quart). Hypercorn's read_timeout stays
    # off: it would also cut a long SSE stream, during which the client sends nothing.
    hc.keep_alive_timeout = opts.keep_alive_timeout
    hc.h11_max_incomplete_size = 16 * 1024  # request line + headers
    hc.backlog = 1024
    return hc


class _Signals:
    """The first SIGINT / SIGTERM starts the drain (`stop`); a second skips its wait (`force`)."""

    def __init__(self, state, drain_timeout: float):
        self.state, self.drain_timeout = state, drain_timeout
        self.stop, self.force = trio.Event(), trio.Event()
        # the drain is over: Hypercorn stops listening. Not at `stop`: until then a router's health check must
        # read 503 (a refused connection would look like a crash) and new requests a 503 it retries elsewhere
        self.drained = trio.Event()

    async def run(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as sigs:
            task_status.started()
            async for signum in sigs:
                if self.stop.is_set():
                    self.force.set()
                    continue
                log.warning("%s: draining (up to %.0f s)", signal.Signals(signum).name, self.drain_timeout)
                self.state.stopping = True
                self.stop.set()


async def _drain(state, signals: _Signals, timeout: float) -> None:
    """In-flight requests run on until they end, the deadline passes or a second signal comes; then the rest
    end with an error chunk (the `draining` event) and get 2 s to write it."""
    inflight = state.metrics.inflight
    with trio.move_on_after(timeout):
        async with trio.open_nursery() as waiters:
            async def wait_force():
                await signals.force.wait()
                waiters.cancel_scope.cancel()

            waiters.start_soon(wait_force)
            await inflight.wait_idle()
            waiters.cancel_scope.cancel()
    if inflight.count:
        log.warning("drain deadline: ending %d in-flight request(s)", inflight.count)
    state.draining.set()
    with trio.move_on_after(2.0):
        await inflight.wait_idle()


async def _run_models(opts: ServeOptions, state, signals: _Signals, url: str, task_status) -> None:
    catalog = await trio.to_thread.run_sync(partial(build_catalog, list(opts.models), opts.models_dir,
                                                    opts.models_config, list(opts.served_model_name), opts.engine))
    names = catalog.names()
    preload = list(opts.preload) or (names if len(names) == 1 and not catalog.dynamic else [])
    state.serve_models(catalog, preload)
    async with state.models.running():  # on its way out every engine is closed, every abort applied
        await state.models.preload(preload)
        await trio.to_thread.run_sync(discard_early)  # cli.py's early load, if no load took it (a budget refused it)
        state.ready = True
        if not signals.stop.is_set():
            print(f"pyserve: serving {state.models.default or ','.join(names) or '-'} on {url}", flush=True)
            task_status.started(url)
        await build_deferred()
        await signals.stop.wait()
        await _drain(state, signals, opts.drain_timeout)
        signals.drained.set()


async def serve(opts: ServeOptions, task_status=trio.TASK_STATUS_IGNORED) -> int:
    app = _app(opts)
    state = app.pyserve
    signals = _Signals(state, opts.drain_timeout)
    code = 0
    async with trio.open_nursery() as nursery:
        await nursery.start(signals.run)
        connection.install()
        binds = await nursery.start(partial(hypercorn_serve, app,
                                            _hypercorn_config(opts, state.metrics, signals.stop.is_set),
                                            shutdown_trigger=signals.drained.wait))
        url = binds[0] if binds else f"http://{opts.host}:{opts.port}"
        try:
            await _run_models(opts, state, signals, url, task_status)
        except (ValueError, FileNotFoundError, OSError) as e:
            print(f"pyserve: error: {e}", file=sys.stderr, flush=True)
            code = 2
            signals.stop.set()
            signals.drained.set()
        # hypercorn returns once its connections close (bounded by graceful_timeout)
        with trio.move_on_after(3.0):
            while len(nursery.child_tasks) > 1:
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    log.info("pyserve: stopped")
    return code


def _ignore_late_signals() -> None:
    """The drain is over and the signal receiver gone: a second SIGTERM now (a supervisor repeating itself)
    must not turn the exit code 0 of a clean shutdown into death by signal."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def run(opts: ServeOptions) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)

    async def serve_then_ignore() -> int:
        try:
            return await serve(opts)
        finally:
            _ignore_late_signals()

    # The modules imported so far live as long as the process: out of the collector's passes (gc.freeze), so a
    # collection walks only what came after -- the one that gives a load's memory back took ~30 ms under the
    # GIL just as the server became ready, and delayed its first /health 200 by as much. The collector is
    # (re-)enabled here: cli.py's serve turns it off for the imports.
    gc.freeze()
    gc.enable()
    try:
        return trio.run(serve_then_ignore)
    except BaseException as e:  # noqa: BLE001 - unwrap a lone error from trio's exception groups
        leaf = e
        while isinstance(leaf, BaseExceptionGroup) and len(leaf.exceptions) == 1:
            leaf = leaf.exceptions[0]
        if isinstance(leaf, (OSError, ValueError)):
            print(f"pyserve: error: {leaf}", file=sys.stderr, flush=True)
            return 2
        if isinstance(leaf, KeyboardInterrupt):
            return 130
        raise
