"""The `pyserve` command line."""
from __future__ import annotations

import argparse
import sys
import time
from typing import Optional, Sequence


def _engine_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="GGUF file (default: Gemma 3 270M Q4_K_M from its PyPI package)")
    p.add_argument("--threads", type=int, default=0, help="engine threads (default: one per core)")
    p.add_argument("--ctx-size", type=int, default=0, help="max tokens per sequence (default: the model's, at most 8192)")
    p.add_argument("--num-kv-blocks", type=int, default=0, help="KV cache blocks of 16 tokens")
    p.add_argument("--kv-cache-memory", type=int, default=0, help="KV cache size in bytes")
    p.add_argument("--max-num-seqs", type=int, default=64)


def _generate(args: argparse.Namespace) -> int:
    from .llm import LLM
    from .sampling_params import SamplingParams

    llm = LLM(args.model, n_threads=args.threads, n_ctx=args.ctx_size, num_kv_blocks=args.num_kv_blocks,
              kv_cache_memory=args.kv_cache_memory, max_num_seqs=args.max_num_seqs)
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed)
    t0 = time.perf_counter()
    out = llm.generate([args.prompt], params)[0].outputs[0]
    dt = time.perf_counter() - t0
    print(args.prompt + out.text)
    print(f"[{len(out.token_ids)} tokens in {dt:.2f} s, finish_reason={out.finish_reason}]", file=sys.stderr)
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="pyserve", description="A local LLM server for GGUF models.")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="one-shot generation from a prompt")
    _engine_args(gen)
    gen.add_argument("prompt")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.set_defaults(func=_generate)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"pyserve: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
