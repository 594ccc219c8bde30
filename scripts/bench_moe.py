"""Mixture-of-experts speed: a Qwen3-30B-A3B-shaped MoE (fewer layers and experts) beside a dense model with
the same active parameters, both Q4_K, random weights (tests/support/model_factory.py), in one run.

    python scripts/bench_moe.py [--threads 2] [--layers 2] [--experts 64] [--rounds 2]

Prints for each: single-stream decode tokens/s, 512-token prefill tokens/s, the weight bytes a decoded
token reads (attention + the experts it chose + the output head) and so the decode's effective read
bandwidth. A MoE decode that reads only its tokens' chosen experts runs near the dense model's speed
(same bytes per token); one that touched every expert would be n_expert / n_used times slower. Prefill
reads each chosen expert once per step for all the tokens routed to it.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from support import model_factory as tm  # noqa: E402
from bench_engine import best_of, one_stream_decode, run_to_end  # noqa: E402

# Qwen3-30B-A3B: n_embd 2048, 32 heads x 128 (4 KV heads), 128 experts of width 768, 8 used
SHAPE = dict(n_embd=2048, n_head=32, n_head_kv=4, head_dim=128, n_ctx=4096)
EXPERT_FF, USED = 768, 8
Q4_K_BYTES = 144 / 256  # bytes per weight


def active_bytes(layers: int) -> float:
    """Weight bytes one decoded token reads: q/k/v/o, the chosen experts' gate/up/down, the output head."""
    e, hd = SHAPE["n_embd"], SHAPE["head_dim"]
    attn = e * hd * (2 * SHAPE["n_head"] + 2 * SHAPE["n_head_kv"])
    ffn = 3 * e * EXPERT_FF * USED
    return (layers * (attn + ffn) + e * tm.N_VOCAB) * Q4_K_BYTES


def bench(path: str, threads: int, prefill_len: int = 512, decode_len: int = 64) -> dict:
    """Prefill tok/s of one prompt, decode tok/s of one stream and of 8 (the tiny test vocabulary's ids)."""
    from pyserve import _engine

    eng = _engine.Engine(path, n_threads=threads, max_num_batched_tokens=prefill_len, enable_prefix_caching=False)
    greedy, res = {"temperature": 0.0}, {}

    def prompt(n: int, seed: int) -> list[int]:
        return [(seed * 7919 + i * 104729) % 256 for i in range(n)]

    eng.add("w", prompt(16, 0), greedy, 4, True)  # warm-up: touch the weights once
    run_to_end(eng, {"w": 1})
    eng.add("p", prompt(prefill_len, 1), greedy, 1, True)
    res["prefill_tok_s"] = prefill_len / run_to_end(eng, {"p": 1})[0]
    res["decode_tok_s"] = one_stream_decode(eng, prompt(8, 2), decode_len)
    for i in range(8):
        eng.add(f"b{i}", prompt(8, 10 + i), greedy, decode_len, True)
    _, total, n = run_to_end(eng, {f"b{i}": 1 for i in range(8)})
    res["batch8_tok_s"] = n / total
    return res


def write_models(d: str, layers: int, experts: int) -> dict:
    moe = tm.write_test_model(os.path.join(d, "moe.gguf"), "qwen3moe", qtype="Q4_K", n_layer=layers,
                              n_ff=EXPERT_FF * USED, moe={"n_expert": experts, "n_used": USED, "n_ff": EXPERT_FF},
                              **SHAPE)
    dense = tm.write_test_model(os.path.join(d, "dense.gguf"), "qwen3", qtype="Q4_K", n_layer=layers,
                                n_ff=EXPERT_FF * USED, **SHAPE)
    return {f"qwen3moe {experts}x{EXPERT_FF}, {USED} used": str(moe), f"qwen3 dense, ff {EXPERT_FF * USED}": str(dense)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--experts", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        models = write_models(d, args.layers, args.experts)
        best: dict = {name: {} for name in models}
        for _ in range(args.rounds):  # alternate, keep each one's best: a burst of load elsewhere hits both
            for name, path in models.items():
                best_of(best[name], bench(path, args.threads))
        per_token = active_bytes(args.layers)
        print(f"{args.layers} layers, {args.threads} threads, {per_token / 1e6:.1f} MB of weights read per decoded token")
        for name, r in best.items():
            size = os.path.getsize(models[name]) / 1e6
            print(f"{name:32s} file {size:6.0f} MB  decode {r['decode_tok_s']:6.1f} tok/s "
                  f"({r['decode_tok_s'] * per_token / 1e9:5.2f} GB/s)  8 streams {r['batch8_tok_s']:6.1f} tok/s  "
                  f"prefill {r['prefill_tok_s']:6.1f} tok/s")


if __name__ == "__main__":
    main()
