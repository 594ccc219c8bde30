"""AsyncLLM: the engine's async face, for trio.

The engine steps on its own native thread (EngineLoop). After each step it writes an eventfd once; one
router task here waits on that fd, drains every output of the step in one call, turns tokens into text
(detokenizer, stop strings) and merges each request's delta into that request's stream. A stream holds
at most one merged, undelivered delta, so a slow consumer never stalls the engine or the router.

Cancelling a consumer (a cancel scope, an exception, closing the async generator) aborts its engine
request in the generator's own `finally`. That `finally` may run inside an already-cancelled scope, so
the abort is a synchronous, thread-safe enqueue: no await. (A generator abandoned at a `yield` — the
consumer raised or was cancelled in its own code — is closed by trio's async-generator finalizer, which
runs the same `finally`.)

`n > 1` is one engine request: the prompt is prefilled once and forked into n samples sharing its KV blocks
(the engine's copy-on-write fork); each sample has its own detokenizer and stop strings here, and its deltas
carry `index`.

`prompt_logprobs` (SamplingParams) are computed once per request, in its prefill, and reach the consumer on
each sample's first StreamOutput. `embed` is an engine request too (prefill only, batched with generation):
its one output carries the vector, handed to the awaiting caller through an `_EmbedWait`.

Each `generate` or `embed` call gets an engine-side id of its own (`<request_id>#<n>`), so a stale output of an
earlier request with the same user id (say, the "abort" after a stop-string match) can never reach a
newer stream.
"""
from __future__ import annotations

import itertools
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, AsyncIterator, Optional

import trio

from .. import _engine
from .engine_request import EngineRequest, PromptType, prompt_ids
from .output_processor import Delta, PromptProgress, RequestState
from .sampling_params import SamplingParams
from .structured import StructuredOutputsParams

if TYPE_CHECKING:  # numpy is imported where a vector is made: a server that makes none does not pay 35 ms
    import numpy as np

# Upper bound on the synchronous steps run at shutdown to apply the last aborts (one step is enough when
# every live request has been aborted; the bound only guards against a request nobody aborted).
_SHUTDOWN_STEPS = 64


@dataclass
class StreamOutput:
    request_id: str
    prompt_token_ids: list[int]
    text_delta: str = ""
    token_ids_delta: list[int] = field(default_factory=list)
    logprobs_delta: Optional[list[dict[int, float]]] = None
    finish_reason: Optional[str] = None
    # engine timestamps (time.monotonic() seconds, 0 while unknown): the step that first scheduled the request,
    # the forward passes that produced this sample's first and its latest token
    scheduled_ts: float = 0.0
    first_token_ts: float = 0.0
    last_token_ts: float = 0.0
    cached_tokens: int = 0  # prompt tokens the prefix cache served
    index: int = 0  # the sample (0 … n-1)
    # SamplingParams.prompt_logprobs set, on each sample's first output only: per prompt token, None for the
    # first, else {prompt token: logprob, then its top alternatives} (the n samples share one list)
    prompt_logprobs: Optional[list[Optional[dict[int, float]]]] = None
    stop_reason: Optional[str] = None  # on the final output: the stop string that ended it (vLLM's)
    # SamplingParams.return_progress: the prompt's progress, on the outputs of steps that computed part of it
    # (such an output may carry no token)
    prompt_progress: Optional[PromptProgress] = None


class _Sample:
    """One sample's text state and its undelivered, merged delta."""

    __slots__ = ("state", "pending", "texts", "closed", "first_token_ts", "last_token_ts", "prompt_logprobs_sent")

    def __init__(self, state: RequestState):
        self.state = state
        self.pending: Optional[Delta] = None
        self.texts: list[str] = []  # text of deltas merged into `pending` after its own
        self.closed = False  # its final delta has been pushed
        self.first_token_ts = self.last_token_ts = 0.0
        self.prompt_logprobs_sent = False

    def push(self, d: Delta) -> None:
        if d.finish_reason:
            self.closed = True
        p = self.pending
        if p is None:
            self.pending = d
            return
        if d.text:  # merged in place; text pieces are joined once, in take() (a long backlog stays linear)
            self.texts.append(d.text)
        p.token_ids += d.token_ids
        if d.logprobs is not None:
            p.logprobs = d.logprobs if p.logprobs is None else p.logprobs + d.logprobs
        p.finish_reason = d.finish_reason or p.finish_reason
        p.stop_reason = d.stop_reason or p.stop_reason
        p.progress = d.progress or p.progress

    def take(self) -> Delta:
        d, self.pending = self.pending, None
        if self.texts:
            d.text = "".join([d.text, *self.texts])
            self.texts = []
        return d


class RequestStream:
    """One engine request's channel from the router to its consumer: n samples, each with at most one
    merged, undelivered delta.

    At most one task waits on a stream (its generator's), so a bare park/unpark stands in for trio.Event:
    the hand-off is on every token's path."""

    __slots__ = ("request_id", "samples", "ready", "open", "_waiter", "scheduled_ts", "cached_tokens",
                 "prompt_logprobs")

    def __init__(self, request_id: str, states: list[RequestState]):
        self.request_id = request_id
        self.samples = [_Sample(s) for s in states]
        self.ready: list[int] = []  # samples with a pending delta, in arrival order
        self.open = len(states)  # samples whose final delta has not been pushed
        self._waiter = None  # the task parked in get(), if any
        self.scheduled_ts = 0.0
        self.cached_tokens = 0
        self.prompt_logprobs: Optional[list] = None  # from the engine's first output of the request

    @property
    def closed(self) -> bool:
        """Every sample's final delta has been pushed: the router routes nothing more here."""
        return self.open == 0

    @property
    def finished(self) -> bool:
        """The consumer has been handed every sample's final delta."""
        return self.open == 0 and not self.ready

    def push(self, index: int, d: Delta) -> None:
        s = self.samples[index]
        if s.pending is None:
            self.ready.append(index)
        if d.finish_reason and not s.closed:
            self.open -= 1
        s.push(d)
        if self._waiter is not None:
            task, self._waiter = self._waiter, None
            trio.lowlevel.reschedule(task)

    def _abort_wait(self, _raise_cancel) -> trio.lowlevel.Abort:
        self._waiter = None
        return trio.lowlevel.Abort.SUCCEEDED

    async def get(self) -> list[tuple[int, Delta]]:
        """Every pending (sample index, delta), oldest first; waits while there is none."""
        if not self.ready:
            self._waiter = trio.lowlevel.current_task()
            await trio.lowlevel.wait_task_rescheduled(self._abort_wait)  # raises Cancelled if cancelled
        else:
            await trio.lowlevel.checkpoint_if_cancelled()
        ready, self.ready = self.ready, []
        return [(i, self.samples[i].take()) for i in ready]


class _EmbedWait:
    """One embed() call's hand-off: the router sets the vector (or the reason it ended without one)."""

    __slots__ = ("done", "vector", "reason")

    def __init__(self):
        self.done = trio.Event()
        self.vector: Optional[np.ndarray] = None
        self.reason = ""

    def end(self, vector: Optional[np.ndarray], reason: str) -> None:
        if not self.done.is_set():
            self.vector, self.reason = vector, reason
            self.done.set()


class AsyncLLM:
    """Use `async with AsyncLLM.open(model=None, **engine_options) as engine:` — see LLM for the options."""

    def __init__(self, llm):
        self.llm = llm
        self.tokenizer = llm.tokenizer
        self.loop = _engine.EngineLoop(llm.engine)
        self._streams: dict[str, RequestStream] = {}  # engine id → stream
        self._embeds: dict[str, _EmbedWait] = {}       # engine id → an embed() call's wait
        self._active: dict[str, str] = {}             # user request id → engine id
        self._ids = itertools.count()
        self._closed = False

    @classmethod
    @asynccontextmanager
    async def open(cls, model=None, **engine_options) -> AsyncIterator["AsyncLLM"]:
        """`model`: a GGUF path, None for the default model, or an already loaded LLM (then shared: its engine
        must not be stepped elsewhere while this is open, and engine_options must be empty)."""
        from .llm import LLM

        if isinstance(model, LLM):
            if engine_options:
                raise TypeError("engine options apply to a model this loads, not to a given LLM")
            llm = model
        else:
            llm = await trio.to_thread.run_sync(lambda: LLM(model, **engine_options))
        self = cls(llm)
        async with trio.open_nursery() as nursery:
            await nursery.start(self._route)
            self.loop.start()
            try:
                yield self
            finally:
                nursery.cancel_scope.cancel()
                with trio.CancelScope(shield=True):
                    await self._shutdown()

    async def _shutdown(self) -> None:
        """Aborts every live request, ends its stream ("abort"), stops the engine thread and applies the
        aborts so every block is back in the pool, then saves the cached blocks to the disk tier if there is one
        (the next start finds them). Runs shielded: the caller may be cancelled."""
        self._closed = True
        self.abort_all()
        for stream in list(self._streams.values()):
            for i, sample in enumerate(stream.samples):
                if not sample.closed:
                    stream.push(i, Delta(finish_reason="abort"))  # wakes a consumer still waiting elsewhere
        for wait in self._embeds.values():
            wait.end(None, "abort")
        engine = self.llm.engine

        def stop_and_settle() -> None:
            self.loop.stop()
            for _ in range(_SHUTDOWN_STEPS):
                if not engine.has_work():
                    break
                engine.step()
            engine.persist_kv_cache()

        await trio.to_thread.run_sync(stop_and_settle)

    def load_summary(self) -> str:
        """LLM.load_summary: the load's phases, for a log line."""
        return self.llm.load_summary()

    def stats(self) -> dict:
        """The engine's counters (running, waiting, blocks_total, blocks_used, preemptions, steps,
        tokens_computed) as of its last step, plus `streams`: generate() and embed() calls not yet finished here."""
        s = self.llm.engine.stats()
        s["streams"] = len(self._streams) + len(self._embeds)
        return s

    def abort(self, request_id: str) -> None:
        """Aborts a request by its user id (thread-safe enqueue); its stream ends with finish_reason "abort" (an
        embed() call raises RuntimeError)."""
        eid = self._active.get(request_id)
        if eid is not None:
            self.loop.abort(eid)

    def abort_all(self) -> None:
        for eid in [*self._streams, *self._embeds]:
            self.loop.abort(eid)

    async def _route(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        fd = self.loop.fd
        drain = self.loop.drain
        while True:
            await trio.lowlevel.wait_readable(fd)
            for out in drain():
                self._deliver(out)

    def _deliver(self, o) -> None:
        """One engine output (a StepOutput) into its stream: text made, stop strings applied, merged into the
        sample's delta (an embedding's: to its waiting embed() call)."""
        eid, index, reason = o.request_id, o.index, o.finish_reason
        wait = self._embeds.get(eid)
        if wait is not None:
            wait.end(o.embedding, reason)
            return
        stream = self._streams.get(eid)
        if stream is None or stream.samples[index].closed:
            return  # a finished or abandoned stream; stale outputs after a stop-string abort
        stream.scheduled_ts = o.scheduled_ts
        stream.cached_tokens = o.n_cached
        plp = o.prompt_logprobs
        if plp is not None:
            stream.prompt_logprobs = plp
        sample = stream.samples[index]
        if o.progress:
            stream.push(index, Delta(progress=PromptProgress(o.n_prompt, o.n_cached, o.progress,
                                                             round((o.step_ts - o.scheduled_ts) * 1000))))
            return
        token = o.token
        if token >= 0:
            sample.first_token_ts = sample.first_token_ts or o.step_ts
            sample.last_token_ts = o.step_ts
        try:
            delta = sample.state.process(token, o.logprob, o.top, reason)
        except Exception as e:  # a bug in text handling ends this sample, not the router
            self.loop.abort(eid, index)
            stream.push(index, Delta(finish_reason=f"error: {type(e).__name__}: {e}"))
            return
        if delta.finish_reason and not reason:
            self.loop.abort(eid, index)  # a stop string ended it; the engine still holds it
        stream.push(index, delta)

    def prompt_ids(self, prompt: PromptType, add_special: bool = True) -> list[int]:
        """The prompt's token ids under the one rule (engine_request.py), as `generate` takes them."""
        return prompt_ids(self.tokenizer, prompt, add_special)[1]

    def check(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Raises the ValueError `generate` would raise for this request (its message names the field first),
        queueing nothing: a server calls it before it answers 200."""
        EngineRequest(None, prompt_ids, params).check(self.loop)

    async def compile_grammar(self, so: Optional[StructuredOutputsParams]):
        """The engine grammar of `so` (None without one), compiled on a worker thread so that a slow schema
        stalls neither the event loop nor the engine's steps; cached per model. ValueError with the compiler's
        message for one that does not compile."""
        if so is None:
            return None
        return await trio.to_thread.run_sync(self.llm.grammars.compile, so, abandon_on_cancel=True)

    def check_embed(self, prompt_ids: list[int], pooling: str = "last", normalize: bool = True) -> None:
        """Raises the ValueError `embed` would raise (empty, too long, bad ids, pooling not 'last' / 'mean' /
        'rank', 'rank' on a model without a classifier head), queueing nothing."""
        self.loop.check_embed(prompt_ids, pooling, normalize)

    async def generate(self, prompt: PromptType, params: Optional[SamplingParams] = None,
                       request_id: Optional[str] = None) -> AsyncIterator[StreamOutput]:
        """Streams the deltas of the request's n samples (each StreamOutput carries its sample's `index`); a
        sample's last delta carries its finish_reason, and the generator ends when every sample has ended.
        Raises ValueError on the first iteration, before anything is queued, for a request the engine refuses
        (too long, bad ids, bad parameters, a request id already streaming)."""
        params = params or SamplingParams()
        grammar = await self.compile_grammar(params.structured_outputs)  # waits for its grammar before it queues: ValueError
        rid, eid = self._new_id(request_id)  # no await from here to the add: the id is taken at once
        req = EngineRequest.build(self.tokenizer, prompt, params, grammar)
        ids = req.prompt_token_ids
        stream = RequestStream(rid, req.sample_states(self.tokenizer))
        req.submit(self.loop, eid)  # validates: ValueError, nothing queued
        self._streams[eid] = stream
        self._active[rid] = eid
        try:
            while True:
                for index, d in await stream.get():
                    yield self._output(rid, ids, stream, index, d)
                if stream.finished:
                    return
        finally:
            # No await here: this may run in a cancelled scope (Cancelled) or from aclose (GeneratorExit).
            del self._streams[eid]
            del self._active[rid]
            if not stream.closed:
                self.loop.abort(eid)

    @staticmethod
    def _output(rid: str, ids: list[int], stream: RequestStream, index: int, d: Delta) -> StreamOutput:
        s = stream.samples[index]
        plp = None
        if stream.prompt_logprobs is not None and not s.prompt_logprobs_sent:
            plp, s.prompt_logprobs_sent = stream.prompt_logprobs, True
        return StreamOutput(rid, ids, d.text, d.token_ids, d.logprobs, d.finish_reason, stream.scheduled_ts,
                            s.first_token_ts, s.last_token_ts, stream.cached_tokens, index, plp, d.stop_reason,
                            d.progress)

    def _new_id(self, request_id: Optional[str]) -> tuple[str, str]:
        """(user id, engine id) of a new call; raises ValueError for a user id still live."""
        if self._closed:
            raise RuntimeError("the engine is closed")
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self._active:
            raise ValueError(f"duplicate request id {rid!r}")
        return rid, f"{rid}#{next(self._ids)}"

    async def embed(self, prompt: PromptType, pooling: str = "last", normalize: bool = True,
                    request_id: Optional[str] = None, cache_salt: Optional[str] = None) -> np.ndarray:
        """The prompt's embedding, float32 [n_embd]: its final-norm hidden state pooled over the prompt, "last"
        (the last token's) or "mean" (of every token's), L2-normalised if `normalize`; "rank": [1] a reranker's
        relevance score of the prompt (Model::rank). One prefill-only engine request, batched with whatever else
        runs. Raises ValueError before queueing for a refused request (check_embed's rules, a request id still
        live); RuntimeError if the engine ends it first (abort(), shutdown, an engine error). Cancelling the
        caller aborts the request and frees its blocks. `cache_salt`: as SamplingParams.cache_salt."""
        rid, eid = self._new_id(request_id)
        ids = self.prompt_ids(prompt)
        self.loop.add_embed(eid, ids, pooling, normalize, cache_salt=cache_salt or "")  # validates: ValueError, nothing queued
        wait = self._embeds[eid] = _EmbedWait()
        self._active[rid] = eid
        try:
            await wait.done.wait()
        finally:
            del self._embeds[eid]
            del self._active[rid]
            if not wait.done.is_set():  # cancelled: no await here (see generate)
                self.loop.abort(eid)
        if wait.vector is None:
            raise RuntimeError(f"embedding request {rid!r} ended: {wait.reason}")
        return wait.vector


# What the layers above read of the loaded model, as LLM has it (they never reach into the native engine):
# read-only properties that delegate to the LLM.
for _name in ("model_path", "config", "options", "hparams", "metadata", "max_model_len"):
    setattr(AsyncLLM, _name, property(lambda self, n=_name: getattr(self.llm, n), doc=f"LLM.{_name}"))
del _name
