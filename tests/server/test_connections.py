"""One connection's failure stays inside it (pyserve/server/http/connection.py): a real server, real clients on
loopback, a fault injected into one connection's send path while other streams run."""
from __future__ import annotations

import json

import httpx
import pytest
from hypercorn.trio import run as hypercorn_run

from pyserve.bench.launch import ServerProcess
from pyserve.bench.prometheus import parse_metrics, total
from pyserve.server.http import connection

MARKER = "pyserve-fault-7f3a9c"  # the test-only fault hook: a connection whose outgoing bytes hold it fails
STORY = {"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0, "ignore_eos": True}


def test_install_points_hypercorn_at_the_contained_server():
    from hypercorn import protocol

    from pyserve.server.http.h2_streams import TotalH2Protocol

    connection.install()
    assert hypercorn_run.TCPServer is connection.ContainedTCPServer
    assert protocol.H2Protocol is TotalH2Protocol


def test_split_contained_holds_errors_and_passes_cancellation():
    import trio

    held, rest = connection.split_contained(ValueError("x"))
    assert isinstance(held, ValueError) and rest is None
    held, rest = connection.split_contained(KeyboardInterrupt())
    assert held is None and isinstance(rest, KeyboardInterrupt)
    group = BaseExceptionGroup("g", [KeyError("k"), trio.Cancelled._create()])
    held, rest = connection.split_contained(group)
    assert [type(e) for e in held.exceptions] == [KeyError]
    assert [type(e) for e in rest.exceptions] == [trio.Cancelled]
    assert connection.error_kind(group) == "KeyError"


@pytest.fixture
def faulty(monkeypatch):
    monkeypatch.setenv("PYSERVE_FAULT_MARKER", MARKER)
    srv = ServerProcess(threads=1).wait_ready()
    yield srv
    srv.stop()


def _stream_text(client: httpx.Client, url: str) -> str:
    text = ""
    with client.stream("POST", url + "/v1/completions", json=dict(STORY, stream=True)) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                text += json.loads(line[6:])["choices"][0]["text"]
    return text


def _faulted_request(url: str, http2: bool) -> None:
    """An /apply-template whose answer carries the marker: the connection's send raises."""
    body = {"messages": [{"role": "user", "content": MARKER}]}
    with httpx.Client(http2=http2, http1=not http2, timeout=30) as c:
        with pytest.raises(httpx.TransportError):
            c.post(url + "/apply-template", json=body)


def test_a_fault_in_one_connection_leaves_the_server_and_other_streams(faulty):
    url = faulty.url
    expected = httpx.post(url + "/v1/completions", json=STORY, timeout=60).json()["choices"][0]["text"]
    with httpx.Client(http2=True, http1=False, timeout=60) as h2:  # one h2 connection, streaming throughout
        with h2.stream("POST", url + "/v1/completions", json=dict(STORY, stream=True)) as r:
            lines = r.iter_lines()
            first = next(line for line in lines if line.startswith("data: {"))
            _faulted_request(url, http2=True)
            _faulted_request(url, http2=False)
            text = json.loads(first[6:])["choices"][0]["text"]
            text += "".join(json.loads(line[6:])["choices"][0]["text"] for line in lines
                            if line.startswith("data: {"))
        assert text == expected
        assert _stream_text(h2, url) == expected  # the same connection serves on
    assert httpx.get(url + "/health").status_code == 200
    samples, _ = parse_metrics(httpx.get(url + "/metrics").text)
    assert total(samples, "pyserve:connection_errors_total", kind="RuntimeError") >= 1
    assert total(samples, "pyserve:kv_blocks_used") == 0
    assert faulty.stop() == 0, "".join(faulty.stderr)[-3000:]
    log = "".join(faulty.stderr)
    assert "ended by RuntimeError (contained" in log


def _h2_request(conn, sid: int, body: dict) -> None:
    data = json.dumps(body).encode()
    conn.send_headers(sid, [(":method", "POST"), (":path", "/v1/completions"), (":scheme", "http"),
                            (":authority", "127.0.0.1"), ("content-type", "application/json"),
                            ("content-length", str(len(data)))])
    conn.send_data(sid, data, end_stream=True)


def test_drain_finishes_h2_streams_then_sends_goaway():
    """SIGTERM with an HTTP/2 stream in flight: the stream runs to its end, a stream opened after the signal
    is refused, the connection ends with GOAWAY, and the process exits 0."""
    import socket

    import h2.config
    import h2.connection
    import h2.errors
    import h2.events

    srv = ServerProcess("--drain-timeout", "30", threads=1).wait_ready()
    try:
        sock = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        _h2_request(conn, 1, dict(STORY, max_tokens=64, stream=True))
        sock.sendall(conn.data_to_send())
        events, signalled, ended, refused, goaway = [], False, False, False, False
        while True:  # to the end of the connection: GOAWAY must come after stream 1's last frame
            data = sock.recv(65536)
            if not data:
                break
            for ev in conn.receive_data(data):
                events.append(ev)
                if isinstance(ev, h2.events.DataReceived):
                    conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                    if not signalled:  # the stream is flowing: stop the server, then ask for more
                        srv.proc.send_signal(15)
                        signalled = True
                        assert _wait_for_line(srv, "draining")
                        _h2_request(conn, 3, STORY)
                ended |= isinstance(ev, h2.events.StreamEnded) and ev.stream_id == 1 and not goaway
                refused |= (isinstance(ev, h2.events.StreamReset) and ev.stream_id == 3
                            and ev.error_code == h2.errors.ErrorCodes.REFUSED_STREAM)
                goaway |= isinstance(ev, h2.events.ConnectionTerminated)
            if goaway:
                break
            sock.sendall(conn.data_to_send())
        body = b"".join(ev.data for ev in events if isinstance(ev, h2.events.DataReceived) and ev.stream_id == 1)
        kinds = [type(ev).__name__ for ev in events if not isinstance(ev, h2.events.DataReceived)]
        assert ended and refused and goaway, kinds
        assert body.endswith(b"data: [DONE]\n\n") and b"server shutting down" not in body, body[-300:]
        assert srv.proc.wait(30) == 0
    finally:
        srv.stop()


def _wait_for_line(srv: ServerProcess, text: str, timeout: float = 10.0) -> bool:
    """A bounded poll of the server's log for a line holding `text`."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if any(text in line for line in srv.stderr):
            return True
        time.sleep(0.02)
    return False


def test_an_idle_h2_connection_gets_goaway_at_shutdown():
    import socket

    import h2.config
    import h2.connection
    import h2.events

    srv = ServerProcess(threads=1).wait_ready()
    try:
        sock = socket.create_connection(("127.0.0.1", srv.port), timeout=30)
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        _h2_request(conn, 1, dict(STORY, max_tokens=2))
        sock.sendall(conn.data_to_send())
        seen, signalled = [], False
        while not any(isinstance(ev, h2.events.ConnectionTerminated) for ev in seen):
            data = sock.recv(65536)
            if not data:
                break
            seen += conn.receive_data(data)
            if not signalled and any(isinstance(ev, h2.events.StreamEnded) for ev in seen):
                srv.proc.send_signal(15)  # the connection is idle now
                signalled = True
            sock.sendall(conn.data_to_send())
        assert any(isinstance(ev, h2.events.StreamEnded) and ev.stream_id == 1 for ev in seen)
        assert [ev.last_stream_id for ev in seen if isinstance(ev, h2.events.ConnectionTerminated)] == [1]
        assert srv.proc.wait(30) == 0
    finally:
        srv.stop()


async def test_64_requests_multiplexed_on_one_h2_connection():
    """Prior-knowledge h2c (what routers use): 64 requests on one connection at once, streamed and not; 4
    streams reset mid-way (RST_STREAM). The survivors' text is the reference's, the resets count as aborted
    requests, and every KV block comes back."""
    import trio

    prompts = ["Once upon a time", "The capital of France", "1, 2, 3,", "def main():"]
    body = {"max_tokens": 16, "temperature": 0, "ignore_eos": True}
    srv = ServerProcess().wait_ready()
    try:
        ref = [httpx.post(srv.url + "/v1/completions", json=dict(body, prompt=p), timeout=60).json()
               ["choices"][0]["text"] for p in prompts]
        before, _ = parse_metrics(httpx.get(srv.url + "/metrics").text)
        got: dict[int, str] = {}

        async def one(client, i: int) -> None:
            req = dict(body, prompt=prompts[i % 4])
            if i % 2:  # not streamed
                r = await client.post("/v1/completions", json=req)
                got[i] = r.json()["choices"][0]["text"]
                return
            text, chunks, reset = "", 0, i % 16 == 0
            if reset:  # long enough that the reset lands mid-generation
                req["max_tokens"] = 2000
            async with client.stream("POST", "/v1/completions", json=dict(req, stream=True)) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: {"):
                        text += json.loads(line[6:])["choices"][0]["text"]
                        chunks += 1
                        if reset and chunks == 3:
                            return  # leaving the block resets this stream only
            got[i] = text

        with trio.fail_after(120):
            async with httpx.AsyncClient(base_url=srv.url, http2=True, http1=False, timeout=60) as client:
                async with trio.open_nursery() as nursery:
                    for i in range(64):
                        nursery.start_soon(one, client, i)
                assert (await client.get("/health")).http_version == "HTTP/2"
        assert sorted(got) == [i for i in range(64) if i % 16] and all(got[i] == ref[i % 4] for i in got)
        aborted = lambda m: total(m, "pyserve:request_aborted_total")  # noqa: E731
        with trio.move_on_after(30):
            while True:
                after, _ = parse_metrics(httpx.get(srv.url + "/metrics").text)
                if total(after, "pyserve:kv_blocks_used") == 0 and aborted(after) - aborted(before) == 4:
                    break
                await trio.sleep(0.05)
        assert total(after, "pyserve:kv_blocks_used") == 0
        assert aborted(after) - aborted(before) == 4
        assert total(after, "pyserve:num_requests_running") == 0
        assert total(after, "pyserve:connection_errors_total") == 0
    finally:
        assert srv.stop() == 0
