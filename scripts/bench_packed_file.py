"""Packed weights mapped from a file (weights_cache.py, csrc/gguf/packed_file.h) vs packed at load: the load's time
and the speed of what it loaded, alternating, in one run.

    PYTHONPATH=. python3 scripts/bench_packed_file.py [--model PATH] [--threads 2] [--rounds 3]

Writes the model's packed weights to a temporary file once, then R rounds of: an engine that packs (fresh
memory: the kernel zeroes it first, then the repack), an engine that maps the file; each times its
constructor, a 512-token prefill and a 128-token single-stream decode (greedy). The decode is the figure a
mapping could cost (its pages are the page cache's: 2 MiB mappings only where the file system keeps large
folios; `FilePmdMapped` says how much of the mapping is). Prints each round and the best of each side.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_engine import run_to_end, synthetic_prompt  # noqa: E402


def pmd_mapped_kb(name: str) -> tuple[int, int]:
    """(Rss, FilePmdMapped) kB of this process's mappings of files whose path ends with `name`."""
    rss = pmd = 0
    mine = False
    with open(f"/proc/{os.getpid()}/smaps") as f:
        for line in f:
            parts = line.split()
            if parts and "-" in parts[0] and len(parts) >= 5:
                mine = parts[-1].endswith(name)
            elif mine and parts[0] == "Rss:":
                rss += int(parts[1])
            elif mine and parts[0] == "FilePmdMapped:":
                pmd += int(parts[1])
    return rss, pmd


def one(path: str, threads: int, packed: str) -> dict:
    from pyserve import _engine

    t0 = time.perf_counter()
    eng = _engine.Engine(path, calibrate=False, packed_weights=packed, n_threads=threads,
                         max_num_batched_tokens=512, enable_prefix_caching=False)
    row = {"load_s": time.perf_counter() - t0, "mapped": eng.packed_from_file}
    V, greedy = eng.hparams["n_vocab"], {"temperature": 0.0}
    eng.add("w", synthetic_prompt(16, V), greedy, 4, True)
    run_to_end(eng, {"w": 1})
    eng.add("p", synthetic_prompt(512, V, 1), greedy, 1, True)
    row["prefill_tok_s"] = 512 / run_to_end(eng, {"p": 1})[0]
    eng.add("d", synthetic_prompt(8, V, 2), greedy, 129, True)
    ttft, total, n = run_to_end(eng, {"d": 1})
    row["decode_tok_s"] = (n - 1) / (total - ttft)
    if packed:
        row["rss_kb"], row["pmd_kb"] = pmd_mapped_kb(os.path.basename(packed))
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", help="a GGUF path (default: the default model)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    from pyserve import _engine
    from pyserve.engine.model_source import resolve_model

    path = resolve_model(args.model)
    rows = {"packed": [], "mapped": []}
    with tempfile.TemporaryDirectory() as d:
        packed = os.path.join(d, "weights.packed")
        _engine.Engine(path, calibrate=False, n_threads=args.threads).save_packed_weights(packed)
        for r in range(max(1, min(args.rounds, 10))):
            for side, file in (("packed", ""), ("mapped", packed)):
                row = one(path, args.threads, file)
                assert row["mapped"] == bool(file), row
                rows[side].append(row)
                extra = f", {row['pmd_kb'] / max(1, row['rss_kb']):.0%} of its pages 2 MiB-mapped" if file else ""
                print(f"round {r + 1} {side}: load {row['load_s']:.3f} s, prefill {row['prefill_tok_s']:.1f} tok/s, "
                      f"decode {row['decode_tok_s']:.1f} tok/s{extra}", flush=True)
    print(f"\n{args.model or 'the default model'}, {args.threads} threads, best of {len(rows['packed'])}")
    print("| | load (s) | prefill 512 (tok/s) | decode 128 (tok/s) |\n|---|---:|---:|---:|")
    for side, rs in rows.items():
        print(f"| {side} | {min(r['load_s'] for r in rs):.3f} | {max(r['prefill_tok_s'] for r in rs):.1f} | "
              f"{max(r['decode_tok_s'] for r in rs):.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
