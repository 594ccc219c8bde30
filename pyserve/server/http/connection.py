"""One connection's failure stays inside that connection: a small subclass of Hypercorn's trio TCPServer.

Hypercorn 0.18 runs each connection as `TCPServer.run` in its server nursery; the connection's protocol
(h11 or h2) and the app's request tasks run in the connection's own task group below it. Any exception
there (a protocol state Hypercorn does not expect, a send race, a bug of ours in a route that escapes
Quart) leaves `run()` and, through the server nursery and pyserve's root nursery, ends the process with
every other client's stream. `run()` is the one place every connection-level failure passes, so it is held
there: the exception ends this connection only, is logged once with the connection's id and peer, and is
counted by kind. `trio.Cancelled` (shutdown, a cancelled nursery) and KeyboardInterrupt are never held.

The send race (the root cause of the crash under sglang-router's HTTP/2 traffic): `TCPServer.protocol_send`
holds `send_lock` around `stream.send_all` (hypercorn/trio/tcp_server.py:84-88), but `TCPServer._close`
(tcp_server.py:117-129) calls `stream.send_eof()` without it. trio's `SocketStream.send_eof` enters the
stream's send-conflict detector and then checkpoints, so an HTTP/2 connection that closes while its
`H2Protocol.send_task` (hypercorn/protocol/h2.py:143-183) is flushing DATA frames has two tasks sending at
once: `send_all` raises `trio.BusyResourceError`, which `protocol_send` does not catch. `_close` here takes
the same lock (one writer per socket), bounded so that a peer that never reads cannot hold a close forever;
past the bound the stream is closed outright, which wakes the blocked writer with ClosedResourceError
(which `protocol_send` handles).
"""
from __future__ import annotations

import itertools
import logging
import sys
from typing import Callable, Optional

import trio
from hypercorn.events import RawData
from hypercorn.trio import run as hypercorn_run
from hypercorn.trio.tcp_server import TCPServer

from . import h2_streams

if sys.version_info < (3, 11):
    from exceptiongroup import BaseExceptionGroup

log = logging.getLogger("pyserve.server")

CLOSE_TIMEOUT = 5.0  # seconds a close waits for the connection's writer before closing under it
_ids = itertools.count(1)


def error_kind(e: BaseException) -> str:
    """A short label for the metrics: the exception's class, or the first one inside a group."""
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return type(e).__name__


def split_contained(e: BaseException) -> tuple[Optional[BaseException], Optional[BaseException]]:
    """(the errors a connection may hold, what must propagate: Cancelled, KeyboardInterrupt, SystemExit)."""
    if isinstance(e, BaseExceptionGroup):
        return e.split(Exception)
    return (e, None) if isinstance(e, Exception) else (None, e)


class ContainedTCPServer(TCPServer):
    """Hypercorn's TCPServer with the connection's failures contained and one writer per socket."""

    async def run(self) -> None:
        conn = next(_ids)
        try:
            await super().run()
        except BaseException as e:  # noqa: BLE001 - split below: only Exceptions are held
            held, rest = split_contained(e)
            if held is not None:
                self._contained(conn, held)
            if rest is not None:
                raise rest from None

    def _contained(self, conn: int, e: BaseException) -> None:
        peer = self._peer()
        kind = error_kind(e)
        log.error("connection %d from %s ended by %s (contained; the server and other connections go on)",
                  conn, peer, kind, exc_info=e)
        on_error: Optional[Callable[[str], None]] = getattr(self.config, "on_connection_error", None)
        if on_error is not None:
            on_error(kind)

    def _peer(self) -> str:
        try:
            sock = getattr(self.stream, "socket", None) or self.stream.transport_stream.socket
            host, port = sock.getpeername()[:2]
            return f"{host}:{port}"
        except (OSError, AttributeError, ValueError):
            return "?"

    async def protocol_send(self, event) -> None:
        marker = getattr(self.config, "fault_marker", None)
        if marker and isinstance(event, RawData) and marker in event.data:
            raise RuntimeError("fault injected (PYSERVE_FAULT_MARKER): this connection's send failed")
        await super().protocol_send(event)

    async def _close(self) -> None:
        with trio.CancelScope(shield=True):
            with trio.move_on_after(CLOSE_TIMEOUT):
                if self.send_lock.statistics().owner is trio.lowlevel.current_task():
                    await super()._close()  # this task is the writer already (a close from inside a send)
                    return
                async with self.send_lock:
                    await super()._close()
                    return
            await self.stream.aclose()  # the writer is stuck on a peer that does not read


def configure(config, on_error: Callable[[str], None], fault_marker: Optional[bytes] = None,
              draining: Callable[[], bool] = lambda: False) -> None:
    """Hands a Hypercorn config what ContainedTCPServer reads: the error counter and, for tests only, a
    marker whose appearance in a connection's outgoing bytes makes that connection's send raise; and what
    h2_streams reads: whether the server drains (from the first signal on, before Hypercorn's own shutdown)."""
    config.on_connection_error = on_error
    config.fault_marker = fault_marker
    config.draining = draining


def install() -> None:
    """Hypercorn's trio worker builds each connection's handler from `hypercorn.trio.run.TCPServer`; this
    points it at ContainedTCPServer, and HTTP/2 connections at h2_streams.TotalH2Protocol (idempotent;
    held by tests/server/test_connections.py)."""
    hypercorn_run.TCPServer = ContainedTCPServer
    h2_streams.install()
