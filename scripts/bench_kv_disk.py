"""Time to first token of a long prompt paid for once: cold, then the same conversation's next turn after the
pool was filled by other prompts, and after a server restart — with the prefix cache's disk tier
(--kv-cache-dir) and without it, on one server build, alternated in one run.

    PYTHONPATH=. python3 scripts/bench_kv_disk.py [--model PATH] [--words 1000] [--threads 2] [--rounds 1]
                                                  [-- extra serve args]

Each round, for each of "disk" (a fresh --kv-cache-dir) and "memory" (none):
  1. starts `pyserve serve` (loopback, a free port), streams a completion of a long prompt (random words; the
     model's context bounds it) and records TTFT (request sent → first token chunk read), cold;
  2. streams three other prompts as long, which take the KV pool (--num-kv-blocks is sized to about two
     prompts), then the first prompt with a follow-up: TTFT after eviction;
  3. stops the server (SIGTERM: a disk tier saves what the pool holds), starts it again, and sends the first
     prompt with the follow-up again: TTFT after a restart.
Prints each TTFT, its ratio to the cold one, cached_tokens as usage reports them, and whether the generated
text (greedy) is what the server without the tier, which recomputes the prompt, says for the same turn. One table, then the CPU features the build used.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time

import httpx

from pyserve.bench.launch import ServerProcess


def words(n: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(10**6)}" for _ in range(n))


def ttft(url: str, prompt: str) -> tuple[float, int, str]:
    """(seconds to the first token chunk, cached_tokens, the text) of a greedy streamed completion."""
    body = {"prompt": prompt, "max_tokens": 8, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0, first, text, cached = time.monotonic(), None, "", -1
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=3600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk["choices"] and chunk["choices"][0]["text"]:
                first = first or time.monotonic() - t0
                text += chunk["choices"][0]["text"]
            if chunk.get("usage"):
                cached = chunk["usage"]["prompt_tokens_details"]["cached_tokens"]
    return first or time.monotonic() - t0, cached, text


def one(args, disk: bool, rnd: int) -> list[tuple]:
    extra = [*args.serve, "--num-kv-blocks", str(args.blocks)]
    with tempfile.TemporaryDirectory() as d:
        if disk:
            extra += ["--kv-cache-dir", d]
        start = lambda: ServerProcess(*extra, *(["--model", args.model] if args.model else []),  # noqa: E731
                                      threads=args.threads).wait_ready(600)
        first, follow = words(args.words, 100 * rnd), " and then"
        s = start()
        try:
            cold = ttft(s.url, first)
            for k in range(3):
                ttft(s.url, words(args.words, 100 * rnd + k + 1))
            evicted = ttft(s.url, first + follow)
        finally:
            s.stop()
        s = start()
        try:
            restarted = ttft(s.url, first + follow)
        finally:
            s.stop()
    name = "disk" if disk else "memory"
    return [(name, "cold", cold, cold), (name, "after eviction", evicted, cold), (name, "after restart", restarted, cold)]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--words", type=int, default=1000, help="words per prompt (~7 tokens each)")
    p.add_argument("--blocks", type=int, default=800, help="--num-kv-blocks: about two prompts' worth")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("serve", nargs="*", help="after --: extra `pyserve serve` arguments")
    args = p.parse_args()
    rows = []
    for rnd in range(args.rounds):
        for disk in (True, False):
            rows += one(args, disk, rnd)
    recomputed = {(rnd, turn): text for rnd, (name, turn, (_, _, text), _) in _rounds(rows) if name == "memory"}
    print(f"{'tier':<8} {'turn':<16} {'TTFT s':>8} {'× cold':>7} {'cached':>7}  text = recomputed")
    for rnd, (name, turn, (t, cached, text), (t0, _, _)) in _rounds(rows):
        print(f"{name:<8} {turn:<16} {t:8.3f} {t / t0:7.3f} {cached:7d}  {text == recomputed[rnd, turn]}")
    print("CPU features the build may use:", " ".join(cpu_flags()))
    return 0


def _rounds(rows: list) -> list:
    """(round, row): six rows a round (disk's three turns, then memory's)."""
    return [(i // 6, row) for i, row in enumerate(rows)]


def cpu_flags() -> list[str]:
    """The SIMD levels this machine has, of those the engine's kernels use (the build is -march=native)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            flags = next(line for line in f if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return ["unknown"]
    return [f for f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_int8", "amx_tile") if f in flags]


if __name__ == "__main__":
    sys.exit(main())
