"""Request parsing time: the HTTP body (bytes) to a validated request, per endpoint, in microseconds.

    python scripts/bench_protocol.py [--rounds 5] [--iters 20000]

Each body is parsed `iters` times per round; the best round's mean is printed (the machine is noisy; the
best round is the least disturbed). Bodies: a short chat (3 messages), a long chat (40 messages), a chat with
every sampling field set, a completion with a string prompt and one with 4 token-id prompts.
"""
from __future__ import annotations

import argparse
import json
import time

from pyserve.openai.protocol import ChatCompletionRequest, CompletionRequest, parse_body

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


def time_one(model, data: bytes, iters: int) -> float:
    t0 = time.perf_counter()
    for _ in range(iters):
        parse_body(model, data)
    return (time.perf_counter() - t0) / iters * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=20000)
    args = ap.parse_args()
    print(f"{'body':32s} {'bytes':>6s} {'us / request':>13s}")
    for name, (model, body) in BODIES.items():
        data = json.dumps(body).encode()
        best = min(time_one(model, data, args.iters) for _ in range(args.rounds))
        print(f"{name:32s} {len(data):6d} {best:13.2f}")


if __name__ == "__main__":
    main()
