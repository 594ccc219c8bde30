"""This machine's memory read bandwidth, STREAM-style: T threads each read their share of a buffer far larger
than the caches, with vector loads and a software prefetch (the engine's `testing.read_bandwidth`,
csrc/kernels/machine_limits.h). Decode at size is a memory-bandwidth problem: a model's decode tokens/s × the weight
bytes read per token, over this figure, is the fraction of the limit it reaches (docs/BENCHMARKS.md).

    PYTHONPATH=. python scripts/bench_bandwidth.py [--threads 2] [--mib 2048] [--rounds 5] [--numpy]
    PYTHONPATH=. python scripts/bench_bandwidth.py --model FILE.gguf --decode-tps 31.5   # decode's fraction

Prints GB/s (10^9 bytes per second), the best of the rounds (the machine is shared; the best is the limit).
--numpy also prints the earlier measure, NumPy's integer OR-reduction on T Python threads: on some machines it
reads well under what native loads reach (18 against 33 GB/s on one), which put decode over 100 % of it.
"""
from __future__ import annotations

import argparse
import os
import threading
import time

import numpy as np

from pyserve._engine import testing


def read_bandwidth(threads: int, mib: int, rounds: int) -> float:
    """Bytes per second the threads read together, best of `rounds` (native vector loads)."""
    return testing.read_bandwidth(threads, mib, rounds)


def numpy_read_bandwidth(threads: int, mib: int, rounds: int) -> float:
    """The same with NumPy's OR-reduction on Python threads (the GIL released), best of `rounds`."""
    data = np.ones(mib * (1 << 20) // 4, dtype=np.float32)  # touched: every page resident
    parts = np.array_split(data, threads)
    best = 0.0
    for _ in range(rounds):
        start = threading.Barrier(threads + 1)

        def read(part: np.ndarray) -> None:
            start.wait()
            np.bitwise_or.reduce(part.view(np.uint64))

        team = [threading.Thread(target=read, args=(p,)) for p in parts]
        for t in team:
            t.start()
        start.wait()
        t0 = time.perf_counter()
        for t in team:
            t.join()
        best = max(best, data.nbytes / (time.perf_counter() - t0))
    return best


def weight_bytes(path: str) -> int:
    """The bytes of a GGUF's tensors (what a dense decode reads per token, the embeddings' one row aside)."""
    return os.path.getsize(path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mib", type=int, default=2048, help="array size (MiB); several times the last-level cache")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--model", help="a GGUF file: report what --decode-tps reaches of the bandwidth")
    ap.add_argument("--decode-tps", type=float, help="decode tokens/s measured on --model")
    ap.add_argument("--numpy", action="store_true", help="also NumPy's reduction (the earlier measure)")
    a = ap.parse_args()
    bw = read_bandwidth(a.threads, a.mib, a.rounds)
    print(f"read bandwidth, {a.threads} thread(s), {a.mib} MiB: {bw / 1e9:.2f} GB/s")
    if a.numpy:
        print(f"numpy's reduction, the same: {numpy_read_bandwidth(a.threads, a.mib, a.rounds) / 1e9:.2f} GB/s")
    if a.model and a.decode_tps:
        need = weight_bytes(a.model) * a.decode_tps
        print(f"decode {a.decode_tps:.1f} tok/s x {weight_bytes(a.model) / 1e6:.0f} MB = {need / 1e9:.2f} GB/s, "
              f"{100 * need / bw:.0f} % of the read bandwidth")


if __name__ == "__main__":
    main()
