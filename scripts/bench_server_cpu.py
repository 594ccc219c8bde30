"""The server's Python cost per streamed token: CPU time of its trio thread (the HTTP edge, parsing, the
serving layer, SSE framing, the AsyncLLM hand-off, the socket writes) per token delivered, with N concurrent
streaming completions. The engine's own threads are not counted.

    PYTHONPATH=. python scripts/bench_server_cpu.py [--streams 16] [--tokens 64] [--rounds 3]

Run it under another checkout's PYTHONPATH to time that checkout's server in the same sitting (the server
is started from the pyserve package that is imported). Prints µs of trio-thread CPU per token, best round.
"""
from __future__ import annotations

import argparse
import json
import os
import threading

import httpx

from pyserve.bench.launch import ServerProcess

_TICK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> float:
    """Seconds of CPU (user + system) the process's main thread (the trio thread) has used."""
    with open(f"/proc/{pid}/task/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def one_stream(url: str, tokens: int, out: list) -> None:
    body = {"prompt": "Tell me a long story about a dragon.", "max_tokens": tokens, "ignore_eos": True,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    n = 0  # tokens, from the closing usage chunk (a lagging stream's deltas merge: fewer chunks than tokens)
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: {") and '"usage":{' in line.replace(" ", ""):
                n = json.loads(line[6:])["usage"]["completion_tokens"]
    out.append(n)


def round_us(server: ServerProcess, streams: int, tokens: int) -> float:
    counts: list[int] = []
    t0 = thread_cpu(server.pid)
    workers = [threading.Thread(target=one_stream, args=(server.url, tokens, counts)) for _ in range(streams)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=600)
    assert counts == [tokens] * streams, counts  # every stream ran to its end
    return (thread_cpu(server.pid) - t0) / (streams * tokens) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    server = ServerProcess("--target-itl", "0", threads=1).wait_ready()
    try:
        round_us(server, 2, 8)  # warm
        best = min(round_us(server, args.streams, args.tokens) for _ in range(args.rounds))
    finally:
        server.stop()
    print(f"{args.streams} streams x {args.tokens} tokens: {best:.1f} us of trio-thread CPU per token")


if __name__ == "__main__":
    main()
