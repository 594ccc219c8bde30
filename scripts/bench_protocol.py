"""Request parsing time: the HTTP body (bytes) to a validated request, per endpoint, in microseconds.

    python scripts/bench_protocol.py [--rounds 5] [--iters 20000] [--compare-with CHECKOUT] [--to-engine]

--compare-with times the same bodies, in the same run, through the parser of an older checkout that still
had `pyserve/protocol.py` (`parse_json` + `parse_chat` / `parse_completion`, before the pydantic protocol),
e.g. `git worktree add /tmp/old 05f9f5e`.

--to-engine adds each body's way on to the engine: parsed, `to_sampling_params`, then checked by a real
engine twice (the serving layer's check, then what submitting converts), as the serving layer does per
prompt; run it under another checkout's PYTHONPATH to time that checkout's bridge in the same sitting.

Each body is parsed `iters` times per round; the best round's mean is printed (the machine is noisy; the
best round is the least disturbed). Bodies: a short chat (3 messages), a long chat (40 messages), a chat with
every sampling field set, a completion with a string prompt and one with 4 token-id prompts.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from pyserve.api.chat.protocol import ChatCompletionRequest
from pyserve.api.completions.protocol import CompletionRequest
from pyserve.api.base.protocol import parse_body

_MSG = [{"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."}]
BODIES = {
    "chat, 3 messages": (ChatCompletionRequest, {"model": "m", "messages": _MSG, "max_tokens": 64}),
    "chat, 40 messages": (ChatCompletionRequest, {"model": "m", "messages": _MSG * 13 + _MSG[1:2], "stream": True}),
    "chat, all sampling fields": (ChatCompletionRequest, {
        "model": "m", "messages": _MSG, "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "n": 2,
        "seed": 7, "stop": ["\n\n", "User:"], "presence_penalty": 0.1, "frequency_penalty": 0.2,
        "logit_bias": {"5": -100, "17": 3}, "logprobs": True, "top_logprobs": 5, "stream": True,
        "stream_options": {"include_usage": True}, "max_completion_tokens": 128}),
    "completion, text": (CompletionRequest, {"model": "m", "prompt": "Once upon a time", "max_tokens": 32,
                                            "temperature": 0}),
    "completion, 4 x 64 ids": (CompletionRequest, {"model": "m", "prompt": [list(range(2, 66))] * 4,
                                                  "max_tokens": 8, "logprobs": 2}),
}


def time_to_engine(model, data: bytes, iters: int, engine) -> float:
    from pyserve.engine.engine_request import EngineRequest

    t0 = time.perf_counter()
    for _ in range(iters):
        req = parse_body(model, data)
        request = EngineRequest(None, [2, 3, 4], req.to_sampling_params(8))
        request.check(engine)
        request.check(engine)
    return (time.perf_counter() - t0) / iters * 1e6


def _engine():
    from pyserve import _engine
    from pyserve.engine.model_source import resolve_model

    return _engine.Engine(resolve_model(None), n_threads=1, n_ctx=256, num_kv_blocks=64)


def time_one(model, data: bytes, iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        parse_body(model, data)
    return (time.perf_counter() - t0) / iters * 1e6


_OLD = """
import json, sys, time
from pyserve.protocol import parse_chat, parse_completion, parse_json
parse = {"chat": parse_chat, "completion": parse_completion}
for kind, data, iters, rounds in json.loads(sys.stdin.read()):
    best = 1e9
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(iters):
            parse[kind](parse_json(data.encode()))
        best = min(best, (time.perf_counter() - t0) / iters * 1e6)
    print(best)
"""


def time_old(checkout: str, bodies: list[tuple[str, bytes]], iters: int, rounds: int) -> list[float]:
    """The same bodies through an older checkout's parser, in a child process with that checkout first."""
    env = dict(os.environ, PYTHONPATH=checkout)
    job = json.dumps([(kind, data.decode(), iters, rounds) for kind, data in bodies])
    out = subprocess.run([sys.executable, "-c", _OLD], input=job, env=env, capture_output=True, text=True,
                         check=True, cwd=checkout)
    return [float(x) for x in out.stdout.split()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--compare-with", metavar="CHECKOUT", help="an older checkout to time beside this one")
    ap.add_argument("--to-engine", action="store_true", help="time parse + to_sampling_params + engine checks")
    args = ap.parse_args()
    rows = [(name, model, json.dumps(body).encode()) for name, (model, body) in BODIES.items()]
    if args.to_engine:
        engine = _engine()
        times = [min(time_to_engine(m, d, args.iters, engine) for _ in range(args.rounds)) for _, m, d in rows]
        print(f"{'body':28s} {'us: parse to engine':>20s}")
        for (name, _, _), t in zip(rows, times):
            print(f"{name:28s} {t:20.2f}")
        return
    new = [min(time_one(m, d, args.iters) for _ in range(args.rounds)) for _, m, d in rows]
    old = None
    if args.compare_with:
        kinds = [("chat" if m is ChatCompletionRequest else "completion", d) for _, m, d in rows]
        old = time_old(args.compare_with, kinds, args.iters, args.rounds)
    print(f"{'body':28s} {'bytes':>6s} {'us / request':>13s}" + (f" {'before':>8s} {'speed-up':>9s}" if old else ""))
    for i, (name, _, data) in enumerate(rows):
        extra = f" {old[i]:8.2f} {old[i] / new[i]:8.2f}x" if old else ""
        print(f"{name:28s} {len(data):6d} {new[i]:13.2f}{extra}")


if __name__ == "__main__":
    main()
