"""Engine benchmark: prefill and decode throughput of the default model (or --model), and memory.

    python scripts/bench_engine.py [--model PATH] [--threads 2] [--llama-cpp]

Prints prefill tokens/s (a 512-token prompt), single-stream decode tokens/s (128 tokens), batched decode
tokens/s with 8 and 32 sequences, and resident memory. With --llama-cpp, runs the same prefill and
single-stream decode through llama-cpp-python's Llama (llama.cpp) on the same file and threads, in the
same process run, and prints the ratios. With --rounds R the two alternate R times and the best figure
of each is kept, so a burst of load from elsewhere on the machine disturbs neither side alone.
"""
from __future__ import annotations

import argparse
import resource
import time


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def synthetic_prompt(n: int, vocab: int, seed: int = 0) -> list[int]:
    import random

    rng = random.Random(seed)
    return [2] + [rng.randrange(1000, min(vocab, 200000)) for _ in range(n - 1)]


def run_to_end(engine, reqs: dict) -> tuple[float, float, int]:
    """Adds nothing; steps until every request finished. -> (first token time, end time, tokens)."""
    t0 = time.perf_counter()
    first = None
    tokens = 0
    live = set(reqs)
    while live:
        for o in engine.step():
            rid, tok, reason = o.request_id, o.token, o.finish_reason
            if tok >= 0:
                tokens += 1
                first = first or time.perf_counter()
            if reason:
                live.discard(rid)
    return (first or t0) - t0, time.perf_counter() - t0, tokens


def one_stream_decode(engine, prompt: list[int], tokens: int, rid: str = "d") -> float:
    """Decode tok/s of one greedy stream of `tokens` tokens: those after its first over the time after it, so
    that the prompt's prefill does not dilute the figure."""
    engine.add(rid, prompt, {"temperature": 0.0}, tokens + 1, True)
    ttft, total, n = run_to_end(engine, {rid: 1})
    return (n - 1) / (total - ttft)


def bench_pyserve(path: str, threads: int, prefill_len: int, decode_len: int) -> dict:
    from pyserve import _engine

    # No prefix caching here: repeated rounds re-send the same prompts and must not hit the cache.
    eng = _engine.Engine(path, n_threads=threads, max_num_batched_tokens=max(512, prefill_len), enable_prefix_caching=False)
    V = eng.hparams["n_vocab"]
    greedy = {"temperature": 0.0}
    res = {}
    # warm-up: touch the weights once
    eng.add("w", synthetic_prompt(16, V), greedy, 4, True)
    run_to_end(eng, {"w": 1})

    eng.add("p", synthetic_prompt(prefill_len, V, 1), greedy, 1, True)
    ttft, _, _ = run_to_end(eng, {"p": 1})
    res["prefill_tok_s"] = prefill_len / ttft

    res["decode_tok_s"] = one_stream_decode(eng, synthetic_prompt(8, V, 2), decode_len)

    for batch in (8, 32):
        reqs = {}
        for i in range(batch):
            eng.add(f"b{batch}-{i}", synthetic_prompt(8, V, 100 + i), greedy, decode_len + 1, True)
            reqs[f"b{batch}-{i}"] = 1
        ttft, total, n = run_to_end(eng, reqs)
        res[f"batch{batch}_decode_tok_s"] = n / total
    res["rss_mb"] = rss_mb()
    res["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return res


def decode_phase_rate(engine, reqs: set) -> float:
    """Steps until all of reqs finish; tokens/s counted from the step at which every request is decoding
    (each has drawn its first token: prompts done) to the end, so prefill does not dilute the figure."""
    started, live = set(), set(reqs)
    t_all, tokens = None, 0
    while live:
        outs = engine.step()
        now = time.perf_counter()
        for o in outs:
            rid, tok, reason = o.request_id, o.token, o.finish_reason
            if t_all is not None and tok >= 0:
                tokens += 1
            started.add(rid)
            if reason:
                live.discard(rid)
        if t_all is None and started >= reqs:
            t_all = now
    return tokens / (time.perf_counter() - t_all) if tokens else 0.0


def bench_concurrency(path: str, threads: int, levels=(1, 4, 16, 64), prompt_len=256, out_len=128) -> dict:
    """Aggregate decode tokens/s with `level` requests in flight (256-token prompts, 128 output tokens)."""
    from pyserve import _engine

    eng = _engine.Engine(path, n_threads=threads, enable_prefix_caching=False)
    V = eng.hparams["n_vocab"]
    res = {}
    for level in levels:
        reqs = set()
        for i in range(level):
            rid = f"c{level}-{i}"
            eng.add(rid, synthetic_prompt(prompt_len, V, 1000 * level + i), {"temperature": 0.0}, out_len, True)
            reqs.add(rid)
        res[level] = decode_phase_rate(eng, reqs)
    return res


def bench_prefix_cache(path: str, threads: int, cached=1000, extra=8) -> float:
    """TTFT of a request whose first `cached` tokens are in the prefix cache, over a cold one's."""
    from pyserve import _engine

    eng = _engine.Engine(path, n_threads=threads, max_num_batched_tokens=512)
    V = eng.hparams["n_vocab"]
    shared = synthetic_prompt(cached, V, 7)
    eng.add("cold", shared + synthetic_prompt(extra, V, 8)[1:], {"temperature": 0.0}, 1, True)
    cold, _, _ = run_to_end(eng, {"cold": 1})
    eng.add("warm", shared + synthetic_prompt(extra, V, 9)[1:], {"temperature": 0.0}, 1, True)
    warm, _, _ = run_to_end(eng, {"warm": 1})
    return warm / cold


def bench_llama_cpp(path: str, threads: int, prefill_len: int, decode_len: int) -> dict:
    from llama_cpp import Llama

    llm = Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=2048, n_batch=512,
                verbose=False, logits_all=False)
    V = llm.n_vocab()
    res = {}
    llm.eval(synthetic_prompt(16, V))
    llm.reset()
    prompt = synthetic_prompt(prefill_len, V, 1)
    t0 = time.perf_counter()
    llm.eval(prompt)
    res["prefill_tok_s"] = prefill_len / (time.perf_counter() - t0)
    llm.reset()
    llm.eval(synthetic_prompt(8, V, 2))
    # Decode cost without Python-side sampling (llama-cpp-python samples in Python): feed fixed tokens.
    feed = synthetic_prompt(decode_len + 1, V, 3)[1:]
    t0 = time.perf_counter()
    for tok in feed:
        llm.eval([tok])
    res["decode_tok_s"] = decode_len / (time.perf_counter() - t0)
    return res


def best_of(best: dict, new: dict) -> None:
    for k, v in new.items():
        better = min if "rss" in str(k) else max
        best[k] = better(best[k], v) if k in best else v


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--prefill", type=int, default=512)
    ap.add_argument("--decode", type=int, default=128)
    ap.add_argument("--llama-cpp", action="store_true", help="also run llama-cpp-python's Llama on the same file")
    ap.add_argument("--rounds", type=int, default=1, help="alternate the runs this many times; keep the best")
    ap.add_argument("--concurrency", action="store_true",
                    help="aggregate decode tokens/s at 1, 4, 16, 64 requests (256-token prompts, 128 out) and the "
                         "prefix-cache TTFT ratio")
    args = ap.parse_args()
    from pyserve.engine.model_source import resolve_model

    path = resolve_model(args.model)
    ours, ref = {}, {}
    for _ in range(args.rounds):
        best_of(ours, bench_pyserve(path, args.threads, args.prefill, args.decode))
        if args.llama_cpp:
            best_of(ref, bench_llama_cpp(path, args.threads, args.prefill, args.decode))
    print(f"model {path}, threads {args.threads}")
    print(f"pyserve  prefill {ours['prefill_tok_s']:8.1f} tok/s  decode {ours['decode_tok_s']:6.1f} tok/s  "
          f"batch8 {ours['batch8_decode_tok_s']:7.1f} tok/s  batch32 {ours['batch32_decode_tok_s']:7.1f} tok/s  "
          f"rss {ours['rss_mb']:.0f} MB (max {ours['max_rss_mb']:.0f} MB)")
    if args.concurrency:
        # Rounds are kept apart: one stream is memory-bound and 16 are compute-bound, so a shared machine's
        # memory-bandwidth swings move the two differently; the ratio is taken within each round.
        rounds = [bench_concurrency(path, args.threads) for _ in range(args.rounds)]
        for agg in rounds:
            print("aggregate decode " + "  ".join(f"{k}: {v:.1f} tok/s" for k, v in agg.items()) +
                  f"   (16 vs 1: {agg[16] / agg[1]:.2f}x)")
        if len(rounds) > 1:
            ratios = sorted(agg[16] / agg[1] for agg in rounds)
            print(f"16 vs 1 over {len(rounds)} rounds: median {ratios[len(ratios) // 2]:.2f}x, "
                  f"min {ratios[0]:.2f}x, max {ratios[-1]:.2f}x")
        print(f"prefix cache: TTFT with 1000 cached tokens / cold = {bench_prefix_cache(path, args.threads):.3f}")
    if args.llama_cpp:
        print(f"llama.cpp prefill {ref['prefill_tok_s']:8.1f} tok/s  decode {ref['decode_tok_s']:6.1f} tok/s")
        print(f"ratio    prefill {ours['prefill_tok_s'] / ref['prefill_tok_s']:.2f}x  "
              f"decode {ours['decode_tok_s'] / ref['decode_tok_s']:.2f}x")


if __name__ == "__main__":
    main()
