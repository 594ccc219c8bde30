"""Two engines busy at once in one process (two models behind one server) vs one engine alone.

    PYTHONPATH=. python scripts/bench_two_models.py [--model PATH] [--streams 4] [--tokens 128] [--threads 2]

Each engine (AsyncLLM, its own copy of the model, its own KV pool and thread pool of --threads) runs
--streams greedy streams of --tokens tokens each. "one" runs engine A alone; "two" runs A and B at the same
time. Per phase: wall time, aggregate decode tokens/s, and the inter-token latency of every stream (the
gap between deltas, split evenly over a delta's tokens), p50 / p90 / p99 over all streams.

The engines take turns stepping on one shared thread team (csrc/engine/step_turns.h, ThreadPool::shared): two busy
engines together deliver about what one does alone (0.7-1.0x measured on 2 cores), each at about half its rate,
alternating step by step.
Run it with PYTHONPATH of another checkout to compare builds (docs/BENCHMARKS.md has figures).
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np
import trio

from pyserve import SamplingParams
from pyserve.engine.async_llm import AsyncLLM

PROMPTS = ["Once upon a time", "The capital of France is", "def fibonacci(n):", "In 1492, Columbus",
           "Water boils at", "My favourite recipe for soup", "1, 2, 3, 4,", "The quick brown fox"]


async def one_stream(engine: AsyncLLM, prompt: str, tokens: int, gaps: list[float]) -> int:
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    last, n = None, 0
    async for out in engine.generate(prompt, params):
        k = len(out.token_ids_delta)
        now = time.monotonic()
        if last is not None and k:
            gaps.extend([(now - last) / k] * k)
        if k:
            last, n = now, n + k
    return n


async def busy(engines: list[AsyncLLM], streams: int, tokens: int) -> dict:
    gaps: list[float] = []
    counts: list[int] = []

    async def run(engine, i):
        counts.append(await one_stream(engine, PROMPTS[i % len(PROMPTS)], tokens, gaps))

    t0 = time.monotonic()
    async with trio.open_nursery() as nursery:
        for engine in engines:
            for i in range(streams):
                nursery.start_soon(run, engine, i)
    wall = time.monotonic() - t0
    p = np.percentile(np.array(gaps) * 1000, [50, 90, 99])
    return {"engines": len(engines), "wall_s": round(wall, 2), "tokens": sum(counts),
            "tokens_per_s": round(sum(counts) / wall, 1), "itl_ms_p50": round(p[0], 2),
            "itl_ms_p90": round(p[1], 2), "itl_ms_p99": round(p[2], 2)}


async def main(args) -> None:
    opts = dict(n_threads=args.threads, max_num_batched_tokens=128)
    async with AsyncLLM.open(args.model, **opts) as a, AsyncLLM.open(args.model, **opts) as b:
        await busy([a, b], 1, 8)  # warm both
        results = [await busy([a], args.streams, args.tokens), await busy([a, b], args.streams, args.tokens)]
    for r in results:
        print(json.dumps(r))
    one, two = results
    print(f"two engines together: {two['tokens_per_s'] / one['tokens_per_s']:.2f}x one engine's tokens/s; "
          f"ITL p50 {two['itl_ms_p50'] / one['itl_ms_p50']:.2f}x")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--streams", type=int, default=4, help="streams per engine")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    trio.run(main, ap.parse_args())
