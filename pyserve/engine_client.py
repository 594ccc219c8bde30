"""AsyncLLM: the engine's async face, for trio.

The engine steps on its own native thread (EngineLoop). After each step it writes an eventfd once; one
router task here waits on that fd, drains every output of the step in one call, turns tokens into text
(detokenizer, stop strings) and merges each request's delta into that request's stream. A stream holds
at most one merged, undelivered delta, so a slow consumer never stalls the engine or the router.

Cancelling a consumer (a cancel scope, an exception, closing the async generator) aborts its engine
request in the generator's own `finally`. That `finally` may run inside an already-cancelled scope, so
the abort is a synchronous, thread-safe enqueue: no await.
"""
from __future__ import annotations

import itertools
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import AsyncIterator, Optional, Union

import trio

from . import _engine
from .output_processor import Delta, RequestState
from .sampling_params import SamplingParams


@dataclass
class StreamOutput:
    request_id: str
    prompt_token_ids: list[int]
    text_delta: str = ""
    token_ids_delta: list[int] = field(default_factory=list)
    logprobs_delta: Optional[list[dict[int, float]]] = None
    finish_reason: Optional[str] = None


class RequestStream:
    """One request's channel from the router to its consumer; undelivered deltas merge."""

    def __init__(self, state: RequestState):
        self.state = state
        self.pending: Optional[Delta] = None
        self.finished = False
        self._event = trio.Event()

    def push(self, d: Delta) -> None:
        if self.pending is None:
            self.pending = d
        else:
            p = self.pending
            p.text += d.text
            p.token_ids += d.token_ids
            if d.logprobs is not None:
                p.logprobs = (p.logprobs or []) + d.logprobs
            p.finish_reason = d.finish_reason or p.finish_reason
        self._event.set()

    async def get(self) -> Delta:
        while self.pending is None:
            self._event = trio.Event()
            await self._event.wait()
        d, self.pending = self.pending, None
        if d.finish_reason:
            self.finished = True
        return d


class AsyncLLM:
    """Use `async with AsyncLLM.open(model=None, **engine_options) as engine:` — see LLM for the options."""

    def __init__(self, llm):
        self.llm = llm
        self.tokenizer = llm.tokenizer
        self.loop = _engine.EngineLoop(llm.engine)
        self._streams: dict[str, RequestStream] = {}
        self._ids = itertools.count()

    @classmethod
    @asynccontextmanager
    async def open(cls, model: Optional[str] = None, **engine_options) -> AsyncIterator["AsyncLLM"]:
        from .llm import LLM

        llm = await trio.to_thread.run_sync(lambda: LLM(model, **engine_options))
        self = cls(llm)
        async with trio.open_nursery() as nursery:
            await nursery.start(self._route)
            self.loop.start()
            try:
                yield self
            finally:
                self.abort_all()
                nursery.cancel_scope.cancel()
                self.loop.stop()

    def stats(self) -> dict:
        return self.llm.engine.stats()

    def abort_all(self) -> None:
        for rid in list(self._streams):
            self.loop.abort(rid)

    async def _route(self, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        fd = self.loop.fd
        while True:
            await trio.lowlevel.wait_readable(fd)
            for rid, token, logprob, top, reason, _n_prompt, _index in self.loop.drain():
                stream = self._streams.get(rid)
                if stream is None:
                    continue
                delta = stream.state.process(token, logprob, top, reason)
                if delta.finish_reason and not reason:
                    self.loop.abort(rid)  # a stop string ended it; the engine still holds it
                stream.push(delta)

    def prompt_ids(self, prompt: Union[str, list[int]], add_special: bool = True) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special=add_special, parse_special=True)
        return [int(t) for t in prompt]

    async def generate(self, prompt: Union[str, list[int]], params: Optional[SamplingParams] = None,
                       request_id: Optional[str] = None) -> AsyncIterator[StreamOutput]:
        """Streams one sequence's deltas; the last one carries finish_reason. Raises ValueError at once for a
        request the engine refuses (too long, bad ids, bad parameters)."""
        params = params or SamplingParams()
        ids = self.prompt_ids(prompt)
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self._streams:
            raise ValueError(f"duplicate request id {rid!r}")
        stream = RequestStream(RequestState(self.tokenizer, ids, params.stop, params.logprobs is not None,
                                            params.skip_special_tokens))
        self.loop.add(rid, ids, params.engine_sampling(0), params.max_tokens, params.ignore_eos,
                      list(params.stop_token_ids))
        self._streams[rid] = stream
        try:
            while True:
                d = await stream.get()
                yield StreamOutput(rid, ids, d.text, d.token_ids, d.logprobs, d.finish_reason)
                if d.finish_reason:
                    return
        finally:
            self._streams.pop(rid, None)
            if not stream.finished:
                self.loop.abort(rid)
