#!/usr/bin/env python3
"""A mutation fuzzer for the server's wire protocols: HTTP/1.1 and HTTP/2 (h2c) byte streams, each sent on a
fresh loopback connection to a live `pyserve serve`, while an honest client streams completions.

    python3 scripts/fuzz_wire.py --seconds 600 --seed 7        # starts its own server on 127.0.0.1
    python3 scripts/fuzz_wire.py --inputs 2000 --seed 1 --batch 16

(pyserve must import: installed, or a checkout built in place; run from its root or with PYTHONPATH.)

Seeds: a streamed chat completion, a GET /v1/models, a chunked completion, an h2c upgrade (HTTP/1.1), and for
HTTP/2 the connection preface + SETTINGS + HEADERS + DATA of a completion (also with its body sent late) and a
two-stream GET. Each input stacks 1-3 mutations: bit flips, byte insert / delete, chunk duplication,
truncation, a splice of two seeds, header injection (HTTP/1.1: h2c / websocket upgrades, bad framing headers,
huge or folded lines), and for HTTP/2 random frame lengths / types / flags / stream ids, inserted control
frames (SETTINGS with invalid values, WINDOW_UPDATE, RST_STREAM, PRIORITY, GOAWAY, PUSH_PROMISE, CONTINUATION,
unknown types), dropped, doubled and swapped frames; and a pause that sends the rest only once the server has
answered one more response (or 0.3 s). The inputs follow from --seed alone; --seconds and --inputs only cut
the sequence short. --known puts the inputs that used to end the server first.

What counts: the server never exits; /health answers 200 after every batch; no response has a 5xx status but
501 (see server_error; HTTP/1.1 status lines, HTTP/2 :status, parsed with h11 / hyperframe + hpack); every
honest stream ends with the text of the same non-streamed temperature-0 request; SIGTERM at the end exits 0
and the server's stderr holds no traceback but those of contained connection errors (stray_tracebacks). On
an exit this script saves the last two batches under --crash-dir, replays them one input at a time on a
fresh server to name the culprit (once per distinct crash_signature), records its traceback and goes on with
a new server. Exit status 0 when nothing was found, else 1.

tests/server/test_wire_fuzz.py imports this module for its short run (the same engine, a fixed seed, a small budget).
"""
from __future__ import annotations

import argparse
import base64
import itertools
import json
import random
import re
import signal
import struct
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import h11
import hpack
import httpx
import trio
from hyperframe.exceptions import HyperframeError
from hyperframe.frame import Frame

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
PROMPT, MAX_TOKENS = "The capital of France is", 24  # the honest client's request (temperature 0)
READ_DEADLINE = 0.5  # s a fuzz connection is read after its last byte is sent
PAUSE = b"\x00PAUSE\x00"  # not sent: the sender waits for the server's answer (or 0.2 s) there

# ---------------------------------------------------------------------------------------------------
# seeds
# ---------------------------------------------------------------------------------------------------


def h1_request(method: str, path: str, body: bytes = b"", headers: tuple = ()) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *headers]
    if body:
        lines += ["Content-Type: application/json", f"Content-Length: {len(body)}"]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def h1_seeds() -> list[bytes]:
    chat = json.dumps({"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 6, "temperature": 0,
                       "stream": True}).encode()
    comp = json.dumps({"prompt": "One, two,", "max_tokens": 4}).encode()
    chunked = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
               + b"%x\r\n" % len(comp) + comp + b"\r\n0\r\n\r\n")
    upgrade = h1_request("GET", "/health", headers=(
        "Connection: Upgrade, HTTP2-Settings", "Upgrade: h2c",
        "HTTP2-Settings: " + base64.urlsafe_b64encode(settings_payload({3: 100, 4: 65535})).decode().rstrip("=")))
    return [h1_request("POST", "/v1/chat/completions", chat), h1_request("GET", "/v1/models"),
            chunked, upgrade + PREFACE + frame(4, 0, 0, b"")]


# An HTTP/2 frame before serialisation: [type, flags, stream id, payload, declared length or None]
H2Frame = list


def frame(ftype: int, flags: int, sid: int, payload: bytes, length: Optional[int] = None) -> bytes:
    n = len(payload) if length is None else length
    return struct.pack(">I", n & 0xFFFFFF)[1:] + bytes([ftype & 0xFF, flags & 0xFF]) + struct.pack(
        ">I", sid & 0xFFFFFFFF) + payload


def settings_payload(values: dict) -> bytes:
    return b"".join(struct.pack(">HI", k & 0xFFFF, v & 0xFFFFFFFF) for k, v in values.items())


def h2_headers(method: str, path: str, extra: tuple = ()) -> bytes:
    return hpack.Encoder().encode([(":method", method), (":scheme", "http"), (":path", path),
                                   (":authority", "127.0.0.1"), *extra])


def h2_seeds() -> list[list[H2Frame]]:
    """Frame lists, each sent after the connection preface."""
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 6, "stream": True}).encode()
    completion = [[4, 0, 0, settings_payload({4: 65535, 2: 0}), None],
                  [1, 0x4, 1, h2_headers("POST", "/v1/completions", (("content-type", "application/json"),
                                                                     ("content-length", str(len(body))))), None],
                  [0, 0x1, 1, body, None], [8, 0, 0, struct.pack(">I", 1 << 20), None]]
    late_body = completion[:2] + [PAUSE] + completion[2:]  # the body sent once the server has answered, if it does
    gets = [[4, 0, 0, b"", None], [1, 0x5, 1, h2_headers("GET", "/v1/models"), None],
            [1, 0x5, 3, h2_headers("GET", "/health"), None], [6, 0, 0, b"fuzzping", None]]
    return [completion, late_body, gets]


def serialize_h2(frames: list[H2Frame]) -> bytes:
    return PREFACE + b"".join(PAUSE if f is PAUSE else frame(*f) for f in frames)

# ---------------------------------------------------------------------------------------------------
# mutations (each takes the rng, the input, the other seeds; returns the new input)
# ---------------------------------------------------------------------------------------------------

TOKENS = [b"\r\n", b"\n", b"\r", b"\x00", b"\xff", b":", b" ", b"\t", b"\r\n\r\n", b"0\r\n\r\n", b"-1", b",",
          b"99999999999999999999", b"\x80", b"{", b'"', b"\\u0000", b"%00", b"\xf0\x9f\x98", PREFACE]


def bit_flip(rng: random.Random, data: bytes, seeds) -> bytes:
    b = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        if b:
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    return bytes(b)


def insert_bytes(rng: random.Random, data: bytes, seeds) -> bytes:
    at = rng.randint(0, len(data))
    new = rng.choice(TOKENS) if rng.random() < 0.6 else rng.randbytes(rng.randint(1, 16))
    return data[:at] + new + data[at:]


def delete_bytes(rng: random.Random, data: bytes, seeds) -> bytes:
    at = rng.randint(0, len(data))
    return data[:at] + data[at + rng.randint(1, 32):]


def duplicate_chunk(rng: random.Random, data: bytes, seeds) -> bytes:
    i = rng.randint(0, len(data))
    chunk = data[i:i + rng.randint(1, 256)] * rng.choice([1, 2, 16])
    at = rng.randint(0, len(data))
    return data[:at] + chunk + data[at:]


def truncate(rng: random.Random, data: bytes, seeds) -> bytes:
    return data[:rng.randint(0, max(0, len(data) - 1))]


def splice(rng: random.Random, data: bytes, seeds) -> bytes:
    other = rng.choice(seeds)
    return data[:rng.randint(0, len(data))] + other[rng.randint(0, len(other)):]


def pause(rng: random.Random, data: bytes, seeds) -> bytes:
    at = rng.randint(1, max(1, len(data) - 1))
    return data[:at] + PAUSE + data[at:]


BYTE_OPS = [bit_flip, insert_bytes, delete_bytes, duplicate_chunk, truncate, splice, pause]


def random_h2_settings(rng: random.Random) -> bytes:
    """1-3 settings, ids 0-9 and beyond, values at and past the RFC 9113 limits."""
    ids = [1, 2, 3, 4, 5, 6, 8, 9, 0, 0xFFFF]
    values = [0, 1, 2, 16383, 16384, 65535, 2**24 - 1, 2**24, 2**31 - 1, 2**31, 2**32 - 1]
    return settings_payload({rng.choice(ids): rng.choice(values) for _ in range(rng.randint(1, 3))})


def injected_header(rng: random.Random) -> bytes:
    """A header line (or a few): one time in three a protocol switch (h2c or websocket), else a framing or
    parsing edge."""
    b64 = base64.urlsafe_b64encode(random_h2_settings(rng)).rstrip(b"=")
    if rng.random() < 1 / 3:
        return rng.choice([
            b"Upgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: " + b64,
            b"Upgrade: h2c\r\nHTTP2-Settings: " + rng.randbytes(6).hex().encode(),
            b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"
            b"Sec-WebSocket-Version: 13"])
    return rng.choice([
        b"Transfer-Encoding: chunked", b"Transfer-Encoding: gzip, chunked", b"Content-Length: -1",
        b"Content-Length: 99999999999999999999", b"Content-Length: 5, 6", b"Content-Length: 0",
        b"Expect: 100-continue", b"Host: a\r\nHost: b", b"X-Long: " + b"a" * rng.choice([100, 8000, 20000]),
        b" folded-continuation", b"Content-Type: text/plain", b"Content-Type: application/json; charset=\xff",
        b"Authorization: Bearer \x00", b"Origin: http://evil.example\r\nAccess-Control-Request-Method: POST",
        b"Connection: close", b"Connection: keep-alive, Upgrade", b"X:\xff\xfe", b"Bad Header: x"])


def inject_header(rng: random.Random, data: bytes, seeds) -> bytes:
    """A header line (or a few) right after the request line, or before the blank line that ends the head."""
    end = data.find(b"\r\n") if rng.random() < 0.5 else data.find(b"\r\n\r\n")
    if end < 0:
        return data + b"\r\n" + injected_header(rng)
    return data[:end] + b"\r\n" + injected_header(rng) + data[end:]


H1_OPS = BYTE_OPS + [inject_header, inject_header]

STREAM_IDS = [0, 1, 2, 3, 5, 7, 2**31 - 1, 2**31 | 1]


def control_frame(rng: random.Random) -> H2Frame:
    """A client frame of any type, mostly valid in shape but on any stream and with edge values."""
    sid = rng.choice(STREAM_IDS)
    makers = [
        lambda: [4, rng.choice([0, 1]), rng.choice([0, 0, sid]), random_h2_settings(rng)],  # SETTINGS (+ACK)
        lambda: [8, 0, sid, struct.pack(">I", rng.choice([0, 1, 65535, 2**31 - 1, 2**31, 2**32 - 1]))],
        lambda: [3, 0, sid, struct.pack(">I", rng.choice([0, 1, 2, 5, 8, 0xFFFFFFFF]))],  # RST_STREAM
        lambda: [2, 0, sid, struct.pack(">IB", rng.choice([sid, 0, 1, 3, 2**31 | sid]) & 0xFFFFFFFF,
                                        rng.randrange(256))],  # PRIORITY, self-dependency included
        lambda: [7, 0, rng.choice([0, sid]), struct.pack(">II", rng.choice([0, 1, 2**31 - 1]),
                                                         rng.randrange(14)) + b"bye"],  # GOAWAY
        lambda: [5, 0x4, sid, struct.pack(">I", 2) + h2_headers("GET", "/health")],  # PUSH_PROMISE
        lambda: [9, rng.choice([0, 0x4]), sid, h2_headers("GET", "/health")[:rng.randint(0, 12)]],  # CONTINUATION
        lambda: [6, rng.choice([0, 1]), rng.choice([0, 0, sid]), rng.randbytes(rng.choice([8, 8, 0, 9]))],
        lambda: [1, rng.choice([0x4, 0x5, 0x0, 0x25, 0x8]), sid, h2_headers(
            rng.choice(["GET", "POST", "CONNECT", ""]), rng.choice(["/health", "/v1/models", "", "*"]))],
        lambda: [0, rng.choice([0, 1, 8]), sid, rng.randbytes(rng.randint(0, 40))],  # DATA (maybe PADDED)
        lambda: [rng.randrange(10, 256), rng.randrange(256), sid, rng.randbytes(rng.randint(0, 16))],
    ]
    return rng.choice(makers)() + [None]


def _pick(rng: random.Random, frames: list[H2Frame]) -> H2Frame:
    real = [f for f in frames if f is not PAUSE]
    return rng.choice(real) if real else control_frame(rng)


def frame_length(rng, frames, seeds):
    f = _pick(rng, frames)
    n = len(f[3])
    f[4] = rng.choice([0, 1, max(0, n - 1), n + 1, 2**14, 2**14 + 1, 2**24 - 1, rng.randrange(2**24)])
    return frames


def frame_type(rng, frames, seeds):
    _pick(rng, frames)[0] = rng.randrange(11) if rng.random() < 0.7 else rng.randrange(256)
    return frames


def frame_flags(rng, frames, seeds):
    f = _pick(rng, frames)
    f[1] = f[1] ^ rng.choice([0x1, 0x4, 0x8, 0x20]) if rng.random() < 0.7 else rng.randrange(256)
    return frames


def frame_stream(rng, frames, seeds):
    _pick(rng, frames)[2] = rng.choice(STREAM_IDS) if rng.random() < 0.8 else rng.randrange(2**32)
    return frames


def frame_insert(rng, frames, seeds):
    frames.insert(rng.randint(0, len(frames)), control_frame(rng))
    return frames


def frame_reorder(rng, frames, seeds):
    """Drop, double or swap frames (or pause before one)."""
    i, j = rng.randrange(len(frames)), rng.randrange(len(frames))
    how = rng.randrange(4)
    if how == 0 and len(frames) > 1:
        del frames[i]
    elif how == 1:
        frames.insert(j, PAUSE if frames[i] is PAUSE else list(frames[i]))
    elif how == 2:
        frames[i], frames[j] = frames[j], frames[i]
    else:
        frames.insert(i, PAUSE)
    return frames


def frame_payload(rng, frames, seeds):
    f = _pick(rng, frames)
    f[3] = rng.choice([bit_flip, insert_bytes, delete_bytes, truncate, duplicate_chunk])(rng, f[3], seeds)
    return frames


H2_FRAME_OPS = [frame_length, frame_type, frame_flags, frame_stream, frame_insert, frame_insert, frame_reorder,
                frame_payload, frame_payload]

# ---------------------------------------------------------------------------------------------------
# inputs
# ---------------------------------------------------------------------------------------------------


@dataclass
class Case:
    proto: str  # "h1" (HTTP/1.1, the h2c upgrade included) or "h2" (prior knowledge)
    data: bytes  # what is sent; PAUSE marks where the sender waits for an answer
    ops: list  # the mutations applied, by name

    def __str__(self) -> str:
        return f"{self.proto} {'+'.join(self.ops)} {self.data[:300]!r}{'...' if len(self.data) > 300 else ''}"


def mutate_h1(rng: random.Random, seeds: list[bytes]) -> Case:
    data, ops = rng.choice(seeds), []
    for _ in range(rng.randint(1, 3)):
        op = rng.choice(H1_OPS)
        data, ops = op(rng, data, seeds), ops + [op.__name__]
    return Case("h1", data, ops)


def mutate_h2(rng: random.Random, frame_seeds: list[list[H2Frame]], seeds: list[bytes]) -> Case:
    frames = [f if f is PAUSE else list(f) for f in rng.choice(frame_seeds)]
    ops = []
    for _ in range(rng.randint(0, 3)):
        op = rng.choice(H2_FRAME_OPS)
        frames, ops = op(rng, frames, seeds), ops + [op.__name__]
    data = serialize_h2(frames)
    for _ in range(rng.randint(0 if ops else 1, 2)):
        op = rng.choice(BYTE_OPS)
        data, ops = op(rng, data, seeds), ops + [op.__name__]
    return Case("h2", data, ops)


def generate(seed: int):
    """An endless, seeded sequence of mutated inputs, HTTP/1.1 and HTTP/2 in turn."""
    rng = random.Random(seed)
    h1, h2 = h1_seeds(), h2_seeds()
    every = h1 + [serialize_h2(f) for f in h2]
    while True:
        yield mutate_h1(rng, h1 + every[len(h1):] * (rng.random() < 0.2))
        yield mutate_h2(rng, h2, every)


def known_cases() -> list[Case]:
    """Inputs that ended the whole server (pyserve on Hypercorn 0.18, h2 4.x) before connection errors were
    contained: each must now leave it running."""
    body = b"{}"
    early_404 = serialize_h2([[4, 0, 0, b"", None],
                              [1, 0x4, 1, h2_headers("POST", "/nope", (("content-type", "application/json"),)), None],
                              PAUSE, [0, 0x1, 1, body, None]])  # DATA after the 404 closed the stream: KeyError
    upgrade = h1_request("GET", "/health", headers=(
        "Connection: Upgrade, HTTP2-Settings", "Upgrade: h2c", "HTTP2-Settings: AAT_____"))  # INITIAL_WINDOW 2**32-1
    websocket = h1_request("GET", "/health", headers=(
        "Connection: Upgrade", "Upgrade: websocket", "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        "Sec-WebSocket-Version: 13")) + b"\x81\xff" + b"\x00" * 20  # a frame before the handshake's answer
    not_6n = h1_request("GET", "/health", headers=(
        "Connection: Upgrade, HTTP2-Settings", "Upgrade: h2c", "HTTP2-Settings: AAMAAABkAAQAAP__AAMA"))  # 15 bytes
    return [Case("h2", early_404, ["known:data-after-early-response"]),
            Case("h1", upgrade, ["known:h2c-upgrade-invalid-settings"]),
            Case("h1", not_6n, ["known:h2c-upgrade-settings-not-whole"]),
            Case("h1", websocket, ["known:websocket-bytes-before-accept"])]

# ---------------------------------------------------------------------------------------------------
# one connection: send, read back, find the status codes
# ---------------------------------------------------------------------------------------------------


async def _read_all(stream, got: bytearray, news: list) -> None:
    """Appends what the server sends until it closes or resets; sets the latest event in `news` per chunk."""
    try:
        while chunk := await stream.receive_some(65536):
            got += chunk
            news[0].set()
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def _answered(got: bytearray, news: list, before: int) -> None:
    """Returns once `got` holds more responses (status lines, :status) than `before`."""
    while len(statuses(bytes(got))) <= before:
        await news[0].wait()
        news[0] = trio.Event()


async def exchange(port: int, data: bytes, deadline: float = READ_DEADLINE) -> bytes:
    """Sends `data` on a fresh loopback connection (at each PAUSE: waits until the server has answered one more
    response, at most 0.3 s) and returns what came back until EOF, or `deadline` s after the last byte."""
    got, news = bytearray(), [trio.Event()]
    with trio.fail_after(10):
        stream = await trio.open_tcp_stream("127.0.0.1", port)
    async with stream:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_read_all, stream, got, news)
            with trio.move_on_after(5):
                try:
                    for i, part in enumerate(data.split(PAUSE)):
                        if i:
                            with trio.move_on_after(0.3):
                                await _answered(got, news, answered)
                        answered = len(statuses(bytes(got)))
                        await stream.send_all(part)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
            nursery.cancel_scope.deadline = trio.current_time() + deadline
    return bytes(got)


def _stand_in(conn: h11.Connection) -> None:
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
    conn.send(h11.EndOfMessage())


def h1_statuses(data: bytes) -> tuple[list[int], bytes]:
    """The status of each HTTP/1.1 response in `data` (h11 as the client of stand-in GETs), and the bytes after
    a 101 Switching Protocols (the h2c connection), else b""."""
    conn, codes = h11.Connection(h11.CLIENT), []
    _stand_in(conn)
    conn.receive_data(data)
    try:
        while True:
            event = conn.next_event()
            if isinstance(event, (h11.Response, h11.InformationalResponse)):
                codes.append(event.status_code)
                if event.status_code == 101:
                    return codes, conn.trailing_data[0]
            elif isinstance(event, h11.EndOfMessage):
                conn.start_next_cycle()
                _stand_in(conn)
            elif event is h11.NEED_DATA or isinstance(event, h11.ConnectionClosed):
                return codes, b""
    except (h11.RemoteProtocolError, h11.LocalProtocolError):
        return codes, b""


def h2_statuses(data: bytes) -> list[int]:
    """The :status of each complete header block (HEADERS + CONTINUATIONs) in a server's HTTP/2 bytes."""
    decoder, codes, block, pos = hpack.Decoder(), [], b"", 0
    decoder.max_allowed_table_size = 1 << 32  # a mutated SETTINGS may have offered the server a bigger table
    while pos + 9 <= len(data):
        try:
            f, length = Frame.parse_frame_header(memoryview(data[pos:pos + 9]))
            if pos + 9 + length > len(data):
                break
            f.parse_body(memoryview(data[pos + 9:pos + 9 + length]))
        except HyperframeError:
            break
        pos += 9 + length
        if f.type in (0x1, 0x9):
            block += f.data
            if "END_HEADERS" in f.flags:
                try:
                    headers = dict(decoder.decode(block, raw=True))
                except hpack.HPACKError:
                    break  # what the server encoded for a mutated peer: its statuses are not ours to read
                block = b""
                if b":status" in headers:
                    codes.append(int(headers[b":status"]))
    return codes


def statuses(data: bytes) -> list[int]:
    """Every response status in what a server sent on one connection: HTTP/1.1, HTTP/2, or h2c after a 101."""
    if not data.startswith(b"HTTP/"):
        return h2_statuses(data)
    codes, rest = h1_statuses(data)
    return codes + h2_statuses(rest) if rest else codes

# ---------------------------------------------------------------------------------------------------
# the honest client
# ---------------------------------------------------------------------------------------------------


def completion_body(prompt: str, max_tokens: int, stream: bool) -> dict:
    return {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream}


async def reference_text(url: str, prompt: str = PROMPT, max_tokens: int = MAX_TOKENS) -> str:
    """The non-streamed temperature-0 answer that every honest stream must repeat."""
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        r = await client.post("/v1/completions", json=completion_body(prompt, max_tokens, False))
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


async def stream_text(client: httpx.AsyncClient, http2: bool, prompt: str = PROMPT, max_tokens: int = MAX_TOKENS,
                      on_chunk: Callable[[], None] = lambda: None) -> str:
    """The text of one streamed temperature-0 completion; AssertionError unless it is a 200 over the client's
    protocol (`http2`: HTTP/2, else HTTP/1.1) whose chunks all carry text and end in a finish reason, then
    [DONE]."""
    parts, finish, done = [], None, False
    with trio.fail_after(90):
        async with client.stream("POST", "/v1/completions", json=completion_body(prompt, max_tokens, True)) as r:
            assert r.status_code == 200, (r.status_code, await r.aread())
            assert r.http_version == ("HTTP/2" if http2 else "HTTP/1.1"), r.http_version
            async for line in r.aiter_lines():
                if not line:
                    continue
                assert line.startswith("data: ") and not done, line
                if line == "data: [DONE]":
                    done = True
                    continue
                choice = json.loads(line[len("data: "):])["choices"][0]
                parts.append(choice["text"])
                finish = choice.get("finish_reason") or finish
                on_chunk()
    assert done and finish == "length", (done, finish)
    return "".join(parts)


def open_client(url: str, http2: bool) -> httpx.AsyncClient:
    """HTTP/1.1, or HTTP/2 with prior knowledge (h2c: no upgrade), as a router or proxy speaks it."""
    return httpx.AsyncClient(base_url=url, timeout=30, http2=http2, http1=not http2)


@dataclass
class Honest:
    """One client streaming the same temperature-0 completion again and again (HTTP/1.1 and h2c in turn) until
    told to stop; each text is checked against the non-streamed reference."""
    url: str
    reference: str
    prompt: str = PROMPT
    max_tokens: int = MAX_TOKENS
    protocols: tuple = (False, True)  # http2 per stream, in turn
    intact: int = 0  # streams that ended with the reference text
    wrong: list = field(default_factory=list)  # what each other stream gave: its text or its error

    async def run(self, stop: trio.Event, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """`started` once the first stream's first chunk is in; returns after the stream in flight when `stop`
        is set (at least one stream), or after 3 wrong ones."""
        clients = [open_client(self.url, h2) for h2 in self.protocols]
        started = False

        def first_chunk():
            nonlocal started
            if not started:
                started = True
                task_status.started()
        try:
            for i in itertools.count():
                http2 = self.protocols[i % len(clients)]
                try:
                    text = await stream_text(clients[i % len(clients)], http2, self.prompt, self.max_tokens,
                                             first_chunk)
                    self.intact += text == self.reference
                    if text != self.reference:
                        self.wrong.append(text)
                except (httpx.HTTPError, AssertionError, trio.TooSlowError) as e:
                    self.wrong.append(repr(e))
                if (stop.is_set() and (self.intact or self.wrong)) or len(self.wrong) >= 3:
                    break
        finally:
            first_chunk()  # a run that never got a chunk still lets its starter go on (and reports it wrong)
            for c in clients:
                await c.aclose()

# ---------------------------------------------------------------------------------------------------
# a run: batches of inputs against one server, the honest client streaming throughout
# ---------------------------------------------------------------------------------------------------


def server_error(status: int) -> bool:
    """A 5xx but 501: h11's answer to a transfer coding it does not implement (RFC 9112 6.1), never pyserve's.
    (503 is pyserve's answer while it drains, which no fuzzing overlaps.)"""
    return status >= 500 and status != 501


@dataclass
class Finding:
    signature: str  # where and what ended the server (see crash_signature)
    case: Optional[Case]  # the input that did it alone, when the replay found one
    log: str  # its traceback (the tail of the server's stderr)
    count: int = 1


@dataclass
class Tally:
    tried: Counter = field(default_factory=Counter)  # inputs sent, by protocol
    fivexx: Counter = field(default_factory=Counter)  # inputs answered with a 5xx status, by protocol
    exits: Counter = field(default_factory=Counter)  # server exits, by the protocol of the input that did it
    codes: Counter = field(default_factory=Counter)  # every status answered
    fivexx_cases: list = field(default_factory=list)  # (case, statuses) of the first 20 answered 5xx
    findings: dict = field(default_factory=dict)  # signature -> Finding
    honest_intact: int = 0
    honest_wrong: list = field(default_factory=list)
    stop_code: Optional[int] = None  # the exit status after SIGTERM at the end of a run
    stray: list = field(default_factory=list)  # stray_tracebacks of that last server
    contained: int = 0  # connection errors the servers logged as contained (CONTAINED records)

    @property
    def total(self) -> int:
        return sum(self.tried.values())

    def record(self, case: Case, codes: list[int]) -> None:
        self.tried[case.proto] += 1
        self.codes.update(codes)
        if any(server_error(c) for c in codes):
            self.fivexx[case.proto] += 1
            if len(self.fivexx_cases) < 20:
                self.fivexx_cases.append((case, codes))


async def _try_case(port: int, case: Case, tally: Tally) -> None:
    try:
        got = await exchange(port, case.data)
    except (OSError, trio.TooSlowError):  # refused or no accept: the server is gone, seen after the batch
        got = b""
    tally.record(case, statuses(got))


async def healthy(srv, client: httpx.AsyncClient, timeout: float = 10.0) -> bool:
    """The server process still runs and answers GET /health with 200 within `timeout` s."""
    with trio.move_on_after(timeout):
        while srv.proc.poll() is None:
            try:
                if (await client.get("/health")).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            await trio.sleep(0.05)
    return False


async def exit_note(srv, wait: float = 5.0) -> str:
    """For a failure message about a server that stopped answering: its exit status once it has exited (up to
    `wait` s), what ended it (crash_signature) and the tail of its stderr."""
    with trio.move_on_after(wait):
        while srv.proc.poll() is None:
            await trio.sleep(0.05)
    log = "".join(srv.stderr)
    return f"server exit status {srv.proc.poll()} ({crash_signature(log)}):\n{log[-6000:]}"


async def fuzz_batches(srv, cases, until: float, max_inputs: int, tally: Tally, batch: int) -> list[Case]:
    """Sends `cases` `batch` at a time (concurrently, a connection each) until `max_inputs` in all or the
    time.monotonic() deadline `until`; after each batch the server must run and answer /health. Returns []
    or, when it did not, the last two batches (the culprit's exit may lag its batch)."""
    previous: list[Case] = []
    async with httpx.AsyncClient(base_url=srv.url, timeout=10) as client:
        while tally.total < max_inputs and time.monotonic() < until:
            group = list(itertools.islice(cases, min(batch, max_inputs - tally.total)))
            if not group:
                break
            async with trio.open_nursery() as nursery:
                for case in group:
                    nursery.start_soon(_try_case, srv.port, case, tally)
            if not await healthy(srv, client):
                return previous + group
            previous = group
    return []


async def session(srv, cases, until: float, max_inputs: int, tally: Tally, batch: int = 8) -> list[Case]:
    """One server's share of a run (see fuzz_batches), with the honest client streaming all along; its intact
    streams are added to `tally`, and its wrong ones unless the server died under them."""
    honest = Honest(srv.url, await reference_text(srv.url))
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        await nursery.start(honest.run, stop)
        suspects = await fuzz_batches(srv, cases, until, max_inputs, tally, batch)
        stop.set()
        if suspects:
            nursery.cancel_scope.cancel()
    tally.honest_intact += honest.intact
    if not suspects:
        tally.honest_wrong += honest.wrong
    return suspects

# ---------------------------------------------------------------------------------------------------
# the server's log: what ended it, and tracebacks that no contained connection error accounts for
# ---------------------------------------------------------------------------------------------------

FILE_LINE = re.compile(r'File "([^"]+)", line \d+, in (\S+)')
EXC_LINE = re.compile(r"[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)(:|$)")
LOG_RECORD = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (\w+) ([\w.]+): (.*)")  # runner.py's log format
# the record a connection's error is logged with once contained (any pyserve.server logger, a warning or
# worse, naming the connection); its traceback may follow it
CONTAINED = re.compile(r"(WARNING|ERROR|CRITICAL) pyserve\.server[\w.]*: .*connection", re.IGNORECASE)


def crash_signature(log: str) -> str:
    """'file:function: exception' of the error that ended a server, digits as N: the last exception line of
    its log that is not a group or a cancellation, where the traceback's last frame before it ran; or the
    'pyserve: error:' line that run() prints for an OSError / ValueError that reached it."""
    where = at = what = ""
    for line in log.splitlines():
        line = re.sub(r"^[\s|+]*", "", line)
        if m := FILE_LINE.match(line):
            where = f"{Path(m[1]).name}:{m[2]}"
        elif EXC_LINE.match(line) and not line.startswith(("ExceptionGroup", "BaseExceptionGroup", "trio.")):
            at, what = where, line
        elif line.startswith("pyserve: error:"):
            at, what = "runner", line
    return re.sub(r"\b\d+\b", "N", f"{at}: {what}"[:200]) if what else "exit without a traceback"


def stray_tracebacks(lines: list[str]) -> list[str]:
    """Each traceback in a server's stderr lines (with the record line before it, up to the next record) whose
    log record (the last record line before it) is not a contained connection error's (CONTAINED); one
    printed at exit has no record of its own."""
    stray, record = [], ""
    for i, line in enumerate(lines):
        if LOG_RECORD.match(line):
            record = line
        elif line.startswith(("Traceback (most recent call last)", "  + Exception Group Traceback")):
            if not CONTAINED.search(record):
                end = next((j for j in range(i, len(lines)) if LOG_RECORD.match(lines[j])), len(lines))
                stray.append("".join(lines[max(0, i - 1):end]))
    return stray


# ---------------------------------------------------------------------------------------------------
# by hand: a long run that survives the server's exits
# ---------------------------------------------------------------------------------------------------


def start_server(extra: list[str]):
    from pyserve.bench.launch import ServerProcess

    return ServerProcess("--stalled-client-timeout", "5", "--drain-timeout", "5", *extra, threads=1).wait_ready()


class SharedServer:
    """The server a test module shares: `live()` starts it, and starts a new one when an input has ended the
    last (that test has failed; the next ones still run); `close()` stops it with SIGTERM."""

    def __init__(self, *extra: str):
        self.extra, self.srv = list(extra), None

    def live(self):
        if self.srv is None or not self._answers():
            if self.srv is not None:
                self.srv.stop(signal.SIGKILL, timeout=10)  # gone, or on its way out
            self.srv = start_server(self.extra)
        return self.srv

    def _answers(self) -> bool:
        try:
            return self.srv.proc.poll() is None and httpx.get(self.srv.url + "/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def close(self) -> tuple[int, list[str]]:
        """(its exit status, its stray tracebacks)"""
        if self.srv is None:
            return 0, []
        code = self.srv.stop()
        return code, stray_tracebacks(self.srv.stderr)


def find_culprit(suspects: list[Case], extra: list[str]) -> tuple[Optional[Case], str]:
    """Replays the suspects one at a time on a fresh server (each replay waits up to 1.5 s for an exit): the
    first after which it exits, and its stderr; (None, "") when none does on its own."""
    srv = start_server(extra)
    try:
        for case in suspects:
            trio.run(exchange, srv.port, case.data)
            try:
                srv.proc.wait(1.5)
            except subprocess.TimeoutExpired:
                continue
            srv.stop()
            return case, "".join(srv.stderr)
    finally:
        srv.stop()
    return None, ""


def record_exit(srv, suspects: list[Case], tally: Tally, crash_dir: Path, extra: list[str]) -> Finding:
    log = "".join(srv.stderr)
    sig = crash_signature(log)
    found = tally.findings.get(sig)
    if found:
        found.count += 1
    else:
        case, replay_log = find_culprit(suspects, extra)
        found = tally.findings[sig] = Finding(sig, case, (replay_log or log)[-6000:])
        crash_dir.mkdir(parents=True, exist_ok=True)
        stem = crash_dir / f"exit-{len(tally.findings)}"
        for i, c in enumerate([case] if case else suspects):
            (stem.parent / f"{stem.name}-{i}.{c.proto}.bin").write_bytes(c.data)
        (stem.parent / f"{stem.name}.txt").write_text(
            f"{sig}\n\n" + "\n".join(map(str, [case] if case else suspects)) + "\n\n" + found.log)
    tally.exits[found.case.proto if found.case else "?"] += 1
    return found


def fuzz(args) -> Tally:
    cases = itertools.chain(known_cases() if args.known else [], generate(args.seed))
    until = time.monotonic() + args.seconds
    tally = Tally()
    while tally.total < args.inputs and time.monotonic() < until:
        srv = start_server(args.server_arg)
        suspects = trio.run(session, srv, cases, until, args.inputs, tally, args.batch)
        code = srv.stop(timeout=30 if not suspects else 10)
        tally.contained += sum(bool(CONTAINED.search(line)) for line in srv.stderr)
        if not suspects:
            tally.stop_code, tally.stray = code, stray_tracebacks(srv.stderr)
            break
        found = record_exit(srv, suspects, tally, Path(args.crash_dir), args.server_arg)
        print(f"server exit after input {tally.total}: {found.signature}", flush=True)
    return tally


def report(tally: Tally, seconds: float) -> list[str]:
    out = [f"{seconds:.0f} s, {tally.total} inputs ({tally.total / max(seconds, 1e-9):.1f}/s)"]
    for proto in sorted(set(tally.tried) | set(tally.exits)):
        out.append(f"  {proto}: {tally.tried[proto]} tried, {tally.exits[proto]} server exits, "
                   f"{tally.fivexx[proto]} answered 5xx")
    out.append(f"  statuses: {dict(sorted(tally.codes.items()))}")
    out.append(f"  honest streams: {tally.honest_intact} intact, {len(tally.honest_wrong)} wrong "
               f"{tally.honest_wrong[:3]}")
    out.append(f"  connection errors contained: {tally.contained}")
    out.append(f"  SIGTERM at the end: exit {tally.stop_code}, {len(tally.stray)} stray tracebacks")
    for sig, n in Counter(crash_signature(t) for t in tally.stray).items():
        out.append(f"  stray traceback x{n}: {sig}")
    for f in tally.findings.values():
        out.append(f"  EXIT x{f.count}: {f.signature}\n      input: {f.case or 'not reproduced alone'}")
    for case, codes in tally.fivexx_cases:
        out.append(f"  5xx {codes}: {case}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--inputs", type=int, default=10**9, help="stop after this many inputs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=8, help="inputs in flight at once")
    p.add_argument("--known", action="store_true", help="start with the inputs that used to end the server")
    p.add_argument("--crash-dir", default="/tmp/fuzz_wire", help="where the inputs that ended it are saved")
    p.add_argument("--server-arg", action="append", default=[], help="an extra `pyserve serve` argument")
    args = p.parse_args(argv)
    t0 = time.monotonic()
    tally = fuzz(args)
    print("\n".join(report(tally, time.monotonic() - t0)))
    bad = tally.findings or tally.fivexx or tally.honest_wrong or tally.stray or tally.stop_code != 0
    return 1 if bad else 0


if __name__ == "__main__":
    root = Path(__file__).resolve().parent.parent
    if (root / "pyserve").is_dir():
        sys.path.insert(0, str(root))  # this checkout's pyserve (built in place), not another installed one
    sys.exit(main())
