"""A real `pyserve serve` for tests on loopback, and what its tests read of it: SSE bodies, /metrics, a raw
socket to hang up on, a bounded poll."""
from __future__ import annotations

import json
import socket
import time

import httpx
import openai
import pytest

from pyserve.bench.launch import ServerProcess as Server
from pyserve.bench.prometheus import parse_metrics, totals

MODEL = "gemma-3-270m-q4_k_m"


def sse_events(text: str) -> list:
    """Every event of an SSE body, checking the framing: `data: ...` lines, each followed by a blank line."""
    assert text.endswith("\n\n")
    events = []
    for block in text.split("\n\n")[:-1]:
        assert block.startswith("data: "), block
        payload = block[len("data: "):]
        events.append(payload if payload == "[DONE]" else json.loads(payload))
    return events


def metric_totals(text: str) -> dict:
    """pyserve's metrics in a /metrics text by name without the `pyserve:` prefix, each summed over its labels."""
    return totals(parse_metrics(text)[0], "pyserve:")


def stats(server) -> dict:
    return metric_totals(httpx.get(server.url + "/metrics").text)


def raw_completion(server, max_tokens: int, stream: bool, events: int = 0) -> socket.socket:
    """A long completion POSTed over a bare socket, so that the test can hang up whenever it likes; returns
    once `events` SSE data events have arrived."""
    body = json.dumps({"prompt": "Tell me a long story.", "max_tokens": max_tokens, "ignore_eos": True,
                       "stream": stream}).encode()
    s = socket.create_connection(("127.0.0.1", server.port))
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
              + str(len(body)).encode() + b"\r\n\r\n" + body)
    got = b""
    while got.count(b"data: {") < events:
        got += s.recv(65536)
    return s


CHAT = [{"role": "user", "content": "Write a short poem about the sea."}]


def metrics(url: str) -> dict:
    return parse_metrics(httpx.get(url + "/metrics").text)[0]


def poll(condition, timeout: float = 60.0, what: str = ""):
    """A bounded poll: condition() until it returns something true."""
    deadline = time.monotonic() + timeout
    while True:
        got = condition()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.fixture(scope="module", name="server")
def one_thread_server():
    """A module's `server` with one engine thread (import it into the module to use it)."""
    s = Server(threads=1).wait_ready()
    yield s
    assert s.stop() == 0, "".join(s.stderr)[-3000:]


@pytest.fixture(scope="module", name="client")
def one_thread_client(server):
    """The openai SDK's client of that `server`."""
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
