"""A client that stays connected but stops reading is not a disconnect: Hypercorn's send blocks and the
engine would go on generating into a growing backlog. --stalled-client-timeout aborts such a request and
frees its blocks while the connection is still open, and counts it."""
import json
import socket
import time

import httpx

from pyserve.bench.prometheus import parse_metrics, total
from support.live_server import Server


def metric(url: str, name: str) -> float:
    """pyserve:NAME summed over its labels, or -1 while the server does not export it."""
    samples, _ = parse_metrics(httpx.get(url + "/metrics").text)
    full = f"pyserve:{name}"
    return total(samples, full) if any(n == full for n, _ in samples) else -1.0


def test_stalled_client_is_aborted_and_counted():
    srv = Server("--stalled-client-timeout", "1.5").wait_ready()
    try:
        body = json.dumps({"model": "gemma-3-270m-q4_k_m", "prompt": "Once upon a time", "max_tokens": 1500,
                           "ignore_eos": True, "stream": True, "logprobs": 20, "n": 4}).encode()
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window: writes back up quickly
        sock.connect(("127.0.0.1", srv.port))
        sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
        try:
            deadline = time.monotonic() + 120
            while metric(srv.url, "stalled_clients_total") < 1:  # the client reads nothing meanwhile
                assert time.monotonic() < deadline, "the stalled stream was never aborted"
                time.sleep(0.2)
            while metric(srv.url, "kv_blocks_used") != 0:
                assert time.monotonic() < deadline, "blocks of the stalled stream were not freed"
                time.sleep(0.1)
            assert metric(srv.url, "num_requests_running") == 0
            tokens = metric(srv.url, "generation_tokens_total")
            assert tokens < 4 * 1500  # it stopped well before max_tokens
        finally:
            sock.close()
    finally:
        assert srv.stop() == 0, "".join(srv.stderr)
