"""The gated delta rule's kernel alone (csrc/kernels/delta_rule.cpp through _engine.testing.delta_rule), SIMD beside its
scalar twin, one thread, at a DeltaNet layer's shape: per value head a head_k × head_v state over a run of
tokens (a prefill chunk), every head of the layer in turn.

    python3 scripts/bench_delta_rule.py [--head-k 128] [--head-v 128] [--heads 16] [--tokens 512] [--rounds 3]

Prints each implementation's best time for one layer's heads, tokens/s through one layer, and the work rate:
the rule costs 4 floating-point operations per state element and token (decay, two dot products' multiply-
adds, the correction), reported in GFLOP/s.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from pyserve import _engine


def inputs(n: int, head_k: int, head_v: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    q, k = (rng.standard_normal((n, head_k)).astype(np.float32) for _ in range(2))
    q /= np.linalg.norm(q, axis=1, keepdims=True)
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    v = rng.standard_normal((n, head_v)).astype(np.float32)
    decay = np.exp(-rng.uniform(0.0, 0.5, n)).astype(np.float32)
    beta = rng.uniform(0.05, 0.95, n).astype(np.float32)
    return q, k, v, decay, beta, np.zeros(head_k * head_v, dtype=np.float32)


def best_seconds(args, impl: str, data) -> float:
    best = float("inf")
    for _ in range(args.rounds):
        t0 = time.perf_counter()
        for _ in range(args.heads):
            _engine.testing.delta_rule(*data, scale=args.head_k ** -0.5, impl=impl)
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--head-k", type=int, default=128)
    ap.add_argument("--head-v", type=int, default=128)
    ap.add_argument("--heads", type=int, default=16, help="value heads of the layer")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    data = inputs(args.tokens, args.head_k, args.head_v)
    flops = 4.0 * args.head_k * args.head_v * args.tokens * args.heads
    times = {impl: best_seconds(args, impl, data) for impl in ("simd", "ref")}
    for impl, s in times.items():
        print(f"{impl}: {s * 1e3:.1f} ms for {args.heads} heads × {args.tokens} tokens, "
              f"{args.tokens / s:,.0f} tok/s through the layer, {flops / s / 1e9:.1f} GFLOP/s")
    print(f"simd / ref: {times['ref'] / times['simd']:.1f}×")


if __name__ == "__main__":
    main()
