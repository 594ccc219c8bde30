"""Is the server's event loop responsive under load? /health latency while N streams run.

    python scripts/bench_health.py [--streams 32] [--max-tokens 64] [--threads 2] [--url URL]

Starts `python -m pyserve serve` on a free loopback port (or uses --url), opens N streamed completions at
once and, while they run, polls GET /health every 20 ms from a separate probe process (so the probe's
latency is the server's, not that of the load generator's own busy event loop). Prints p50 / p99 / max of
the /health latency and the streams' aggregate tokens/s. Target (issue 4): p99 under 10 ms with 32 streams.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

import httpx
import trio

from pyserve.bench.launch import ServerProcess
from pyserve.bench.stats import summarize


async def stream_one(http: httpx.AsyncClient, i: int, max_tokens: int, counts: list) -> None:
    body = {"prompt": f"Story number {i}: once upon a time", "max_tokens": max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}
    async with http.stream("POST", "/v1/completions", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"]:
                counts[0] += 1


PROBE = r"""
import json, select, sys, time, httpx
lat = []
with httpx.Client(base_url=sys.argv[1], timeout=30) as c:
    while True:
        t0 = time.perf_counter()
        assert c.get("/health").status_code == 200
        lat.append(time.perf_counter() - t0)
        time.sleep(0.02)
        if select.select([sys.stdin], [], [], 0)[0]:  # the parent says stop
            break
print(json.dumps(lat))
"""


def start_probe(url: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", PROBE, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)


def stop_probe(proc: subprocess.Popen) -> list:
    out, _ = proc.communicate("stop\n", timeout=60)
    return json.loads(out)


async def run(url: str, streams: int, max_tokens: int) -> None:
    counts = [0]
    limits = httpx.Limits(max_connections=streams + 4)
    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as http:
        probe = start_probe(url)
        t0 = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(streams):
                nursery.start_soon(stream_one, http, i, max_tokens, counts)
        elapsed = time.perf_counter() - t0
        lat = stop_probe(probe)
    s = summarize(lat)
    print(f"{streams} streams x {max_tokens} tokens: {counts[0] / elapsed:.1f} tok/s aggregate over {elapsed:.1f} s")
    print(f"/health during the load ({len(lat)} probes): p50 {s['p50'] * 1000:.2f} ms  p99 {s['p99'] * 1000:.2f} ms  "
          f"max {s['max'] * 1000:.2f} ms")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--url", default=None, help="an already running server")
    args = ap.parse_args()
    if args.url:
        trio.run(run, args.url, args.streams, args.max_tokens)
        return
    with ServerProcess(threads=args.threads) as srv:
        trio.run(run, srv.url, args.streams, args.max_tokens)


if __name__ == "__main__":
    main()
