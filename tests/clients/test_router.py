"""pyserve behind sglang-router (PyPI sglang-router 0.3.2, the Rust router SGLang deployments use): two real
replicas and a real router on loopback ports, shared traffic through it (issues 11 and 17). The setup and the
traffic are scripts/router_traffic.py's (which runs the same for minutes).

What the router asks of a worker (its source, sgl-model-gateway, and what it sent on the wire here):
- registering a worker, once at its start: GET /health over HTTP/1.1 and, alongside, two gRPC health probes
  over HTTP/2 with prior knowledge (POST /sglang.grpc.scheduler.SglangScheduler/HealthCheck and
  /vllm.grpc.engine.VllmEngine/HealthCheck), again every 1-3 s until /health answers 200; then GET /server_info,
  whose `served_model_name` (else `model_path`) becomes the model id it lists in /v1/models, and GET /model_info
  (`model_type`, `architectures`; optional);
- traffic: POST /v1/completions and /v1/chat/completions over HTTP/1.1 (a keep-alive pool), the body parsed and
  re-serialised (it adds no_stop_trim, ignore_eos, skip_special_tokens, return_hidden_states, which pyserve
  ignores), `model` as the client sent it; GET /health every 60 s;
- any non-2xx answer counts against the worker's circuit breaker: 10 in a row open it for 60 s, and once all
  are open every request gets 503 no_available_workers; 408/429/500/502/503/504 are retried (5 attempts), so a
  replica that dies can hide behind retries: the test watches the processes themselves.
"""
from __future__ import annotations

import contextlib
import importlib.util
import socket
import subprocess
import sys
import time
from functools import partial

import h2.config  # Hypercorn's HTTP/2 library, here the client side of a replayed probe
import h2.connection
import httpx
import pytest
import trio

from pyserve.bench.launch import ServerProcess
from support.live_server import MODEL
from support.paths import SCRIPTS

sys.path.insert(0, str(SCRIPTS))
import router_traffic as rt

REQUESTS, CONCURRENCY, MAX_TOKENS = 40, 4, 24


def _stderr(replicas: list) -> str:
    return "\n".join(f"--- replica {i}, its last stderr lines:\n{''.join(r.stderr[-20:])}"
                     for i, r in enumerate(replicas))


def _assert_up(replicas: list, when: str) -> None:
    down = {i: why for i, r in enumerate(replicas) if (why := rt.replica_down(r))}
    for i in down:  # a crashed replica exits by itself once its traceback is written: give it 10 s
        with contextlib.suppress(subprocess.TimeoutExpired):
            replicas[i].proc.wait(10)
        replicas[i].stop()
    assert not down, f"replicas down {when}: {down}\n{_stderr(replicas)}"


async def _traffic(d: "rt.Deployment", refs: dict, concurrency: int = CONCURRENCY,
                   requests: int = REQUESTS) -> "rt.Tally":
    with trio.fail_after(180):
        return await rt.shared_traffic(d.router.url, MODEL, refs, d.replicas, concurrency=concurrency,
                                       max_tokens=MAX_TOKENS, requests=requests)


def _served(d: "rt.Deployment") -> list[dict]:
    return [trio.run(rt.settle, r.url) for r in d.replicas]


def test_shared_traffic_through_router():
    """40 requests, 4 in flight, completions and chat, streamed and not: every one 200 with the text a replica
    gives alone, 20 served by each replica (round robin), both replicas alive throughout, no KV block left in
    use, and exit code 0 on SIGTERM."""
    if not rt.router_installed():
        pytest.fail(rt.ROUTER_MISSING)
    with rt.Deployment() as d:
        _assert_up(d.replicas, "once the router registered them")  # its gRPC probes: see the next test
        info = httpx.get(d.replicas[0].url + "/server_info").json()
        assert info["served_model_name"] == MODEL and info["model_path"].endswith(".gguf")
        assert rt.router_models(d.router.url) == [MODEL]  # the served name, not the GGUF file (issue 17)
        workers = httpx.get(d.router.url + "/workers").json()["workers"]
        assert sorted(w["url"] for w in workers) == sorted(r.url for r in d.replicas)
        assert all(w["model_id"] == MODEL and w["is_healthy"] for w in workers), workers
        refs = trio.run(rt.reference_texts, d.replicas[0].url, MODEL, MAX_TOKENS)
        before = _served(d)
        tally = trio.run(partial(_traffic, d, refs))
        assert not tally.replica_exits, f"replicas down (why, s into the load): {tally.replica_exits}\n" \
                                        f"{_stderr(d.replicas)}"
        assert dict(tally.statuses) == {200: REQUESTS} and not tally.errors, \
            (dict(tally.statuses), dict(tally.errors), d.router.log_tail())
        assert not tally.wrong, tally.wrong[:3]
        after = _served(d)
        served = [a["request_success_total"] - b.get("request_success_total", 0) for a, b in zip(after, before)]
        assert served == [REQUESTS // 2] * 2, served
        assert [a["kv_blocks_used"] for a in after] == [0, 0] and [a["num_requests_running"] for a in after] == [0, 0]
        assert [a.get("connection_errors_total", 0) for a in after] == [0, 0]  # none ended by an error either
        exits = d.stop()
    assert exits == [0, 0], _stderr(d.replicas)
    assert all("Traceback" not in "".join(r.stderr) for r in d.replicas), _stderr(d.replicas)


def _grpc_probe(port: int) -> None:
    """One of the router's gRPC health probes, as tonic sent it here (seen through a logging proxy): the h2c
    preface, SETTINGS, POST .../HealthCheck with a 5-byte body and END_STREAM; then, the server's first bytes
    in, PING, GOAWAY and EOF; then the socket closed 3 ms later without reading the answer (the router keeps
    the HTTP check and drops the gRPC one). The 3 ms are part of the stimulus, not a wait: they put the close
    inside the server's reply, where the crash was."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.send_headers(1, [(":method", "POST"), (":scheme", "http"), (":authority", f"127.0.0.1:{port}"),
                          (":path", "/sglang.grpc.scheduler.SglangScheduler/HealthCheck"), ("te", "trailers"),
                          ("content-type", "application/grpc"), ("user-agent", "tonic/0.14.2")])
    conn.send_data(1, b"\0" * 5)
    conn.send_data(1, b"", end_stream=True)
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(conn.data_to_send())
        conn.ping(b"\0" * 8)
        conn.close_connection()
        try:
            s.recv(1)  # the server's SETTINGS: it has the request
            s.sendall(conn.data_to_send())
            s.shutdown(socket.SHUT_WR)
        except OSError:  # the server hung up first
            return
        time.sleep(0.003)


def test_grpc_probe_replayed():
    """The router's registration probe (HTTP/2, the only HTTP/2 it sends a worker), replayed 200 times against
    one replica: it stays up and counts no connection error. Before f417e54 (issue 11: Hypercorn's `_close`
    sent EOF outside the send lock) the h2 send path met trio.BusyResourceError within 1-9 probes here (six
    runs) and the server stopped listening; through the router, in about one start in ten."""
    with ServerProcess(threads=1) as srv:
        for i in range(200):
            _grpc_probe(srv.port)
            _assert_up([srv], f"after {i + 1} probes")
        assert httpx.get(srv.url + "/health").status_code == 200
        # not even one connection ended by an error (held inside it, the server would stay up)
        assert trio.run(rt.settle, srv.url).get("connection_errors_total", 0) == 0
    assert srv.returncode == 0 and "Traceback" not in "".join(srv.stderr), _stderr([srv])


def test_vllm_router_in_front():
    """vllm-router 0.1.17 (PyPI) in front of two replicas, as it comes (round robin): its /v1/models is a
    replica's, and 24 requests of the shared traffic, 2 in flight, all get 200 with a replica's own text, 12 on
    each. Per request it first asks POST /v1/completions/render or /v1/chat/completions/render (vLLM's
    renderer; pyserve answers 404), then POST /tokenize, then the request itself."""
    if importlib.util.find_spec("vllm_router") is None:
        pytest.fail(rt.VLLM_ROUTER_MISSING)
    with rt.Deployment(launcher="vllm") as d:
        assert rt.router_models(d.router.url) == [MODEL]
        refs = trio.run(rt.reference_texts, d.replicas[0].url, MODEL, MAX_TOKENS)
        before = _served(d)
        tally = trio.run(partial(_traffic, d, refs, concurrency=2, requests=24))
        assert dict(tally.statuses) == {200: 24} and not tally.errors and not tally.wrong, \
            (dict(tally.statuses), dict(tally.errors), tally.wrong[:3], d.router.log_tail())
        served = [a["request_success_total"] - b.get("request_success_total", 0) for a, b in zip(_served(d), before)]
        assert served == [12, 12], served
        assert d.stop() == [0, 0]
