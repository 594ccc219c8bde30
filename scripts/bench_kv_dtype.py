"""The KV cache dtypes on the real default model (issue 28): memory per token, and the accuracy cost of each
against f32 KV on a long text scored teacher-forced (prompt_logprobs): mean |Δ logprob| of the actual next
token and top-1 agreement (next_token_scores / compare, which tests/kernels/test_kv_dtype.py holds q8_0 to bounds with).

    PYTHONPATH=. python3 scripts/bench_kv_dtype.py [--tokens 1536] [--threads 2] [--model PATH] [--decode-context N]
    PYTHONPATH=. python3 scripts/bench_kv_dtype.py --kernels      # the attention kernels alone, per dtype

The text: tests/data/prose.txt (the repository's architecture document as it stood on 2026-12-07), its first
--tokens tokens. One engine per dtype, one prefill each (the
machine's speed does not enter; nothing here is timed). Prints one Markdown table.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Sequence

import numpy as np

from pyserve import LLM, SamplingParams
from pyserve.engine.model_source import resolve_model
from pyserve.engine.options import EngineOptions

ROOT = Path(__file__).resolve().parents[1]
DTYPES = ("f32", "f16", "bf16", "q8_0")


def next_token_scores(llm, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """For positions 1 … len(ids) − 1 of one prompt: the logprob of the token there, and the model's top-1
    token for it (the prompt's own when it is the best: prompt_logprobs lists it first, then the best other)."""
    out = llm.generate([{"prompt_token_ids": list(ids)}], SamplingParams(max_tokens=0, prompt_logprobs=1))[0]
    entries = out.prompt_logprobs[1:]
    logprob = np.array([e[t] for e, t in zip(entries, ids[1:])], dtype=np.float64)
    top1 = np.array([list(e)[1] if len(e) > 1 else t for e, t in zip(entries, ids[1:])])
    return logprob, top1


def compare(got: tuple[np.ndarray, np.ndarray], ref: tuple[np.ndarray, np.ndarray]) -> tuple[float, float]:
    """(mean |Δ logprob| of the actual next token, fraction of positions with the same top-1 token)."""
    return float(np.abs(got[0] - ref[0]).mean()), float((got[1] == ref[1]).mean())


def decode_tps(llm, ids: Sequence[int], n: int = 64) -> float:
    """Decode tokens/s after a prefill of ids: (time to draw n + 1 tokens − time to draw 1) / n, best of 2."""
    import time

    def run(max_tokens: int) -> float:
        t0 = time.perf_counter()
        llm.generate([{"prompt_token_ids": list(ids)}], SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
        return time.perf_counter() - t0

    return max(n / (run(n + 1) - run(1)) for _ in range(2))


def kernel_times(n_rows: int = 4096, hd: int = 256, nh: int = 4, rounds: int = 20) -> None:
    """One thread: the scores of nh heads over n_rows stored K rows, and the weighted sum over as many V rows
    (the default model's global-layer shape at a 4k context), best of `rounds`."""
    import time

    from pyserve import _engine

    t = _engine.testing
    rng = np.random.default_rng(0)
    q, w = rng.standard_normal((nh, hd)).astype(np.float32), rng.random((nh, n_rows)).astype(np.float32)
    print(f"| KV dtype | scores, {nh} heads × {n_rows} rows × {hd} (µs) | weighted sum (µs) |\n|---|---:|---:|")
    for d in DTYPES:
        rows = t.kv_write(d, rng.standard_normal((n_rows, hd)).astype(np.float32))
        best = [float("inf")] * 2
        for _ in range(rounds):
            for i, f in enumerate((lambda: t.kv_scores(d, q, rows), lambda: t.kv_weighted_sum(d, w, rows, hd))):
                t0 = time.perf_counter()
                f()
                best[i] = min(best[i], time.perf_counter() - t0)
        print(f"| {d} | {best[0] * 1e6:.0f} | {best[1] * 1e6:.0f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=1536)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None)
    ap.add_argument("--decode-context", type=int, default=0)
    ap.add_argument("--kernels", action="store_true")
    args = ap.parse_args()
    if args.kernels:
        return kernel_times()
    path = args.model or resolve_model(None)
    scores, per_token, tps = {}, {}, {}
    for d in DTYPES:
        llm = LLM(path, n_threads=args.threads, kv_cache_dtype=d, n_ctx=args.tokens + 16)
        ids = llm.tokenizer.encode((ROOT / "tests" / "data" / "prose.txt").read_text())[: args.tokens]
        scores[d] = next_token_scores(llm, ids)
        if args.decode_context:
            ctx = LLM(path, n_threads=args.threads, kv_cache_dtype=d, enable_prefix_caching=False)
            tps[d] = decode_tps(ctx, (ids * (args.decode_context // len(ids) + 1))[: args.decode_context])
            del ctx
        geo = EngineOptions(kv_cache_dtype=d).kv_geometry(path)
        per_token[d] = geo["bytes_per_block"] / geo["block_size"]
        del llm
    print(f"{Path(path).name}, {len(ids)} tokens of tests/data/prose.txt, teacher-forced; reference: f32 KV\n")
    timed = f" decode tok/s at {args.decode_context} |" if tps else ""
    print(f"| KV dtype | bytes per token (all layers, K+V) | vs f16 | mean abs. Δ logprob (nats) | top-1 agreement |{timed}")
    print("|---|---:|---:|---:|---:|" + ("---:|" if tps else ""))
    for d in DTYPES:
        delta, top1 = compare(scores[d], scores["f32"])
        extra = f" {tps[d]:.1f} |" if tps else ""
        print(f"| {d} | {per_token[d]:,.0f} | {per_token[d] / per_token['f16']:.3f}× | {delta:.4f} | {100 * top1:.2f} % |{extra}")
    delta, top1 = compare(scores["bf16"], scores["f16"])  # two roundings of the same size: the model's sensitivity
    print(f"\nbf16 against f16 (not f32): mean abs. Δ {delta:.4f} nats, top-1 agreement {100 * top1:.2f} %")


if __name__ == "__main__":
    main()
