"""HTTP/2 from routers and proxies works, and no protocol error leaves its connection: hostile and malformed
h2c connections (prior knowledge, a bare socket speaking frames) against a real `pyserve serve`, each while
three honest clients (two over HTTP/1.1, one over h2c) stream the same temperature-0 completion again and
again. After each: every honest stream ended with the non-streamed answer's text, the server still runs and
/health answers 200; at the end SIGTERM exits 0 and stderr holds no traceback but those of contained
connection errors (scripts/fuzz_wire.py's stray_tracebacks).

Where RFC 9113 names the error (a frame on an idle stream, a SETTINGS value out of range), the test asserts
that code in the server's GOAWAY / RST_STREAM. Where it does not, or where the input used to raise inside
Hypercorn (then the connection may be dropped), it asserts only that the connection answers a PING or is
closed within 10 s. Every wait is bounded.
"""
from __future__ import annotations

import base64
import json
import struct
from typing import Callable, Optional

import hpack
import httpx
import pytest
import trio
from hyperframe.frame import Frame

from pyserve.bench.prometheus import parse_metrics, totals
from support.wire_servers import fuzz_wire as fw
from support.wire_servers import shared_server, srv  # noqa: F401 - srv: a fixture

PREFACE, frame, settings_payload = fw.PREFACE, fw.frame, fw.settings_payload
STALL_TIMEOUT = 2.0  # --stalled-client-timeout of the server under test
KEEP_ALIVE = 2.0  # its --keep-alive-timeout
# RFC 9113 section 7 error codes
NO_ERROR, PROTOCOL_ERROR, FLOW_CONTROL_ERROR, STREAM_CLOSED, FRAME_SIZE_ERROR, CANCEL = 0x0, 0x1, 0x3, 0x5, 0x6, 0x8
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = 0, 1, 2, 3, 4, 6, 7, 8, 9
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
LONG = {"prompt": "Tell me a long story.", "max_tokens": 2000, "ignore_eos": True, "stream": True}


shared = shared_server("--stalled-client-timeout", str(STALL_TIMEOUT), "--keep-alive-timeout", str(KEEP_ALIVE))


@pytest.fixture(scope="module")
def reference(shared) -> str:
    r = httpx.post(shared.live().url + "/v1/completions", timeout=60,
                   json=fw.completion_body(fw.PROMPT, fw.MAX_TOKENS, False))
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


class H2Conn:
    """A bare h2c client connection: bytes out as they are given, frames in parsed (hyperframe) and header
    blocks decoded (hpack). It ACKs the server's SETTINGS and sends nothing else on its own: no WINDOW_UPDATE."""

    def __init__(self, stream: trio.SocketStream):
        self.stream, self.buf, self.eof = stream, bytearray(), False
        self.send_lock = trio.Lock()  # a reader's SETTINGS ACK may go out while a flood is being sent
        self.encoder, self.decoder, self.block = hpack.Encoder(), hpack.Decoder(), b""
        self.status: dict[int, int] = {}  # stream -> :status
        self.data: dict[int, int] = {}  # stream -> DATA bytes received
        self.ended: set[int] = set()  # streams the server ended (END_STREAM)
        self.rst: dict[int, int] = {}  # stream -> RST_STREAM error code
        self.goaway: Optional[int] = None  # its error code
        self.server_settings: dict[int, int] = {}
        self.acks = {"settings": 0, "ping": 0}  # ACKs received

    @classmethod
    async def open(cls, port: int, first: bytes = PREFACE + frame(SETTINGS, 0, 0, b"")) -> "H2Conn":
        with trio.fail_after(10):
            conn = cls(await trio.open_tcp_stream("127.0.0.1", port))
        await conn.send(first)
        return conn

    def headers(self, sid: int, method: str, path: str, end_stream: bool, extra: tuple = ()) -> bytes:
        block = self.encoder.encode([(":method", method), (":scheme", "http"), (":path", path),
                                     (":authority", "127.0.0.1"), *extra])
        return frame(HEADERS, END_HEADERS | (END_STREAM if end_stream else 0), sid, block)

    def post(self, sid: int, path: str, body: dict, ctype: str = "application/json") -> bytes:
        raw = json.dumps(body).encode()
        return (self.headers(sid, "POST", path, False, (("content-type", ctype), ("content-length", str(len(raw)))))
                + frame(DATA, END_STREAM, sid, raw))

    async def send(self, *chunks: bytes) -> bool:
        """False once the server has closed or reset the connection."""
        try:
            with trio.fail_after(10):
                async with self.send_lock:
                    for c in chunks:
                        await self.stream.send_all(c)
            return True
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return False

    async def until(self, done: Callable[["H2Conn"], bool], timeout: float = 10.0) -> bool:
        """Reads frames until `done(self)` holds (True) or the connection ends or `timeout` s pass (False)."""
        with trio.move_on_after(timeout):
            while not done(self):
                if self.eof:
                    return False
                try:
                    chunk = await self.stream.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    chunk = b""
                self.eof = not chunk
                self.buf += chunk
                await self._parse()
            return True
        return False

    async def _parse(self) -> None:
        while len(self.buf) >= 9:
            f, length = Frame.parse_frame_header(memoryview(self.buf[:9]))
            if len(self.buf) < 9 + length:
                return
            f.parse_body(memoryview(self.buf[9:9 + length]))
            del self.buf[:9 + length]
            await self._on_frame(f)

    async def _on_frame(self, f) -> None:
        if f.type in (HEADERS, CONTINUATION):
            self.block += f.data
            if "END_HEADERS" in f.flags:
                got = dict(self.decoder.decode(self.block, raw=True))
                self.block = b""
                if b":status" in got:
                    self.status[f.stream_id] = int(got[b":status"])
        elif f.type == DATA:
            self.data[f.stream_id] = self.data.get(f.stream_id, 0) + len(f.data)
        elif f.type == RST_STREAM:
            self.rst[f.stream_id] = f.error_code
        elif f.type == GOAWAY:
            self.goaway = f.error_code
        elif f.type == SETTINGS and "ACK" in f.flags:
            self.acks["settings"] += 1
        elif f.type == SETTINGS:
            self.server_settings.update(f.settings)
            await self.send(frame(SETTINGS, ACK, 0, b""))
        elif f.type == PING and "ACK" in f.flags:
            self.acks["ping"] += 1
        if "END_STREAM" in getattr(f, "flags", ()):
            self.ended.add(f.stream_id)

    async def answers_or_closes(self) -> str:
        """'answers' (a PING comes back) or 'closed' (EOF); AssertionError if neither within 10 s: a wedged
        connection."""
        pings = self.acks["ping"]
        await self.send(frame(PING, 0, 0, b"wirefuzz"))
        ok = await self.until(lambda c: c.acks["ping"] > pings or c.eof)
        assert ok, "the connection neither answered a PING nor closed within 10 s"
        return "closed" if self.eof else "answers"

    async def closes(self, timeout: float = 10.0) -> bool:
        return await self.until(lambda c: c.eof, timeout)

    async def aclose(self) -> None:
        await self.stream.aclose()


async def metrics(url: str) -> dict[str, float]:
    """pyserve's metrics by name without the prefix, each summed over its labels."""
    async with httpx.AsyncClient(timeout=10) as client:
        return totals(parse_metrics((await client.get(url + "/metrics")).text)[0], "pyserve:")


async def wait_metrics(url: str, cond: Callable[[dict], bool], what: str, timeout: float = 30.0) -> dict:
    """Polls /metrics until `cond` holds of them; AssertionError naming `what` (and the last values) if it
    does not within `timeout` s."""
    with trio.move_on_after(timeout):
        while not cond(m := await metrics(url)):
            await trio.sleep(0.05)
        return m
    raise AssertionError(f"{what} not within {timeout:g} s: {m}")


async def engine_idle(url: str) -> dict:
    return await wait_metrics(url, lambda m: m["kv_blocks_used"] == 0 and m["num_requests_running"] == 0
                              and m["http_requests_in_flight"] == 0, "KV blocks, running and in-flight back to 0")


async def still_serving(srv) -> bool:
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
        return await fw.healthy(srv, client)


async def under_honest_load(srv, reference: str, attack):
    """Runs `await attack()` while three honest clients (HTTP/1.1, HTTP/1.1, h2c) stream the reference request
    again and again; then the server must still run and answer /health 200, and each of their streams must
    have ended with the reference text. Returns what `attack` returned."""
    honest = [fw.Honest(srv.url, reference, protocols=(h2,)) for h2 in (False, False, True)]
    stop = trio.Event()
    try:
        async with trio.open_nursery() as nursery:
            for h in honest:
                await nursery.start(h.run, stop)  # each has its first chunk in: the attack lands mid-stream
            try:
                result = await attack()
            finally:
                stop.set()
    except Exception as e:  # noqa: BLE001 - the attack's own failure, unless the server went away under it
        if not await still_serving(srv):
            raise AssertionError(await fw.exit_note(srv)) from e
        raise
    if not await still_serving(srv):
        raise AssertionError(await fw.exit_note(srv))
    for h in honest:
        assert h.intact >= 1 and not h.wrong, (h.protocols, h.intact, h.wrong)
    return result


async def connection_outcome(srv, reference: str, first: bytes) -> H2Conn:
    """Sends `first` on a fresh bare connection under honest load; returns the connection once it has answered
    a PING or closed."""
    async def attack():
        conn = await H2Conn.open(srv.port, first)
        try:
            await conn.answers_or_closes()
        finally:
            await conn.aclose()
        return conn
    return await under_honest_load(srv, reference, attack)


# ---- HTTP/2 that works: what routers and proxies send ----

async def test_h2c_streams_multiplexed_on_one_connection_match_the_reference(srv, reference):
    async with fw.open_client(srv.url, http2=True) as client:
        texts = [None] * 4

        async def one(i):
            texts[i] = await fw.stream_text(client, True)
        async with trio.open_nursery() as nursery:
            for i in range(4):
                nursery.start_soon(one, i)
    assert texts == [reference] * 4


# ---- a broken preface, garbage after a good one ----

@pytest.mark.parametrize("first", [
    b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\r",
    PREFACE + b"\x00garbage\xff" * 3000, PREFACE + frame(HEADERS, END_HEADERS, 1, b"\xff" * 20),
], ids=["bad-magic", "bad-magic-end", "garbage", "bad-hpack"])
async def test_a_broken_connection_start_is_closed(srv, reference, first):
    conn = await connection_outcome(srv, reference, first)
    assert conn.eof and not conn.status, (conn.status, conn.goaway)
    assert conn.goaway in (None, PROTOCOL_ERROR, FRAME_SIZE_ERROR, 0x9), conn.goaway  # 0x9: COMPRESSION_ERROR


# ---- frames on streams that were never opened, or are closed ----

@pytest.mark.parametrize("make", [
    lambda: frame(DATA, 0, 5, b"abc"), lambda: frame(WINDOW_UPDATE, 0, 7, struct.pack(">I", 100)),
    lambda: frame(RST_STREAM, 0, 9, struct.pack(">I", CANCEL)), lambda: frame(CONTINUATION, END_HEADERS, 11, b""),
    lambda: frame(DATA, 0, 0, b"abc"), lambda: frame(HEADERS, END_HEADERS | END_STREAM, 2, b"\x82"),
], ids=["data", "window-update", "rst-stream", "continuation", "data-on-stream-0", "headers-on-even-stream"])
async def test_a_frame_on_an_idle_stream_is_a_connection_error(srv, reference, make):
    """RFC 9113 5.1: only HEADERS and PRIORITY may name an idle stream; 5.1.1: client streams are odd."""
    conn = await connection_outcome(srv, reference, PREFACE + frame(SETTINGS, 0, 0, b"") + make())
    assert conn.goaway == PROTOCOL_ERROR and conn.eof, (conn.goaway, conn.eof)


async def test_priority_on_an_idle_stream_is_allowed(srv, reference):
    conn = await connection_outcome(srv, reference, PREFACE + frame(SETTINGS, 0, 0, b"")
                                    + frame(PRIORITY, 0, 13, struct.pack(">IB", 0, 15)))
    assert not conn.eof and conn.goaway is None


@pytest.mark.parametrize("kind", ["data", "headers", "window-update", "rst-stream"])
async def test_a_frame_on_a_closed_stream(srv, reference, kind):
    """After GET /health on stream 1 ended both ways: DATA or HEADERS there is a STREAM_CLOSED error (RFC 9113
    5.1), WINDOW_UPDATE and RST_STREAM are ignored; either way stream 3 still gets its answer."""
    late = {"data": lambda c: frame(DATA, END_STREAM, 1, b"x"),
            "headers": lambda c: c.headers(1, "GET", "/health", True),
            "window-update": lambda c: frame(WINDOW_UPDATE, 0, 1, struct.pack(">I", 100)),
            "rst-stream": lambda c: frame(RST_STREAM, 0, 1, struct.pack(">I", CANCEL))}[kind]

    async def attack():
        conn = await H2Conn.open(srv.port)
        try:
            await conn.send(conn.headers(1, "GET", "/health", True))
            assert await conn.until(lambda c: 1 in c.ended), "no answer on stream 1"
            await conn.send(late(conn) + conn.headers(3, "GET", "/health", True))
            assert await conn.until(lambda c: 3 in c.ended or c.eof), "no answer on stream 3"
        finally:
            await conn.aclose()
        return conn
    conn = await under_honest_load(srv, reference, attack)
    if kind in ("data", "headers"):
        assert conn.rst.get(1) == STREAM_CLOSED or conn.goaway == STREAM_CLOSED, (conn.rst, conn.goaway)
    if conn.goaway is None:
        assert conn.status == {1: 200, 3: 200}, conn.status


@pytest.mark.parametrize("path,ctype,early", [("/nope", "application/json", 404),
                                              ("/v1/completions", "text/plain", 415)])
async def test_data_after_an_early_answer(srv, reference, path, ctype, early):
    """The server answers (and ends) the stream from its HEADERS alone; the client's DATA comes after. This
    used to raise KeyError in Hypercorn's H2Protocol and end the whole server."""
    async def attack():
        conn = await H2Conn.open(srv.port)
        try:
            await conn.send(conn.headers(1, "POST", path, False, (("content-type", ctype),)))
            assert await conn.until(lambda c: 1 in c.ended), "no early answer"
            await conn.send(frame(DATA, END_STREAM, 1, b"{}"))
            await conn.answers_or_closes()
        finally:
            await conn.aclose()
        return conn
    conn = await under_honest_load(srv, reference, attack)
    assert conn.status[1] == early


# ---- oversized header blocks, floods ----

def header_block_frames(conn: H2Conn, sid: int, size: int, end: bool = True) -> bytes:
    """A GET /health whose header list is about `size` bytes (64 KiB-ish values, so no 16 KiB frame is exceeded),
    sent as HEADERS + CONTINUATIONs of 16 KiB; the last one ends the block when `end`."""
    block = conn.encoder.encode([(":method", "GET"), (":scheme", "http"), (":path", "/health"),
                                 (":authority", "x")] + [(f"x-big-{i}", "a" * 8000) for i in range(size // 8000)])
    parts = [block[i:i + 16384] for i in range(0, len(block), 16384)]
    out = frame(HEADERS, END_STREAM | (END_HEADERS if end and len(parts) == 1 else 0), sid, parts[0])
    for i, p in enumerate(parts[1:], 1):
        out += frame(CONTINUATION, END_HEADERS if end and i == len(parts) - 1 else 0, sid, p)
    return out


async def test_a_header_list_over_the_servers_limit_is_refused(srv, reference):
    async def attack():
        conn = await H2Conn.open(srv.port)
        try:
            assert await conn.until(lambda c: 6 in c.server_settings), "no SETTINGS_MAX_HEADER_LIST_SIZE"
            limit = conn.server_settings[6]
            await conn.send(header_block_frames(conn, 1, 2 * limit))
            await conn.until(lambda c: 1 in c.rst or 1 in c.status or c.eof)
            await conn.answers_or_closes()
        finally:
            await conn.aclose()
        return conn
    conn = await under_honest_load(srv, reference, attack)
    assert conn.status.get(1, 431) == 431 and (conn.goaway is not None or 1 in conn.rst or 1 in conn.status), (
        conn.status, conn.rst, conn.goaway)


async def test_a_continuation_flood_is_cut_off(srv, reference):
    """HEADERS, then small CONTINUATION frames that never end the block (the 2024 'CONTINUATION flood'): the
    server must close the connection long before the 20000 frames are in, not buffer them."""
    async def attack():
        conn = await H2Conn.open(srv.port)
        try:
            head = conn.encoder.encode([(":method", "GET"), (":scheme", "http"), (":path", "/health")])
            one = frame(CONTINUATION, 0, 1, hpack.Encoder().encode([("x-flood", "a" * 64)]))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(conn.closes, 30.0)
                await conn.send(frame(HEADERS, END_STREAM, 1, head))
                for _ in range(200):  # 100 frames a write
                    if conn.eof or not await conn.send(one * 100):
                        break
            return conn
        finally:
            await conn.aclose()
    conn = await under_honest_load(srv, reference, attack)
    assert conn.eof and 1 not in conn.status and conn.goaway in (PROTOCOL_ERROR, 0xB), (conn.status, conn.goaway)


async def flood(srv, reference: str, one: bytes, count: int, acked: str) -> H2Conn:
    """`count` copies of the frame `one` in a single write while the answers are read; returns once all are
    ACKed (acks[`acked`]) or the connection closed, then checks it still answers or is closed."""
    async def attack():
        conn = await H2Conn.open(srv.port)
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(conn.until, lambda c: c.acks[acked] >= count + (acked == "settings") or c.eof,
                                   30.0)
                await conn.send(one * count)
            await conn.answers_or_closes()
        finally:
            await conn.aclose()
        return conn
    return await under_honest_load(srv, reference, attack)


async def test_a_settings_flood(srv, reference):
    """Thousands of SETTINGS: each gets its ACK (plus the one for the opening SETTINGS), or the connection is
    closed as a flood (GOAWAY ENHANCE_YOUR_CALM)."""
    conn = await flood(srv, reference, frame(SETTINGS, 0, 0, settings_payload({4: 65535})), 5000, "settings")
    assert conn.acks["settings"] == 5001 or (conn.eof and conn.goaway == 0xB), (conn.acks, conn.goaway)


async def test_a_ping_flood(srv, reference):
    conn = await flood(srv, reference, frame(PING, 0, 0, b"12345678"), 10000, "ping")
    assert conn.acks["ping"] >= 10000 or (conn.eof and conn.goaway == 0xB), (conn.acks, conn.goaway)


@pytest.mark.parametrize("payload,flags,sid,code", [
    (settings_payload({4: 2**31}), 0, 0, FLOW_CONTROL_ERROR),  # INITIAL_WINDOW_SIZE above 2**31-1
    (settings_payload({5: 2**24}), 0, 0, PROTOCOL_ERROR),  # MAX_FRAME_SIZE above 2**24-1
    (settings_payload({5: 16383}), 0, 0, PROTOCOL_ERROR),  # ... below 2**14
    (settings_payload({2: 2}), 0, 0, PROTOCOL_ERROR),  # ENABLE_PUSH neither 0 nor 1
    (settings_payload({4: 100}), 0, 1, PROTOCOL_ERROR),  # on a stream
    (b"\x00\x04\x00\x00\x01", 0, 0, FRAME_SIZE_ERROR),  # not a multiple of 6 bytes
    (settings_payload({4: 100}), ACK, 0, (FRAME_SIZE_ERROR, PROTOCOL_ERROR)),  # an ACK with a payload: h2 4.x
    # answers PROTOCOL_ERROR where the RFC says FRAME_SIZE_ERROR
], ids=["initial-window-2**31", "max-frame-2**24", "max-frame-16383", "enable-push-2", "on-stream-1",
        "length-5", "ack-with-payload"])
async def test_invalid_settings_are_a_connection_error(srv, reference, payload, flags, sid, code):
    """RFC 9113 6.5 / 6.5.2 name the error of each."""
    conn = await connection_outcome(srv, reference, PREFACE + frame(SETTINGS, flags, sid, payload))
    assert conn.goaway in (code if isinstance(code, tuple) else (code,)) and conn.eof, (conn.goaway, conn.eof)


def h2c_upgrade(settings: bytes) -> bytes:
    return (b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
            b"HTTP2-Settings: " + settings + b"\r\n\r\n")


@pytest.mark.parametrize("settings", [
    base64.urlsafe_b64encode(settings_payload({4: 2**32 - 1})).rstrip(b"="),  # INITIAL_WINDOW_SIZE too big
    base64.urlsafe_b64encode(settings_payload({5: 1})).rstrip(b"="),  # MAX_FRAME_SIZE too small
    base64.urlsafe_b64encode(b"\x00\x04\x00\x00\x01").rstrip(b"="),  # 5 bytes (h2 wants the padding back)
    base64.urlsafe_b64encode(b"\x00\x04\x00\x00\x01\x00\x00\x03\x00"),  # 9 bytes: not n settings of 6
    b"!!not base64!!",
], ids=["initial-window-2**32-1", "max-frame-1", "length-5", "length-9", "not-base64"])
async def test_an_h2c_upgrade_with_bad_settings(srv, reference, settings):
    """The HTTP/1.1 way into h2c (Upgrade: h2c + HTTP2-Settings, RFC 7540 3.2): each used to raise out of
    Hypercorn's H2Protocol.initiate (h2's initiate_upgrade_connection) and end the whole server."""
    async def attack():
        with trio.fail_after(10):
            stream = await trio.open_tcp_stream("127.0.0.1", srv.port)
        async with stream:
            await stream.send_all(h2c_upgrade(settings))
            got = bytearray()
            with trio.move_on_after(5):  # until EOF, or the answer to GET /health (over h2 after a 101)
                try:
                    while not any(c >= 200 for c in fw.statuses(bytes(got))):
                        if not (chunk := await stream.receive_some(65536)):
                            break
                        got += chunk
                except trio.BrokenResourceError:
                    pass
            return bytes(got)
    got = await under_honest_load(srv, reference, attack)
    assert got == b"" or not any(fw.server_error(c) for c in fw.statuses(got)), got[:300]


@pytest.mark.parametrize("first", [PREFACE + frame(SETTINGS, 0, 0, b""),
                                   PREFACE + frame(SETTINGS, 0, 0, b"") + b"\x00\x40\x00\x00\x00\x00\x00\x00\x01"],
                         ids=["no-stream", "frame-never-completed"])
async def test_an_idle_h2c_connection_is_closed_after_the_keep_alive_timeout(srv, reference, first):
    """A prior-knowledge connection that opens no stream, or stops inside a frame (a DATA header that announces
    16 KiB): like an idle HTTP/1.1 connection, it is closed after --keep-alive-timeout, not held for ever."""
    async def attack():
        conn = await H2Conn.open(srv.port, first)
        try:
            return await conn.closes(KEEP_ALIVE + 10)
        finally:
            await conn.aclose()
    assert await under_honest_load(srv, reference, attack), f"still open {KEEP_ALIVE + 10:g} s on"


# ---- a client that stops reading, a client that cancels ----

async def test_a_stream_whose_window_stays_full_is_aborted_and_others_go_on(srv, reference):
    """Stream 1 (a long completion) fills its 65535-byte window and the client never sends a WINDOW_UPDATE for
    it (the connection's window it does open). Stream 3 on the same connection is still answered; the
    stalled-client timeout aborts stream 1 (counted stalled and aborted) and frees its KV blocks. (Hypercorn
    0.18 instead buffers the whole response: StreamBuffer.pop sets `_paused` after the 0-byte pops of a closed
    window, so the body's writes never block and the stalled-client watch never fires.)"""
    before = await metrics(srv.url)

    async def attack():
        conn = await H2Conn.open(srv.port)
        try:
            await conn.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">I", 2**30)),
                            conn.post(1, "/v1/completions", dict(LONG, logprobs=5)))
            assert await conn.until(lambda c: c.data.get(1, 0) >= 65535, 60), conn.data
            await conn.send(conn.headers(3, "GET", "/health", True))
            assert await conn.until(lambda c: 3 in c.ended, 10), "stream 3 got no answer beside the stalled one"
            assert conn.status[3] == 200 and 1 not in conn.ended
            await wait_metrics(srv.url, lambda m: m["stalled_clients_total"] > before["stalled_clients_total"],
                               "the stalled stream's abort", 30 + STALL_TIMEOUT)
        finally:
            await conn.aclose()
        return conn
    await under_honest_load(srv, reference, attack)
    m = await engine_idle(srv.url)  # its KV blocks too: the honest streams have ended by now
    assert m["stalled_clients_total"] == before["stalled_clients_total"] + 1
    assert m.get("request_aborted_total", 0) == before.get("request_aborted_total", 0) + 1


async def test_a_client_reset_mid_stream_aborts_the_request(srv, reference):
    """RST_STREAM(CANCEL) after a few chunks of a long completion: the request counts as aborted, its KV blocks
    come back, and the connection goes on serving (stream 3)."""
    before = await metrics(srv.url)

    async def attack():
        conn = await H2Conn.open(srv.port)
        try:
            await conn.send(conn.post(1, "/v1/completions", LONG))
            assert await conn.until(lambda c: c.data.get(1, 0) >= 1000, 60), conn.data
            await conn.send(frame(RST_STREAM, 0, 1, struct.pack(">I", CANCEL)))
            await wait_metrics(srv.url, lambda m: m.get("request_aborted_total", 0)
                               == before.get("request_aborted_total", 0) + 1, "the reset request counted aborted")
            await conn.send(conn.headers(3, "GET", "/health", True))
            assert await conn.until(lambda c: 3 in c.ended, 10), "no answer on stream 3 after the reset"
            assert conn.status[3] == 200 and conn.goaway is None
        finally:
            await conn.aclose()
        return conn
    await under_honest_load(srv, reference, attack)
    m = await engine_idle(srv.url)
    assert m["generation_tokens_total"] - before.get("generation_tokens_total", 0) < 2000  # it stopped well short
