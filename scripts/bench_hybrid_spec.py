"""Speculative decoding on a hybrid model: decode tok/s with it on vs off, and what the state roll-back costs.

    python scripts/bench_hybrid_spec.py [--arch qwen35] [--threads 2] [--max-tokens 200] [--k 7] [--rounds 3]
        [--method ngram|mtp] [--shape small|2b]

A random-weight hybrid (tests/support/model_factory.py; n_embd 1024, 8 layers (6 Gated DeltaNet), 8 value heads of 64,
n_ff 2048, Q8_0, 67 MiB) in the engine, no HTTP, one stream, greedy, ignore_eos, on repetitive prompts (a random
run of ids repeated, so the prompt's n-grams propose drafts). Two workloads: "free", the model's own greedy text
(a random model rarely copies: most drafts are rejected, so this is what speculation costs where it does not
pay), and "copy", the same with a logit bias of +100 on one token (the text repeats it: every draft stands, so
this is what the drafted rows give at most). Speculation as served: drafted rows priced on the measured forward
times. Prints decode tok/s ((tokens - 1) / (last token - first token), the best of --rounds per prompt) on vs
off, the steps, the drafted and accepted tokens; the tokens must be the same (else exit status 1). Then the roll-back's two designs on this machine: a per-row snapshot (a copy of one state slot, numpy
memcpy of state_slot_bytes, the best of 20) against a replay (a forward of the kept rows: RowCosts T(r)).
--method mtp: the drafts come from the file's multi-token-prediction layer instead (one token ahead a step),
a layer that guesses its input token comes again (model_factory's mtp="echo"): the "copy" text has every
draft accepted, the "free" text almost none.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from support import model_factory as tm  # noqa: E402
from bench_families import QWEN35_2B  # noqa: E402

from pyserve import _engine  # noqa: E402


SHAPES = {  # small: 67 MiB at Q8_0; 2b: bench_families.py's Qwen3.5-2B-like widths (2 GB at Q8_0)
    "small": dict(n_embd=1024, n_layer=8, head_dim=64, ssm_state=64, ssm_v_heads=8, ssm_groups=4, n_ff=2048),
    "2b": QWEN35_2B,
}


def decode(eng, prompt: list, sampling: dict, max_tokens: int) -> tuple[float, list]:
    """One stream -> (decode tok/s, tokens)."""
    eng.add("b", prompt, sampling, max_tokens, True)
    times, out = [], []
    while eng.has_work():
        for o in eng.step():
            if o.token >= 0:
                out.append(o.token)
                times.append(time.perf_counter())
    return (len(out) - 1) / max(times[-1] - times[0], 1e-9), out


def prompts(n: int) -> list:
    _, _, _, bos, _ = tm.tokenizer_vocab()
    rng = np.random.default_rng(0)
    return [[bos] + [int(t) for t in rng.integers(0, bos, 4 + i)] * 6 for i in range(n)]


def copy_seconds(n_bytes: int) -> float:
    src, dst = np.ones(n_bytes // 4, np.float32), np.zeros(n_bytes // 4, np.float32)
    best = float("inf")
    for _ in range(20):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return best


def speculation(args) -> dict:
    """The engine options that turn speculation on with --method."""
    if args.method == "mtp":
        return {"speculative_ngram": 1, "speculative_method": "mtp"}
    return {"speculative_ngram": args.k}


def run_all(path: str, args, sampling: dict) -> tuple[dict, dict]:
    engines = {k: _engine.Engine(path, n_threads=args.threads, **(speculation(args) if k else {}))
               for k in (0, args.k)}
    rates = {k: [] for k in engines}
    tokens = {k: [] for k in engines}
    steps = {k: 0 for k in engines}
    for p in prompts(args.prompts):
        for k, eng in engines.items():
            s0 = eng.stats()["steps"]
            best = 0.0
            for _ in range(args.rounds):
                rate, out = decode(eng, p, sampling, args.max_tokens)
                best = max(best, rate)
            rates[k].append(best)
            tokens[k].append(out)
            steps[k] += (eng.stats()["steps"] - s0) // args.rounds
    return {k: (rates[k], tokens[k], steps[k]) for k in engines}, {k: e.stats() for k, e in engines.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", default="qwen35", choices=tm.hybrid.ARCHS)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--k", type=int, default=7)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--method", default="ngram", choices=("ngram", "mtp"), help="where the drafts come from")
    ap.add_argument("--shape", default="small", choices=tuple(SHAPES), help="the model's widths")
    args = ap.parse_args()
    path = tm.write_test_model(os.path.join(tempfile.mkdtemp(), "hybrid.gguf"), args.arch, qtype="Q8_0",
                               **SHAPES[args.shape], mtp="echo" if args.method == "mtp" else False)
    same = True
    for name, sampling in (("free", {"temperature": 0.0}), ("copy", {"temperature": 0.0, "logit_bias": {7: 100.0}})):
        res, stats = run_all(str(path), args, sampling)
        same = same and report(name, res[0], res[args.k], stats[args.k])
    slot = stats[args.k]["state_slot_bytes"]
    t = stats[args.k]["row_costs"]
    print(f"roll-back: a snapshot per drafted row copies one slot ({slot / 2**20:.2f} MiB): {copy_seconds(slot) * 1e3:.3f} "
          f"ms; a replay forwards the kept rows: T(1) {t[1] * 1e3:.2f} ms, T(2) {t[2] * 1e3:.2f} ms, "
          f"T(4) {t[4] * 1e3:.2f} ms, T(8) {t[8] * 1e3:.2f} ms")
    if not same:
        print("FAIL: the tokens differ with speculation")
        return 1
    return 0


def report(name: str, off: tuple, on: tuple, s: dict) -> bool:
    for i, (a, b) in enumerate(zip(off[0], on[0])):
        print(f"{name} prompt {i}: off {a:7.1f} tok/s  on {b:7.1f} tok/s  ({b / a:.2f}x)")
    gm = float(np.exp(np.mean(np.log(np.array(on[0]) / np.array(off[0])))))
    print(f"{name}: geomean on/off {gm:.2f}x; steps (all prompts, one round) off {off[2]} on {on[2]}; drafted "
          f"{s['spec_draft_tokens']} accepted {s['spec_accepted_tokens']} tokens ({s['spec_drafts']} drafts, all rounds)")
    return on[1] == off[1]


if __name__ == "__main__":
    sys.exit(main())
