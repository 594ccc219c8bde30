"""A streamed response as the serving layer makes it, and the producer that runs its engine requests.

The serving layer streams *events*, never bytes: an `EventStream` yields batches (lists) of them, each batch
one engine step's events, which the server writes in one body write; how an event is framed on the wire
(SSE's `data:` / `event:` lines, JSON) is the server's (server/http/sse.py). An event is a response model or a dict
(a `data:` event), a `Named` one (an `event:` name, as the Responses and Messages APIs send), `DONE`
(OpenAI's closing `[DONE]`) or `KEEP_ALIVE` (an SSE comment line a stream sends after `sse_keepalive` seconds of
silence — a long prefill, a queue — so that clients and proxies with read timeouts keep it; every API's
translator passes it through as it is).

`choice_outputs` runs every prompt of a response as one `AsyncLLM.generate` (its n choices forked in the
engine) in one nursery and hands the consumer batches: everything that arrived since the last batch. It runs
as a `trio.as_safe_channel` generator: the consumer (the HTTP response body) owns it with `async with`, so when
the consumer is cancelled (client disconnect) or stops early, the nursery is cancelled and each generate's
`finally` aborts its engine request.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import AsyncIterator, Optional

import trio


class Done:
    """OpenAI's end of a stream (`data: [DONE]`)."""


DONE = Done()


class KeepAlive:
    """An SSE comment line: nothing to say yet, the stream is alive."""


KEEP_ALIVE = KeepAlive()


@dataclass(frozen=True)
class Named:
    """An event with a name (SSE's `event:` line) and its data (a response model or a dict)."""
    name: str
    data: object


@dataclass
class EventStream:
    """A streamed response: `batches` yields lists of events, each list written at once."""
    batches: AsyncIterator[list]


@dataclass
class EngineRequest:
    """One prompt of a response: one engine request whose n samples are choices first_index … + n - 1."""
    first_index: int
    prompt_ids: list[int]
    params: object  # SamplingParams with max_tokens and n set
    request_id: str


class Shutdown:
    """Sentinel item: the server is shutting down; end the response."""


SHUTDOWN = Shutdown()


class Stalled:
    """Sentinel item: the client stopped reading; the engine requests were aborted."""


STALLED = Stalled()


class StallWatch:
    """A response body marks each write it hands to the server (`writing()` … `written()`); a write that has
    not gone out after `timeout` seconds means a client that is connected but not reading. Hypercorn's send
    then blocks (shielded), so without this the engine would go on generating into a growing backlog."""

    def __init__(self, timeout: float, on_stall=None):
        self.timeout = timeout
        self.on_stall = on_stall  # called once when the watch fires (the body itself is stuck in its write)
        self.since: Optional[float] = None
        self.stalled = False

    def writing(self) -> None:
        self.since = trio.current_time()

    def written(self) -> None:
        self.since = None

    async def watch(self, cancel_scope: trio.CancelScope) -> None:
        while True:
            await trio.sleep(min(1.0, self.timeout / 4))
            if self.since is not None and trio.current_time() - self.since > self.timeout:
                self.stalled = True
                if self.on_stall is not None:
                    self.on_stall()
                cancel_scope.cancel()  # every generate's finally aborts its engine request
                return


async def _next_batch(recv, keepalive: float) -> list:
    """Everything that arrived since the last batch (at least one item), or [KEEP_ALIVE] when nothing came for
    `keepalive` seconds (<= 0: wait for ever). (A memory channel's receive loses nothing when cancelled.)"""
    batch = []
    with trio.move_on_after(keepalive if keepalive > 0 else math.inf):
        batch.append(await recv.receive())
    if not batch:
        return [KEEP_ALIVE]
    while True:
        try:
            batch.append(recv.receive_nowait())
        except trio.WouldBlock:
            return batch


def _choices_ended(batch: list, width: dict[int, int]) -> int:
    """Choices a batch ends: one per final delta, all of a request's on its exception."""
    return sum(width[idx] if isinstance(out, Exception) else 1 for idx, out in batch
               if isinstance(out, Exception) or out.finish_reason)


@trio.as_safe_channel
async def choice_outputs(engine, requests: list[EngineRequest], shutdown: Optional[trio.Event] = None,
                         stall: Optional[StallWatch] = None, keepalive: float = 0.0):
    """Yields lists of (choice index, StreamOutput | Exception), or [SHUTDOWN], or [STALLED] after `stall`
    saw a write hang, or [KEEP_ALIVE] after `keepalive` seconds without output (> 0). Ends when every choice
    ends (an exception ends all of its request's choices)."""
    send, recv = trio.open_memory_channel(math.inf)
    width = {r.first_index: r.params.n for r in requests}

    async def run(r: EngineRequest) -> None:
        try:
            async for out in engine.generate(r.prompt_ids, r.params, r.request_id):
                send.send_nowait((r.first_index + out.index, out))
        except Exception as e:  # noqa: BLE001 - handed to the consumer as an in-band error
            send.send_nowait((r.first_index, e))

    async def watch() -> None:
        await shutdown.wait()
        send.send_nowait(SHUTDOWN)

    async with trio.open_nursery() as nursery:
        for r in requests:
            nursery.start_soon(run, r)
        if shutdown is not None:
            nursery.start_soon(watch)
        if stall is not None and stall.timeout > 0:
            nursery.start_soon(stall.watch, nursery.cancel_scope)
        left = sum(width.values())
        while left:
            batch = await _next_batch(recv, keepalive)
            if any(item is SHUTDOWN for item in batch):
                yield [SHUTDOWN]  # (cancelling before a yield would cancel the hand-over too)
                nursery.cancel_scope.cancel()
                return
            if batch[0] is not KEEP_ALIVE:
                left -= _choices_ended(batch, width)
            yield batch
        nursery.cancel_scope.cancel()
    if stall is not None and stall.stalled:
        yield [STALLED]
