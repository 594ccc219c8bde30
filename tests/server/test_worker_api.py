"""The worker endpoints SGLang's and vLLM's routers read (pyserve/server/routes/worker.py): each field a router
reads, with the value it must have, on a real replica; /health while loading (the app before its engine) and
while draining (a real process after SIGTERM)."""
from __future__ import annotations

import json
import signal
import socket
import threading
import time

import httpx
import pytest

from pyserve.bench.launch import ServerProcess
from pyserve.server.app import create_app
from support.live_server import MODEL

UNSIGNED = ("dp_size", "max_total_tokens", "max_running_requests", "max_prefill_tokens")  # sglang-router: usize


@pytest.fixture(scope="module")
def replica():
    # one running sequence at a time, so a second request waits (num_waiting_reqs)
    with ServerProcess("--max-num-seqs", "1", threads=1) as srv:
        yield srv


def _stream(url: str, first: threading.Event, lines: list, max_tokens: int = 2000) -> None:
    """A completion stream; `first` set at its first chunk, every data line kept."""
    body = {"prompt": "Tell me a long story", "max_tokens": max_tokens, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                lines.append(line[6:])
                first.set()


def _load(url: str) -> dict:
    entries = httpx.get(url + "/get_load").json()
    assert isinstance(entries, list) and len(entries) == 1  # one entry per data-parallel rank
    return entries[0]


def test_server_info_fields(replica):
    info = httpx.get(replica.url + "/server_info").json()
    assert httpx.get(replica.url + "/get_server_info").json().keys() == info.keys()
    # sglang-router lists served_model_name (else model_path) as the model id; it also reads `model`
    assert info["served_model_name"] == MODEL and info["model"] == MODEL
    cfg = info["engine_config"]
    assert {k: info[k] for k in UNSIGNED} == {
        "dp_size": 1, "max_total_tokens": cfg["num_kv_blocks"] * cfg["block_size"], "max_running_requests": 1,
        "max_prefill_tokens": cfg["max_num_batched_tokens"]}
    assert all(isinstance(info[k], int) and info[k] >= 0 for k in UNSIGNED)


def test_model_info_fields(replica):
    sglang = {"model_path": MODEL, "tokenizer_path": MODEL, "is_generation": True, "preferred_sampling_params": None,
              "weight_version": "default", "has_image_understanding": False, "has_audio_understanding": False,
              "model_type": "gemma3", "architectures": ["gemma3"]}
    assert httpx.get(replica.url + "/get_model_info").json() == sglang
    info = httpx.get(replica.url + "/model_info").json()
    assert {k: info[k] for k in sglang} == sglang  # sglang-router reads model_type and architectures here
    assert info["model"] == MODEL and info["path"].endswith(".gguf") and info["hparams"]["n_vocab"] > 0


def _until(fetch, ok, timeout: float = 30.0):
    """fetch() again every 50 ms until ok(value) or `timeout` s; the last value."""
    deadline = time.monotonic() + timeout
    value = fetch()
    while not ok(value) and time.monotonic() < deadline:
        time.sleep(0.05)
        value = fetch()
    return value


def test_get_load_running_and_waiting(replica):
    total = httpx.get(replica.url + "/server_info").json()["stats"]["blocks_total"]
    idle = {"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0, "num_running_reqs": 0,
            "kv_blocks_used": 0, "kv_blocks_total": total, "kv_usage": 0.0}
    assert _load(replica.url) == idle
    events, lines = [threading.Event(), threading.Event()], [[], []]
    streams = [threading.Thread(target=_stream, args=(replica.url, events[i], lines[i], n), daemon=True)
               for i, n in enumerate((300, 4))]
    streams[0].start()
    assert events[0].wait(60)
    streams[1].start()  # with --max-num-seqs 1 it waits behind the first
    load = _until(lambda: _load(replica.url), lambda v: v["num_waiting_reqs"] == 1)
    assert (load["num_reqs"], load["num_running_reqs"], load["num_waiting_reqs"]) == (2, 1, 1), load
    used = load["kv_blocks_used"]
    assert used > 0 and load["num_tokens"] == 16 * used and load["kv_usage"] == round(used / total, 4)
    assert not events[1].is_set()  # not started: what a router reads as queued
    for t in streams:
        t.join(60)
    assert [ls[-1] for ls in lines] == ["[DONE]", "[DONE]"]
    assert _until(lambda: _load(replica.url), lambda v: v == idle) == idle


async def test_health_503_while_loading():
    """The app before its engine is set (what `pyserve serve` answers while the model loads)."""
    app = create_app(None)
    client = app.test_client()
    r = await client.get("/health")
    assert r.status_code == 503 and await r.get_json() == {"status": "loading"}
    for path in ("/get_load", "/get_model_info"):
        r = await client.get(path)
        assert r.status_code == 503, path


def test_health_503_while_draining():
    """SIGTERM with a stream in flight: the replica keeps listening through its drain, /health answers 503 on a
    new connection (a router's check reads 'out', not 'crashed') and a new request 503 (retried elsewhere),
    the stream runs to its end; then the listener closes and the process exits 0."""
    with ServerProcess("--drain-timeout", "60", threads=1) as srv:
        first, lines = threading.Event(), []
        t = threading.Thread(target=_stream, args=(srv.url, first, lines, 400), daemon=True)
        t.start()
        assert first.wait(60)
        srv.proc.send_signal(signal.SIGTERM)
        # the signal is handled in the server's next loop turn
        r = _until(lambda: httpx.get(srv.url + "/health", timeout=5), lambda r: r.status_code != 200, 10)
        assert r.status_code == 503 and r.json() == {"status": "shutting down"}
        r = httpx.post(srv.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["message"] == "server shutting down"
        assert t.is_alive()  # 400 tokens on one thread: still streaming when both answered
        t.join(60)
        assert lines[-1] == "[DONE]" and json.loads(lines[-2])["choices"][0]["finish_reason"] == "length"
        assert srv.proc.wait(30) == 0
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", srv.port), timeout=5).close()
