"""A hybrid model's later chat turns: TTFT with the prefix cache (recurrent-state checkpoints) vs without.

    python scripts/bench_hybrid_turns.py [--history 2000] [--turns 2] [--threads 2] [--arch qwen35 | --model PATH|default]

A random-weight hybrid (tests/support/model_factory.py, n_embd 256, Q8_0) in the engine, no HTTP: turn 1 is a
--history-token prompt and a 20-token greedy answer; each later turn is the conversation so far, its last
answer and 30 more tokens (--turns in all). Prints each turn's time to first token (add → first token) and its
ratio to turn 1's, with the prefix cache on and off; every turn's tokens must be the same either way (else exit
status 1). --model runs a GGUF file instead (`default`: the default model, Gemma 3 270M, whose local layers
attend over a sliding window of 512; or a bench_families file such as the Qwen3.5-2B-like shape).
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

from pyserve import _engine  # noqa: E402


def ttft(eng, rid: str, prompt: list) -> tuple[float, list]:
    t0 = time.perf_counter()
    eng.add(rid, prompt, {"temperature": 0.0}, 20, True)
    first, out = None, []
    while eng.has_work():
        for o in eng.step():
            if o.token >= 0:
                out.append(o.token)
                first = first or time.perf_counter() - t0
    return first, out


def model_path(args) -> str:
    if args.model:
        from pyserve.engine.model_source import resolve_model

        return resolve_model(None if args.model == "default" else args.model)
    dims = dict(ssm_state=64) if args.arch in tm.hybrid.ARCHS else {}
    return str(tm.write_test_model(os.path.join(tempfile.mkdtemp(), "hybrid.gguf"), args.arch, qtype="Q8_0",
                                   n_ctx=args.history + 512, n_embd=256, head_dim=64, n_ff=512, **dims))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--history", type=int, default=2000)
    ap.add_argument("--turns", type=int, default=2, help="turns of the chat (>= 2)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--arch", default="qwen35", choices=tm.hybrid.ARCHS + tm.lfm2.ARCHS)
    ap.add_argument("--model", default=None, help="a GGUF file (or 'default') instead of a random hybrid")
    args = ap.parse_args()
    if args.turns < 2:
        ap.error("--turns must be at least 2")
    path = model_path(args)
    rng = np.random.default_rng(0)
    turn1 = [int(t) for t in rng.integers(0, 256, args.history)]
    answers = {}
    for caching in (True, False):
        eng = _engine.Engine(str(path), n_threads=args.threads, enable_prefix_caching=caching,
                             n_ctx=args.history + 64 * args.turns + 512)
        chat, firsts, extra = list(turn1), [], np.random.default_rng(1)  # the same new tokens in both runs
        for turn in range(args.turns):
            t, answer = ttft(eng, f"t{turn}", chat)
            firsts.append(t)
            answers.setdefault(caching, []).append(answer)
            chat += answer + [int(x) for x in extra.integers(0, 256, 30)]
        s = eng.stats()
        print(f"prefix cache {'on ' if caching else 'off'}: TTFT by turn (ms) "
              + ", ".join(f"{t * 1e3:.1f}" for t in firsts)
              + f"; turn 2 / turn 1 {firsts[1] / firsts[0]:.3f}x, last / turn 1 {firsts[-1] / firsts[0]:.3f}x; "
              f"{s['prefix_cache_hits']} tokens hit, {s['state_checkpoint_restores']} restores", flush=True)
    if answers[True] != answers[False]:
        print("FAIL: a turn's tokens differ with the prefix cache")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
