"""One connection's failure stays inside it (pyserve/server/connection.py): a real server, real clients on
loopback, a fault injected into one connection's send path while other streams run."""
from __future__ import annotations

import json

import httpx
import pytest
from hypercorn.trio import run as hypercorn_run

from pyserve.bench.launch import ServerProcess
from pyserve.bench.prometheus import parse_metrics, total
from pyserve.server import connection

MARKER = "pyserve-fault-7f3a9c"  # the test-only fault hook: a connection whose outgoing bytes hold it fails
STORY = {"prompt": "Once upon a time", "max_tokens": 48, "temperature": 0, "ignore_eos": True}


def test_install_points_hypercorn_at_the_contained_server():
    connection.install()
    assert hypercorn_run.TCPServer is connection.ContainedTCPServer


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
