"""Engine speed on a machine that is not idle: prefill and decode of the default model (or --model), alone
and with CPU-bound processes beside it (`python3 -c 'while True: pass'`, at nice 0 and nice 5), each as a
fraction of the idle figure, and decode's inter-token latency p99 against idle's.

    python scripts/bench_busy.py [--model PATH] [--threads 2] [--rounds 2] [--llama-cpp]

Each case runs in a fresh process (the hogs start first and are killed after); with --rounds R the cases
alternate R times and the best figure of each is kept. With --llama-cpp (llama-cpp-python importable, e.g.
the venv of ../shared/tools/build_peer.sh with LLAMA_CPP_LIB_PATH set) llama.cpp runs the same cases on the
same file, side by side.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

CASES = [("idle", 0, 0), ("1 hog", 1, 0), ("2 hogs", 2, 0), ("1 hog nice 5", 1, 5), ("2 hogs nice 5", 2, 5)]
HOG = "while True: pass"


def _case(engine: str, model: str, threads: int) -> dict:
    """One measurement in this process: prefill tok/s (512 tokens), decode tok/s (128 tokens), ITL p99 ms."""
    sys.path.insert(0, str(Path(__file__).parent))
    import bench_engine as be

    if engine == "llama.cpp":
        res = be.bench_llama_cpp(model, threads, 512, 128)
        return {**res, "itl_p99_ms": 0.0}
    from pyserve import _engine

    eng = _engine.Engine(model, n_threads=threads, max_num_batched_tokens=512, enable_prefix_caching=False)
    V = eng.hparams["n_vocab"]
    eng.add("w", be.synthetic_prompt(16, V), {"temperature": 0.0}, 4, True)
    be.run_to_end(eng, {"w": 1})
    eng.add("p", be.synthetic_prompt(512, V, 1), {"temperature": 0.0}, 1, True)
    ttft, _, _ = be.run_to_end(eng, {"p": 1})
    eng.add("d", be.synthetic_prompt(8, V, 2), {"temperature": 0.0}, 129, True)
    gaps = _step_gaps(eng, "d")
    return {"prefill_tok_s": 512 / ttft, "decode_tok_s": len(gaps) / sum(gaps),
            "itl_p99_ms": sorted(gaps)[int(0.99 * (len(gaps) - 1))] * 1e3}


def _step_gaps(eng, rid: str) -> list[float]:
    """Seconds between consecutive tokens of rid (the first token's wait left out)."""
    gaps, last, done = [], None, False
    while not done:
        for o in eng.step():
            if o.request_id == rid and o.token >= 0:
                now = time.perf_counter()
                if last is not None:
                    gaps.append(now - last)
                last = now
            done = done or (o.request_id == rid and bool(o.finish_reason))
    return gaps


def run_case(engine: str, model: str, threads: int, hogs: int, nice: int) -> dict:
    procs = [subprocess.Popen([sys.executable, "-c", HOG], preexec_fn=lambda: os.nice(nice)) for _ in range(hogs)]
    try:
        out = subprocess.run([sys.executable, __file__, "--one", engine, "--model", model, "--threads", str(threads)],
                             check=True, capture_output=True, text=True, timeout=600).stdout
        return json.loads(out.strip().splitlines()[-1])
    finally:
        for p in procs:
            p.kill()
            p.wait()


def best_cases(engines: list[str], model: str, threads: int, rounds: int) -> dict:
    """{engine: {case name: figures}}: every case of every engine, alternated `rounds` times, each case's
    round with the best decode kept."""
    best: dict = {e: {} for e in engines}
    for _ in range(rounds):
        for name, hogs, nice in CASES:
            for e in engines:
                r = run_case(e, model, threads, hogs, nice)
                prev = best[e].get(name)
                best[e][name] = r if prev is None or r["decode_tok_s"] > prev["decode_tok_s"] else prev
    return best


def report(engine: str, best: dict) -> None:
    idle = best["idle"]
    print(f"{engine}:")
    for name, r in best.items():
        print(f"  {name:14s} prefill {r['prefill_tok_s']:7.1f} tok/s ({r['prefill_tok_s'] / idle['prefill_tok_s']:4.0%})"
              f"  decode {r['decode_tok_s']:6.1f} tok/s ({r['decode_tok_s'] / idle['decode_tok_s']:4.0%})"
              + (f"  ITL p99 {r['itl_p99_ms']:6.2f} ms ({r['itl_p99_ms'] / idle['itl_p99_ms']:.1f}x idle)"
                 if idle["itl_p99_ms"] else ""))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--llama-cpp", action="store_true")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a case's own process
    args = ap.parse_args()
    from pyserve.engine.model_source import resolve_model

    model = resolve_model(args.model)
    if args.one:
        print(json.dumps(_case(args.one, model, args.threads)))
        return
    engines = ["pyserve"] + (["llama.cpp"] if args.llama_cpp else [])
    best = best_cases(engines, model, args.threads, args.rounds)
    print(f"model {model}, threads {args.threads}, best of {args.rounds} rounds")
    for e in engines:
        report(e, best[e])


if __name__ == "__main__":
    main()
