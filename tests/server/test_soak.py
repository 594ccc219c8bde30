"""Soak, short and bounded: scripts/soak.py against a server it starts (disconnects, bad requests, slow
readers; no 5xx, every valid request finished or 429, blocks back to 0, no memory growth after the warm-up),
and a stalled reader that never holds up the engine or the other streams."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from support.live_server import Server, stats
from support.paths import SCRIPTS

SOAK_SECONDS = float(os.environ.get("PYSERVE_SOAK_SECONDS", "30"))
# The server's resident anonymous memory may grow this much (~5.5 MB of ~550) from a third into the load to
# after it (scripts/soak.py memory_check). Measured on 2 busy cores: 0.0-0.2% in six clean runs of 240-610
# requests; 3.6% over 1080 requests with a deliberate leak of 32 KB a request (Tokenizer.encode wrapped to
# keep a 32 KB buffer per call). So a 32 KB leak fails once ~170 requests follow the baseline, a 64 KB one
# once ~90 do; smaller leaks are the long soak's (minutes, thousands of requests, its own 5% default).
# Since the packed weights are mapped from the cache (file pages) the anonymous baseline is ~200 MB: 1% of it
# alone would fail a 2 MB allocator wobble (seen once in CI: 198 -> 200 MB), so the bound is the ~5.5 MB it
# was sized in, whichever is larger.
RSS_TOLERANCE = 0.01
RSS_SLACK_MB = 5.5


def _env() -> dict:
    import pyserve

    here = str(Path(pyserve.__file__).resolve().parent.parent)
    return dict(os.environ, PYTHONPATH=here + os.pathsep + os.environ.get("PYTHONPATH", ""))


def test_soak_short(tmp_path):
    out = tmp_path / "soak.json"
    proc = subprocess.run([sys.executable, str(SCRIPTS / "soak.py"), "--minutes", str(SOAK_SECONDS / 60),
                           "--streams", "16", "--warmup", "10", "--num-kv-blocks", "128", "--seed", "7",
                           "--rss-tolerance", str(RSS_TOLERANCE), "--rss-slack-mb", str(RSS_SLACK_MB),
                           "--json", str(out)],
                          capture_output=True, text=True, timeout=SOAK_SECONDS + 240, env=_env())
    print(proc.stdout[-4000:], proc.stderr[-2000:])
    report = json.loads(out.read_text())
    assert proc.returncode == 0 and report["ok"], report.get("failures")
    o = report["outcomes"]
    assert o.get("finished", 0) > 10 and o.get("dropped", 0) > 0 and o.get("bad_refused", 0) > 0, o
    assert report["metrics_after"]["kv_blocks_used"] == 0
    rss = report["rss_mb"]  # the check ran
    assert rss["final"] - rss["baseline"] <= max(RSS_SLACK_MB, rss["baseline"] * RSS_TOLERANCE) + 0.1, rss
    assert report["server_exit"] == 0
    assert "0 kv blocks in use" in report["engine_stopped"]


def _read_all(s: socket.socket) -> bytes:
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return data
        data += chunk


def test_stalled_reader_does_not_stall_others():
    """A client that stops reading (tiny receive buffer, no reads): the engine still runs its request to the
    end, another stream meanwhile runs at its normal pace, and when the client reads again it gets the rest
    (merged deltas where the server's writes blocked), ending in a finish_reason chunk and [DONE]."""
    sys.path.insert(0, str(SCRIPTS))
    try:
        from soak import dechunk
    finally:
        sys.path.pop(0)
    srv = Server("--drain-timeout", "2").wait_ready()
    try:
        body = {"prompt": "Count to a thousand:", "max_tokens": 24, "temperature": 0, "ignore_eos": True}
        httpx.post(srv.url + "/v1/completions", json=body, timeout=60)  # warm
        t0 = time.monotonic()
        httpx.post(srv.url + "/v1/completions", json=dict(body, stream=True), timeout=60)
        alone = time.monotonic() - t0

        n_slow = 240
        payload = json.dumps({"prompt": "Tell me a long story.", "max_tokens": n_slow, "ignore_eos": True,
                              "stream": True, "stream_options": {"include_usage": True}}).encode()
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
        s.connect(("127.0.0.1", srv.port))
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Connection: close\r\nContent-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        try:
            t0 = time.monotonic()
            while stats(srv).get("num_requests_running", 0) < 1 and time.monotonic() - t0 < 20:
                time.sleep(0.02)
            # another stream while the slow one is stalled: its pace is that of a batch of two
            t0 = time.monotonic()
            with httpx.stream("POST", srv.url + "/v1/completions", json=dict(body, stream=True), timeout=60) as r:
                lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
            beside = time.monotonic() - t0
            assert lines[-1] == "data: [DONE]"
            assert beside < 3 * alone + 2.0, (alone, beside)
            # the engine finishes the stalled request although nobody reads it
            t0 = time.monotonic()
            while time.monotonic() - t0 < 120:
                st = stats(srv)
                if st.get("num_requests_running", 1) == 0 and st.get("kv_blocks_used", 1) == 0:
                    break
                time.sleep(0.1)
            assert st["num_requests_running"] == 0 and st["kv_blocks_used"] == 0, st
            data = _read_all(s)
        finally:
            s.close()
        head, _, rest = data.partition(b"\r\n\r\n")
        assert head.split(b" ", 2)[1] == b"200", head
        events = [e[6:] for e in dechunk(rest).decode().split("\n\n") if e.startswith("data: ")]
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        usage = chunks[-1]["usage"]
        assert usage["completion_tokens"] == n_slow
        content = [c for c in chunks if c["choices"]]
        assert content[-1]["choices"][0]["finish_reason"] == "length"
        print(f"stalled reader: {n_slow} tokens in {len(content)} chunks; a 24-token stream took {alone:.2f} s "
              f"alone, {beside:.2f} s beside it")
        # Deltas merge only once the server's writes block; on loopback the kernel's send buffer (sized from
        # the 64 KiB MSS: megabytes) usually takes a whole short stream, so fewer chunks than tokens is not
        # required here (AsyncLLM's merging: tests/engine/test_engine_client.py). What matters: the engine finished
        # the request while nobody read it, and the other stream kept its pace.
        assert len(content) <= n_slow
        assert "".join(c["choices"][0]["text"] for c in content)
    finally:
        assert srv.stop() == 0, "".join(srv.stderr)
