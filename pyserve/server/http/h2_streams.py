"""Hypercorn's HTTP/2 protocol with its stream bookkeeping made total: frames for a stream it no longer (or
never) tracked are answered as HTTP/2 says, not with a KeyError that ends the connection.

Two holes in Hypercorn 0.18's `H2Protocol` (hypercorn/protocol/h2.py), each of which ended the whole
connection — every other stream on it with it — and, before connection.py held such errors, the process:
- `_handle_events` looks DATA up in `self.streams` without a guard (h2.py:258-263). A stream Hypercorn
  refused while draining (it resets it at h2.py:239-244 and creates no stream) still has its request body
  in flight, so a client that opens a stream during a drain — any router, at any SIGTERM — killed the
  connection, and the streams the drain was meant to finish. Such DATA is now acknowledged (its bytes
  still count against the connection's flow-control window) and dropped. And such a stream is reset with
  REFUSED_STREAM, not NO_ERROR: RFC 9113 section 8.7's word for "not processed, safe to retry elsewhere",
  which routers act on.
- On a drain, the stream that ends last sends GOAWAY from its app task (h2.py:225-230) while the send task may
  still hold that stream's final DATA frame: END_STREAM then went out after GOAWAY. GOAWAY now waits for the
  last buffer to be sent, whichever task sees it.
- A stream whose client leaves its flow-control window full never pushes back on the app:
  `StreamBuffer.pop` (h2.py:77-84) un-pauses the writer whenever the chunk it popped is small, and the
  0-byte pops of a closed window always are, so the whole response piled up in memory and the stalled-client
  watch never fired. A writer now waits while the buffer itself stays above the low-water mark.
- A prior-knowledge connection that never finishes a stream was never closed: the idle timer stops when the
  preface is read as HTTP/1.1 and nothing restarts it after the switch to HTTP/2. `initiate` reports the
  connection's idleness once it speaks HTTP/2.
- The drain starts at the first signal (runner.py), while the listener stays open for /health's 503;
  Hypercorn's own `context.terminated` is set only when the drain is over. New streams are refused, and
  GOAWAY sent, from the first signal (`config.draining`, connection.configure).
- `_send_data`'s error path indexes `self.stream_buffers` again (h2.py:177-182) after the KeyError it is
  handling; a stream whose buffer is already gone is now just dropped from the send priority.
"""
from __future__ import annotations

import h2.errors
import h2.events
import h2.exceptions
import h2.settings
import priority
from hypercorn import protocol as hypercorn_protocol
from hypercorn.events import Closed, Updated
from hypercorn.protocol import h2 as hypercorn_h2
from hypercorn.protocol.events import StreamClosed
from hypercorn.protocol.h2 import BUFFER_LOW_WATER, H2Protocol, StreamBuffer


class BackpressureStreamBuffer(StreamBuffer):
    """StreamBuffer whose writer is released by the buffer draining, not by the size of one pop."""

    async def pop(self, max_length: int) -> bytes:
        length = min(len(self.buffer), max_length)
        data = bytes(self.buffer[:length])
        del self.buffer[:length]
        if len(self.buffer) < BUFFER_LOW_WATER:
            await self._paused.set()
        if len(self.buffer) == 0:
            await self._is_empty.set()
        return data


class TotalH2Protocol(H2Protocol):
    _goaway = False  # GOAWAY sent

    async def initiate(self, headers=None, settings=None) -> None:
        await super().initiate(headers, settings)
        await self.send(Updated(idle=self.idle))  # the keep-alive timer runs again, as for HTTP/1.1

    async def _handle_events(self, events: list) -> None:
        for event in events:
            if isinstance(event, h2.events.DataReceived) and event.stream_id not in self.streams:
                self.connection.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.RequestReceived) and self._draining():
                self.connection.reset_stream(event.stream_id, error_code=h2.errors.ErrorCodes.REFUSED_STREAM)
                self.connection.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 0})
                await self._flush()
            else:
                await super()._handle_events([event])

    async def _send_data(self, stream_id: int) -> None:
        if stream_id not in self.stream_buffers:
            try:
                self.priority.remove_stream(stream_id)
            except priority.MissingStreamError:
                pass
            return
        await super()._send_data(stream_id)
        if stream_id not in self.stream_buffers:  # its last frame is out
            await self._goaway_if_drained()

    async def stream_send(self, event) -> None:
        if not isinstance(event, StreamClosed):
            return await super().stream_send(event)
        await self._close_stream(event.stream_id)
        if await self._goaway_if_drained():
            return
        # While draining, "idle" would let the server close the socket under frames not yet sent
        await self.send(Updated(idle=self.idle and not (self._draining() and self.stream_buffers)))

    async def handle(self, event) -> None:
        if isinstance(event, Closed) and self.context.terminated.is_set() and not self._goaway:
            # the server closes an idle connection at shutdown: say so first (a client then knows that
            # nothing it sent after the last stream id was processed)
            self._goaway = True
            try:
                self.connection.close_connection()
                await self._flush()
            except h2.exceptions.ProtocolError:
                pass
        await super().handle(event)

    def _draining(self) -> bool:
        return self.context.terminated.is_set() or getattr(self.config, "draining", lambda: False)()

    async def _goaway_if_drained(self) -> bool:
        """GOAWAY once a draining connection has no stream left and nothing left to send; then the server
        may close it (idle)."""
        if not (self._draining() and self.idle and not self.stream_buffers) or self._goaway:
            return False
        self._goaway = True
        try:
            self.connection.close_connection()
            await self._flush()
        except h2.exceptions.ProtocolError:
            pass  # the connection is closed already
        await self.send(Updated(idle=True))
        return True


def install() -> None:
    """Hypercorn builds a connection's HTTP/2 protocol from `hypercorn.protocol.H2Protocol` (prior knowledge
    and h2c upgrade alike) and each stream's buffer from `hypercorn.protocol.h2.StreamBuffer`; this points them
    at TotalH2Protocol and BackpressureStreamBuffer (idempotent)."""
    hypercorn_protocol.H2Protocol = TotalH2Protocol
    hypercorn_h2.StreamBuffer = BackpressureStreamBuffer  # the one name H2Protocol._create_stream builds
