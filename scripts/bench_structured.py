"""What structured output costs: llguidance's mask time per token on the model's vocabulary, and the
inter-token latency of N streams all constrained vs all free, measured in the same run.

    python scripts/bench_structured.py [--streams 8] [--max-tokens 64] [--rounds 3] [--threads 2]

(1) In process: a JSON schema compiled once, a constrained greedy sample of it, then the mask computed for
every prefix of that sample again (Grammar.mask: the sampler's call plus a copy to Python): p50 / p99 in µs,
and the compile time. (2) `pyserve serve` on a free loopback port: N chat streams of max_tokens tokens at
once, free (ignore_eos) and constrained by a schema whose minItems forces output past max_tokens (so both
run exactly max_tokens tokens), alternated for `rounds` rounds: client-side ITL p50 / p99 (gaps between SSE
chunks) and aggregate tokens/s. Bounded in count; loopback only.
"""
from __future__ import annotations

import argparse
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from bench_embeddings import sse_gaps  # scripts/ is on the path when a script there runs

from pyserve.bench.launch import ServerProcess

# A record list: every step is inside a string, a number or between keys, as real extraction output is.
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["records"],
          "properties": {"records": {"type": "array", "minItems": 64, "items": {
              "type": "object", "additionalProperties": False, "required": ["name", "age", "city"],
              "properties": {"name": {"type": "string", "maxLength": 20},
                             "age": {"type": "integer", "minimum": 0, "maximum": 120},
                             "city": {"enum": ["Paris", "Rome", "Lima", "Oslo"]}}}}}}


def mask_times(max_tokens: int) -> dict:
    from pyserve import LLM
    from pyserve.engine.sampling_params import SamplingParams
    from pyserve.engine.structured import StructuredOutputsParams

    llm = LLM(n_threads=1)
    so = StructuredOutputsParams(json=SCHEMA)
    t0 = time.perf_counter()
    llm.grammars.vocab()
    t_vocab = time.perf_counter() - t0
    t0 = time.perf_counter()
    grammar = llm.grammars.compile(so)
    t_compile = time.perf_counter() - t0
    out = llm.generate(["People as JSON:"], SamplingParams(temperature=0, max_tokens=max_tokens * 4,
                                                           structured_outputs=so))[0].outputs[0]
    g, times = grammar.clone(), []
    for t in out.token_ids:
        t0 = time.perf_counter()
        g.mask()
        times.append(time.perf_counter() - t0)
        g.consume(t)
    us = np.array(times) * 1e6
    return {"vocab_s": t_vocab, "compile_ms": t_compile * 1e3, "tokens": len(times),
            "mask_p50_us": float(np.percentile(us, 50)), "mask_p99_us": float(np.percentile(us, 99))}


def stream_gaps(url: str, model: str, i: int, max_tokens: int, constrained: bool) -> list[float]:
    body = {"model": model, "messages": [{"role": "user", "content": f"List people ({i}) as JSON records."}],
            "max_tokens": max_tokens, "temperature": 0.7, "seed": i}
    body |= {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": SCHEMA}}} \
        if constrained else {"ignore_eos": True}
    return sse_gaps(url, body, "/v1/chat/completions")


def streams(srv: ServerProcess, n: int, max_tokens: int, constrained: bool) -> tuple[list[float], float]:
    t0 = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        runs = list(pool.map(lambda i: stream_gaps(srv.url, srv.model, i, max_tokens, constrained), range(n)))
    wall = time.perf_counter() - t0
    return [g for r in runs for g in r], sum(len(r) + 1 for r in runs) / wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    m = mask_times(a.max_tokens)
    print(f"grammar vocabulary build {m['vocab_s']:.2f} s (once per model); schema compile {m['compile_ms']:.1f} ms; "
          f"mask over {m['tokens']} tokens: p50 {m['mask_p50_us']:.0f} µs, p99 {m['mask_p99_us']:.0f} µs")
    srv = ServerProcess(threads=a.threads).wait_ready()
    try:
        streams(srv, a.streams, 8, True)  # warm-up: compiles and caches the grammar, builds the vocabulary
        gaps = {False: [], True: []}
        rates = {False: [], True: []}
        for _ in range(a.rounds):
            for constrained in (False, True):
                g, rate = streams(srv, a.streams, a.max_tokens, constrained)
                gaps[constrained] += g
                rates[constrained].append(rate)
    finally:
        srv.stop()
    for constrained in (False, True):
        ms = np.array(gaps[constrained]) * 1e3
        print(f"{a.streams} streams {'constrained' if constrained else 'free       '}: ITL p50 "
              f"{np.percentile(ms, 50):.1f} ms, p99 {np.percentile(ms, 99):.1f} ms, "
              f"{np.mean(rates[constrained]):.0f} tok/s")
    p50 = np.percentile(gaps[True], 50) / np.percentile(gaps[False], 50)
    p99 = np.percentile(gaps[True], 99) / np.percentile(gaps[False], 99)
    print(f"constrained / free: ITL p50 ×{p50:.3f}, p99 ×{p99:.3f}")


if __name__ == "__main__":
    main()
