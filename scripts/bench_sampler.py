"""Prints µs per sampled token on random logits (default: 262,144-token vocabulary, the default model's).

    PYTHONPATH=$PWD python3 scripts/bench_sampler.py [--vocab N] [--iters N]

Median of per-call times (robust to a busy machine), including the Python call (~1 µs). Columns: "flat" N(0, 1)
logits, where top-p 0.9 keeps ~60% of the vocabulary (the sampler's worst case); "N(0,3)", where it keeps ~1%
(still past the first 256 candidates); "LLM-like" N(0, 2) with 32 tokens lifted by 12, where it stays within them.
"""

import argparse
import time

import numpy as np

from pyserve import _engine
Sampler = _engine.testing.Sampler

CASES = [
    ("greedy", dict(temperature=0.0)),
    ("greedy + logprobs=5", dict(temperature=0.0, logprobs=5)),
    ("greedy + penalties", dict(temperature=0.0, repetition_penalty=1.1, presence_penalty=0.5, frequency_penalty=0.5)),
    ("T=0.8 (no cut)", dict(temperature=0.8)),
    ("T=0.8 top_p=0.9", dict(temperature=0.8, top_p=0.9)),
    ("T=1.0 top_p=0.9", dict(temperature=1.0, top_p=0.9)),
    ("T=0.8 top_k=40 top_p=0.9", dict(temperature=0.8, top_k=40, top_p=0.9)),
    ("T=0.8 top_k=1000", dict(temperature=0.8, top_k=1000)),
    ("T=0.8 min_p=0.05", dict(temperature=0.8, min_p=0.05)),
]


def bench(n_vocab, params, logits, iters):
    s = Sampler(n_vocab, seed=0, **params)
    s.set_prompt(list(range(0, n_vocab, 97)))
    for row in logits[:3]:
        s.sample(row)
    times = []
    for i in range(iters):
        row = logits[i % len(logits)]
        t0 = time.perf_counter()
        s.sample(row)
        times.append(time.perf_counter() - t0)
    return float(np.median(times)) * 1e6


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--vocab", type=int, default=262144)
    ap.add_argument("--iters", type=int, default=200)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    flat = rng.standard_normal((8, args.vocab), dtype=np.float32)
    wide = flat * 3.0
    spiky = flat * 2.0
    for row in spiky:
        row[rng.choice(args.vocab, 32, replace=False)] += 12.0
    print(f"n_vocab={args.vocab}, median of {args.iters} calls, µs/token")
    print(f"{'case':28s} {'flat N(0,1)':>12s} {'N(0,3)':>10s} {'LLM-like':>10s}")
    for name, params in CASES:
        a, b, c = (bench(args.vocab, params, rows, args.iters) for rows in (flat, wide, spiky))
        print(f"{name:28s} {a:12.1f} {b:10.1f} {c:10.1f}")


if __name__ == "__main__":
    main()
