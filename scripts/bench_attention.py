"""The online attention kernel alone: one work item (a query run of n consecutive tokens of one sequence, one KV
head) over L cached keys, through `_engine.testing.attend_run`, one thread, f16 rows.

    PYTHONPATH=. python3 scripts/bench_attention.py [--keys 8192] [--runs 1,8] [--reps 10]
        [--shapes 4x64,4x256,4x128,8x128] [--build DIR]

--build DIR imports the pyserve package of another checkout (its extension built), to set this build's kernel
beside another's: alternate the two commands. Prints GFLOP/s of the scores and weighted sums (2 · 2 · n ·
group · L · head_dim flops) over the best of the repetitions: n = 1 is a decode step, n = 8 a prompt chunk's
run.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np


def engine(build: str | None):
    sys.path.insert(0, build or str(Path(__file__).resolve().parents[1]))
    from pyserve import _engine
    return _engine.testing


def one(T, group: int, hd: int, keys: int, n: int, reps: int) -> tuple[float, float]:
    rng = np.random.default_rng(0)
    k = T.kv_write("f16", rng.standard_normal((keys, hd)).astype(np.float32))
    v = T.kv_write("f16", rng.standard_normal((keys, hd)).astype(np.float32))
    q = (rng.standard_normal((n, group, hd)) * 0.5).astype(np.float32)
    lens = [keys - n + 1 + i for i in range(n)]
    T.attend_run("f16", q, k, v, lens, hd ** -0.5, 16, 128)
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        T.attend_run("f16", q, k, v, lens, hd ** -0.5, 16, 128)
        best = min(best, time.perf_counter() - t0)
    return best, 4 * n * group * keys * hd / best / 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--keys", type=int, default=8192)
    ap.add_argument("--runs", default="1,8", help="queries per run, comma-separated (at most kAttnQueryRun)")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--shapes", default="4x64,4x256,4x128,8x128", help="group x head_dim, comma-separated")
    ap.add_argument("--build", help="a checkout whose pyserve to import instead of this one")
    args = ap.parse_args()
    if args.keys <= 16 or args.reps < 1:
        ap.error("--keys > 16 and --reps >= 1")
    T = engine(args.build)
    print("| group × head_dim | queries | ms | GFLOP/s |\n|---|---:|---:|---:|")
    for shape in args.shapes.split(","):
        group, hd = (int(x) for x in shape.split("x"))
        for n in (int(x) for x in args.runs.split(",")):
            sec, gflops = one(T, group, hd, args.keys, n, args.reps)
            print(f"| {group} × {hd} | {n} | {sec * 1e3:.2f} | {gflops:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
