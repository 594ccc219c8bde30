"""ModelRegistry: the models a server serves (a Catalog) and the ones loaded now, each an open AsyncLLM with
its Serving, held by a task of the registry's own nursery (`running`).

`acquire(name)` returns a Lease on the model's Serving, which the request holds to its last byte: a model with
leases is never unloaded under them. A model not loaded is loaded first, off the event loop (the engine's
load releases the GIL; the Serving's tables are built in the same worker thread), while requests to the
others go on. Requests for a model being loaded wait for it (the wait counts in their TTFT and queue time).

The budget: at most `max_loaded` models (0: no bound) and `memory` bytes (0: no bound; a model counts its
file plus its KV pool, what it may hold at most). A model that does not fit makes room: the least recently
used loaded model is retired — idle ones first; a busy one takes no new leases, finishes what it serves,
then goes (so two models asked for in turn alternate instead of one starving the other). Past `max_wait`
seconds (0: no bound) of waiting for room the request gets 503 with Retry-After. `keep_alive` seconds
(0: never) unloads a model idle that long.

A model that fails to load (a bad file, an architecture the engine lacks, no memory) is remembered with its
error until its file changes: its requests get 500 `model_unavailable` naming the model and the reason, and
the other models serve on. After an unload the memory is handed back to the system (malloc_trim): glibc
keeps freed heap pages otherwise.
"""
from __future__ import annotations

import ctypes
import gc
import logging
import math
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import AsyncIterator, Callable, Optional

import trio
from prometheus_client import Counter, Gauge, Histogram

from ..api.base.errors import OpenAIError, bad_request, model_not_found
from ..api.base.replies import ModelCard
from ..engine.async_llm import AsyncLLM
from .model_catalog import Catalog, ModelSpec

log = logging.getLogger("pyserve.server")

LOADING, READY, RETIRING, UNLOADING = "loading", "ready", "retiring", "unloading"


@dataclass
class ModelLimits:
    max_loaded: int = 1  # models loaded at once (0: no bound)
    memory: int = 0  # bytes all loaded models may hold (0: no bound)
    max_wait: float = 0.0  # seconds a request may wait for room (0: no bound)
    keep_alive: float = 0.0  # seconds a model may stay loaded unused (0: for ever)


class _Model:
    """One model while it holds (or is about to hold) an engine."""

    def __init__(self, spec: ModelSpec, memory: int, signature, pinned: bool = False):
        self.spec, self.memory, self.signature, self.pinned = spec, memory, signature, pinned
        self.state = LOADING
        self.engine: Optional[AsyncLLM] = None
        self.serving = None
        self.leases = 0
        self.waiters = 0  # requests waiting for its load: it is not retired before they have their leases
        self.last_used = trio.current_time() if not pinned else 0.0
        self.reason = "shutdown"  # why it is unloaded
        self.done = trio.Event()  # the load ended (READY, or failed)
        self.unload = trio.Event()  # set: its task closes the engine (no lease is held)


class Lease:
    """A request's hold on a loaded model's Serving; `release` once the response is over (idempotent)."""

    __slots__ = ("serving", "_model", "_registry")

    def __init__(self, registry: "ModelRegistry", model: _Model):
        self.serving, self._model, self._registry = model.serving, model, registry

    def release(self) -> None:
        if self._model is not None:
            self._registry._release(self._model)
            self._model = self.serving = None  # a request's scope may outlive it: it must not hold the engine


class ModelRegistry:
    def __init__(self, metrics, build: Callable[[AsyncLLM, ModelSpec], object], limits: ModelLimits):
        self.metrics, self.limits = metrics, limits
        self._build = build  # (open engine, spec) → its Serving; runs in a worker thread
        self.catalog: Optional[Catalog] = None
        self.default: Optional[str] = None  # the model of a request that names none
        self._models: dict[str, _Model] = {}
        self._pinned: dict[str, str] = {}  # names and aliases of engines opened by the caller → model name
        self._failures: dict[str, tuple] = {}  # model name → (file signature, the load's exception)
        self._changed = trio.Event()
        self._nursery: Optional[trio.Nursery] = None
        self._refreshing = trio.Lock()
        r, ml = metrics.registry, ["model_name"]
        self._loads = Counter("pyserve:model_loads", "models loaded", ml, registry=r)
        self._unloads = Counter("pyserve:model_unloads", "models unloaded, counted once their memory is handed "
                                "back, by reason (evicted: room for another; idle: --keep-alive; removed or "
                                "changed: its file)", ml + ["reason"], registry=r)
        self._load_failures = Counter("pyserve:model_load_failures", "model loads that failed", ml, registry=r)
        self._load_time = Histogram("pyserve:model_load_seconds", "time to load a model", ml, registry=r,
                                    buckets=(0.1, 0.25, 0.5, 1, 2, 4, 8, 16, 32, 64, 128))
        self._loaded = Gauge("pyserve:model_loaded", "1 while the model is loaded", ml, registry=r)

    # ---- setup ----

    def add_open(self, serving) -> None:
        """An engine the caller opened (and closes): served for good, never unloaded."""
        model = serving.model
        m = _Model(ModelSpec(model.name, model.engine.model_path, model.aliases), 0, None, pinned=True)
        m.serving, m.state = serving, READY
        m.done.set()
        self._models[model.name] = m
        self._pinned.update((n, model.name) for n in (model.name, *model.aliases))
        self.default = self.default or model.name
        self.metrics.serve_model(model.name, model.engine.stats)

    def serve(self, catalog: Catalog, default: Optional[str]) -> None:
        self.catalog, self.default = catalog, default

    @asynccontextmanager
    async def running(self) -> AsyncIterator["ModelRegistry"]:
        """Loads and unloads happen in this block; on its exit every engine it opened is closed."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            if self.limits.keep_alive > 0:
                nursery.start_soon(self._expire_idle)
            try:
                yield self
            finally:
                nursery.cancel_scope.cancel()

    async def preload(self, names: list[str]) -> None:
        """Loads each (at start); raises ValueError (or the load's own error) if one cannot be served."""
        if self.limits.max_loaded and len(names) > self.limits.max_loaded:
            raise ValueError(f"--preload names {len(names)} models; --max-loaded-models is {self.limits.max_loaded}")
        for name in names:
            try:
                (await self.acquire(name)).release()
            except OpenAIError as e:
                key = self.catalog.resolve(name)
                failure = self._failures.get(key) if key else None
                if failure and isinstance(failure[1], (ValueError, OSError)):
                    raise failure[1] from None  # as a model that fails to load at start always said
                raise ValueError(self._unavailable_reason(key) if key else e.message) from None

    # ---- requests ----

    async def acquire(self, name: Optional[str]) -> Lease:
        """A lease on the model `name` answers to (None: the default model), loaded first if need be."""
        key = await self._resolve(name)
        deadline = math.inf if not self.limits.max_wait else trio.current_time() + self.limits.max_wait
        while True:
            m = self._models.get(key)
            if m is not None and m.state == READY:
                return self._lease(m)
            if m is not None and m.state == LOADING:
                m.waiters += 1
                try:
                    await m.done.wait()
                finally:
                    m.waiters -= 1
                continue
            if m is None:
                if await self._check_available(key):
                    continue  # its file was read again: look again
                if self._make_room(key):
                    self._start(key)
                    continue
            changed = self._changed
            with trio.move_on_at(deadline if m is None else math.inf):
                await changed.wait()
                continue
            raise self._busy(key)

    def _lease(self, m: _Model) -> Lease:
        m.leases += 1
        m.last_used = trio.current_time()
        return Lease(self, m)

    def _release(self, m: _Model) -> None:
        m.leases -= 1
        m.last_used = trio.current_time()
        if m.leases == 0:
            if m.state == RETIRING:
                self._unload(m)
            self._notify()

    async def _resolve(self, name: Optional[str]) -> str:
        if name is None:
            if self.default is None:
                raise bad_request("'model' is required: this server serves several models (GET /v1/models "
                                  "lists them)", param="model")
            return self.default
        key = self._lookup(name)
        if key is None and self.catalog is not None and self.catalog.dynamic:
            await self.refresh()
            key = self._lookup(name)
        if key is None:
            raise model_not_found(name)
        return key

    def _lookup(self, name: str) -> Optional[str]:
        return self._pinned.get(name) or (self.catalog.resolve(name) if self.catalog is not None else None)

    async def _check_available(self, key: str) -> bool:
        """Raises the error of a model that cannot be loaded, after reading its file again (it may have been
        fixed: then True)."""
        if not self._unavailable_reason(key):
            return False
        await self.refresh()
        reason = self._unavailable_reason(key)
        if reason:
            raise OpenAIError(f"The model `{key}` is unavailable: {reason}", 500, "server_error", "model",
                              "model_unavailable")
        return True

    def _unavailable_reason(self, key: str) -> str:
        """Why the model cannot be loaded ("" if it may be): its file, its last load (until the file
        changes), or the memory budget."""
        facts = self.catalog.facts(key)
        failure = self._failures.get(key)
        if failure and failure[0] != facts.signature:
            del self._failures[key]
            failure = None
        if facts.error or failure:
            return facts.error or _reason(failure[1])
        if self.limits.memory and facts.memory > self.limits.memory:
            return (f"it needs up to {facts.memory >> 20} MiB (file and KV cache), more than --models-memory "
                    f"({self.limits.memory >> 20} MiB)")
        return ""

    def _busy(self, key: str) -> OpenAIError:
        busy = [n for n, m in self._models.items() if m.state != UNLOADING]
        err = OpenAIError(f"The model `{key}` cannot be loaded now: the models loaded ({', '.join(busy)}) are "
                          f"busy; try again later", 503, "server_error", "model", "model_busy")
        err.headers["Retry-After"] = str(max(1, math.ceil(self.limits.max_wait)))
        return err

    # ---- the budget ----

    def _fits(self, models: list[_Model], need: int) -> bool:
        lim = self.limits
        return ((not lim.max_loaded or len(models) < lim.max_loaded)
                and (not lim.memory or sum(m.memory for m in models) + need <= lim.memory))

    def _make_room(self, key: str) -> bool:
        """True if `key` fits now; else retires what must go for it (when nothing already going will do)."""
        need = self.catalog.facts(key).memory
        present = list(self._models.values())
        if self._fits(present, need):
            return True
        staying = [m for m in present if m.state in (LOADING, READY)]
        if self._fits(staying, need):
            return False  # the ones leaving make room: wait for them
        candidates = [m for m in staying if m.state == READY and not m.pinned and not m.waiters]
        if candidates:
            self._retire(min(candidates, key=lambda m: (m.leases > 0, m.last_used)), "evicted")
        return False

    def _retire(self, m: _Model, reason: str) -> None:
        """No new leases; unloaded once the last one is released."""
        m.state, m.reason = RETIRING, reason
        if m.leases == 0:
            self._unload(m)

    def _unload(self, m: _Model) -> None:
        m.state = UNLOADING
        m.unload.set()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _expire_idle(self) -> None:
        while True:
            changed, now, wake = self._changed, trio.current_time(), math.inf
            for m in list(self._models.values()):
                if m.state != READY or m.pinned or m.leases or m.waiters:
                    continue
                if now - m.last_used >= self.limits.keep_alive:
                    self._retire(m, "idle")
                else:
                    wake = min(wake, m.last_used + self.limits.keep_alive)
            with trio.move_on_at(wake):
                await changed.wait()

    # ---- loading and unloading ----

    def _start(self, key: str) -> None:
        facts = self.catalog.facts(key)
        m = self._models[key] = _Model(self.catalog.spec(key), facts.memory, facts.signature)
        self._nursery.start_soon(self._hold, m)

    async def _hold(self, m: _Model) -> None:
        """The model's life: load, serve until told to unload, close; the memory handed back."""
        name, t0 = m.spec.name, trio.current_time()
        try:
            await self._serve(m, t0)
        except Exception as e:  # noqa: BLE001 - a load that failed: remembered, answered to its requests
            log.warning("model %s failed to load: %s", name, _reason(e))
            self._failures[name] = (m.signature, e.with_traceback(None))  # its frames would hold the engine
            self._load_failures.labels(name).inc()
        finally:
            if m.engine is not None:  # stopped, every abort applied: what it still holds is a leak
                s = m.engine.stats()
                log.info("model %s: engine stopped: %d running, %d waiting, %d kv blocks in use", name,
                         s["running"], s["waiting"], s["blocks_used"])
                m.engine = None
            del self._models[name]
            self._loaded.labels(name).set(0)
            m.serving = None
            m.done.set()
            self._notify()
        await trio.to_thread.run_sync(_give_back_memory)
        if m.state != LOADING:  # counted once its memory is back (a shutdown does not get here)
            self._unloads.labels(name, m.reason).inc()
            log.info("model %s unloaded (%s)", name, m.reason)

    async def _serve(self, m: _Model, t0: float) -> None:
        name = m.spec.name
        async with AsyncLLM.open(m.spec.path, options=self.catalog.options(m.spec)) as engine:
            m.engine = engine
            t_open = trio.current_time()
            m.serving = await trio.to_thread.run_sync(self._build, engine, m.spec)
            t_built = trio.current_time()
            self.metrics.serve_model(name, engine.stats)
            m.state, m.last_used = READY, trio.current_time()
            m.done.set()
            self._notify()
            # what the load built and dropped (tables, copies), once the model serves: not before readiness
            # (a collection of the whole heap just after the server's imports holds the GIL ~30 ms)
            await trio.to_thread.run_sync(_give_back_memory)
            self._loads.labels(name).inc()
            self._loaded.labels(name).set(1)
            self._load_time.labels(name).observe(trio.current_time() - t0)
            log.info("model %s loaded in %.2f s (%s; open %.2f s, serving tables %.2f s)", name,
                     trio.current_time() - t0, engine.load_summary(), t_open - t0, t_built - t_open)
            try:
                await m.unload.wait()
            finally:
                self.metrics.unserve_model(name)
                m.serving = None

    async def refresh(self) -> None:
        """The catalog read again (off the event loop); loaded models whose file went or changed retire."""
        if self.catalog is None:
            return
        async with self._refreshing:
            await trio.to_thread.run_sync(self.catalog.refresh)
        for name, m in list(self._models.items()):
            if m.pinned or m.state != READY:
                continue
            if self.catalog.spec(name) is None:
                self._retire(m, "removed")
            elif self.catalog.facts(name).signature != m.signature:
                self._retire(m, "changed")

    # ---- what it serves ----

    @property
    def ready_models(self) -> list:
        return [m.serving for m in self._models.values() if m.state == READY]

    def loaded(self, name: Optional[str]) -> Optional[object]:
        """The Serving of the model `name` answers to, if it is loaded now (None: the default model)."""
        key = self.default if name is None else self._lookup(name)
        m = self._models.get(key) if key else None
        return m.serving if m is not None and m.state in (READY, RETIRING) else None

    async def cards(self) -> list[ModelCard]:
        """A card per name of every model, loaded or not (the catalog read again first)."""
        await self.refresh()
        keys = list(dict.fromkeys([*self._pinned.values(), *(self.catalog.names() if self.catalog else [])]))
        return [card for key in keys for card in self._cards(key)]

    async def card(self, name: str) -> ModelCard:
        key = await self._resolve(name)
        return next(c for c in self._cards(key) if c.id == name)

    def _cards(self, key: str) -> list[ModelCard]:
        """status: "loaded", "loading", "unloading", "available" (loaded on its first request) or
        "unavailable" (with the error its requests get)."""
        m = self._models.get(key)
        serving = m.serving if m is not None and m.state in (READY, RETIRING) else None
        spec = m.spec if m is not None else self.catalog.spec(key)
        fields = {"root": key, "loaded": serving is not None}
        if serving is not None:
            fields.update(created=serving.model.created, max_model_len=serving.model.max_model_len, status="loaded",
                          architecture=serving.model.engine.hparams["arch"])
        else:
            facts = self.catalog.facts(key)
            fields.update(created=facts.created, max_model_len=facts.max_model_len, architecture=facts.architecture,
                          status=m.state if m is not None else "available")
            error = self._unavailable_reason(key) if m is None else ""
            if error:
                fields.update(status="unavailable", error=error)
        return [ModelCard(id=n, object="model", owned_by="pyserve", **fields) for n in (key, *spec.aliases)]


def _reason(e: BaseException) -> str:
    return str(e) or type(e).__name__


def _give_back_memory() -> None:
    """Freed memory back to the system: what the collector frees, then glibc's free lists. Without
    malloc_trim the process keeps the heap it once needed: a Gemma 3 270M load left +140 to +240 MiB after
    its unload, and +95 MiB of the load's own temporaries while loaded."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to trim
        pass
