"""Embeddings throughput, and what embeddings cost the generation streams running beside them.

    python scripts/bench_embeddings.py [--texts 64] [--streams 8] [--max-tokens 64] [--threads 2]

Starts `pyserve serve` on a free loopback port. (1) 64 short texts embedded one per request at concurrency
1 and 8: embeddings/s. (2) 8 streamed completions (64 tokens, ignore_eos) alone, then again while
embedding requests (concurrency 4, bounded count) run beside them: the streams' inter-token latency p50 /
p99 (client side, gaps between SSE chunks) and tokens/s. Bounded in count; loopback only.
"""
from __future__ import annotations

import argparse
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import httpx
import numpy as np

from pyserve.bench.launch import ServerProcess

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly mix bright purple potions".split()


def texts(n: int) -> list[str]:
    return [" ".join(WORDS[(i + j) % len(WORDS)] for j in range(8 + i % 5)) for i in range(n)]


def embed_rate(url: str, items: list[str], concurrency: int) -> float:
    def one(t: str) -> None:
        r = httpx.post(url + "/v1/embeddings", json={"input": t}, timeout=60)
        r.raise_for_status()

    t0 = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, items))
    return len(items) / (time.perf_counter() - t0)


def sse_chunks(url: str, body: dict, path: str = "/v1/completions") -> Iterator[tuple[float, dict]]:
    """(perf_counter s when it arrived, the parsed chunk) for each SSE data chunk of one streamed request."""
    with httpx.stream("POST", url + path, json={**body, "stream": True}, timeout=300) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                yield time.perf_counter(), json.loads(line[6:])


def sse_gaps(url: str, body: dict, path: str = "/v1/completions") -> list[float]:
    """Seconds between the SSE chunks (with choices) of one streamed request, client side."""
    times = [now for now, chunk in sse_chunks(url, body, path) if chunk["choices"]]
    return [b - a for a, b in zip(times, times[1:])]


def stream_gaps(url: str, i: int, max_tokens: int) -> list[float]:
    return sse_gaps(url, {"prompt": f"Story {i}: once upon a time", "max_tokens": max_tokens, "ignore_eos": True,
                          "temperature": 0})


def streams(url: str, n: int, max_tokens: int, beside=None) -> dict:
    stop = threading.Event()
    side = threading.Thread(target=beside, args=(stop,)) if beside else None
    if side:
        side.start()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        gaps = [g for gs in pool.map(lambda i: stream_gaps(url, i, max_tokens), range(n)) for g in gs]
    dt = time.perf_counter() - t0
    stop.set()
    if side:
        side.join()
    ms = np.array(gaps) * 1e3
    return {"itl_p50_ms": float(np.percentile(ms, 50)), "itl_p99_ms": float(np.percentile(ms, 99)),
            "tok_s": n * max_tokens / dt}


def embedding_load(url: str, items: list[str], limit: int = 2000):
    def run(stop: threading.Event) -> None:
        def worker(k: int) -> None:
            for j in range(limit // 4):
                if stop.is_set():
                    return
                httpx.post(url + "/v1/embeddings", json={"input": items[(k + j) % len(items)]}, timeout=60)

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(worker, range(4)))
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--texts", type=int, default=64)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    items = texts(args.texts)
    with ServerProcess(threads=args.threads) as srv:
        embed_rate(srv.url, items[:8], 4)  # warm-up
        for c in (1, 8):
            print(f"embeddings/s, {args.texts} short texts, concurrency {c}: {embed_rate(srv.url, items, c):.1f}")
        alone = streams(srv.url, args.streams, args.max_tokens)
        beside = streams(srv.url, args.streams, args.max_tokens, embedding_load(srv.url, items))
        for name, r in (("alone", alone), ("beside embeddings (4 in flight)", beside)):
            print(f"{args.streams} streams {name}: ITL p50 {r['itl_p50_ms']:.1f} ms, p99 {r['itl_p99_ms']:.1f} ms, "
                  f"{r['tok_s']:.0f} tok/s")


if __name__ == "__main__":
    main()
