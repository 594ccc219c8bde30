"""Long contexts: prefill of an N-token prompt and decode at depth N, pyserve's engine beside llama.cpp.

    PYTHONPATH=. python3 scripts/bench_long_context.py [--model PATH] [--threads 2] [--depths 8192,32768]
        [--decode 32] [--kv-cache-dtype f16] [--rounds 1]
        [--llama-bench BIN --llama-lib DIR [--flash-attn on|off]]

pyserve: one offline engine per depth (n_ctx = depth + decode, no prefix cache, the serving chunk size), one
request of a random N-token prompt (seeded) and decode + 1 greedy tokens: prefill tok/s = N / time to the first
token, decode tok/s = the tokens after the first over the time after it (every one of them attends to N+).
llama.cpp: `llama-bench -p N -n 0` and `-p 0 -n decode -d N` (decode after an N-token context), same threads
and KV type (`-ctk/-ctv`), flash attention as given (default on; llama.cpp needs it for a quantized V), one repetition per round. With --rounds R the two alternate R times and
the best of each is kept. One table, pyserve / llama.cpp ratios per depth.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_DEPTH = 131072


def prompt(n: int, vocab: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [2] + [rng.randrange(1000, min(vocab, 200000)) for _ in range(n - 1)]


def pyserve_run(path: str, threads: int, depth: int, decode: int, kv_dtype: str) -> dict:
    from pyserve import _engine
    from pyserve.engine.options import EngineOptions

    opts = EngineOptions.serving(n_threads=threads, n_ctx=depth + decode + 16, enable_prefix_caching=False,
                                 kv_cache_dtype=kv_dtype, speculative_ngram=0).as_dict()
    eng = _engine.Engine(path, calibrate=False, **opts)
    eng.add("r", prompt(depth, eng.hparams["n_vocab"], depth), {"temperature": 0.0}, decode + 1, True)
    t0, first, n = time.perf_counter(), None, 0
    done = False
    while not done:
        for o in eng.step():
            if o.token >= 0:
                n += 1
                first = first or time.perf_counter()
            done = done or bool(o.finish_reason)
    end = time.perf_counter()
    return {"prefill": depth / (first - t0), "decode": (n - 1) / (end - first)}


def llama_bench(args, extra: list[str]) -> float:
    env = dict(os.environ)
    if args.llama_lib:
        env["LD_LIBRARY_PATH"] = args.llama_lib + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    cmd = [args.llama_bench, "-m", args.model, "-t", str(args.threads), "-fa", args.flash_attn, "-r", "1",
           "-ctk", args.kv_cache_dtype, "-ctv", args.kv_cache_dtype, "-o", "json", *extra]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800, check=True)
    return float(json.loads(out.stdout)[0]["avg_ts"])


def peer_run(args, depth: int) -> dict:
    return {"prefill": llama_bench(args, ["-p", str(depth), "-n", "0"]),
            "decode": llama_bench(args, ["-p", "0", "-n", str(args.decode), "-d", str(depth)])}


def best(a: dict, b: dict) -> dict:
    return {k: max(a.get(k, 0.0), v) for k, v in b.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="a GGUF path (default: the default model)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--depths", default="8192,32768", help="prompt lengths, comma-separated")
    ap.add_argument("--decode", type=int, default=32, help="tokens decoded after the prompt")
    ap.add_argument("--kv-cache-dtype", default="f16")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--llama-bench", help="llama.cpp's llama-bench binary, to run beside")
    ap.add_argument("--llama-lib", help="LD_LIBRARY_PATH for it")
    ap.add_argument("--flash-attn", default="on", choices=("on", "off"))
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.model is None:
        from pyserve.engine.model_source import resolve_model

        args.model = resolve_model(None)
    depths = [int(d) for d in args.depths.split(",")]
    if any(not 16 <= d <= MAX_DEPTH for d in depths) or not 2 <= args.decode <= 4096:
        ap.error(f"depths must be in [16, {MAX_DEPTH}] and --decode in [2, 4096]")
    mine: dict = {d: {} for d in depths}
    peer: dict = {d: {} for d in depths}
    for _ in range(max(1, min(args.rounds, 5))):
        for d in depths:
            mine[d] = best(mine[d], pyserve_run(args.model, args.threads, d, args.decode, args.kv_cache_dtype))
            print(f"depth {d}: pyserve {mine[d]}", file=sys.stderr, flush=True)  # a long run's figures so far
            if args.llama_bench:
                peer[d] = best(peer[d], peer_run(args, d))
                print(f"depth {d}: llama.cpp {peer[d]}", file=sys.stderr, flush=True)
    print(f"{Path(args.model).name}, {args.threads} threads, KV {args.kv_cache_dtype}, llama.cpp flash attention "
          f"{args.flash_attn}, best of {args.rounds}")
    print("| depth | prefill pyserve / llama.cpp (tok/s) | decode at depth pyserve / llama.cpp (tok/s) |")
    print("|---:|---|---|")
    for d in depths:
        cells = []
        for k in ("prefill", "decode"):
            p = peer[d].get(k)
            cells.append(f"{mine[d][k]:.1f} / {p:.1f} (**{mine[d][k] / p:.2f}×**)" if p else f"{mine[d][k]:.1f}")
        print(f"| {d} | {cells[0]} | {cells[1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
