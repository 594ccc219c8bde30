"""The `pyserve` command line."""
from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Optional, Sequence

from . import bench
from .server.replicas import add_replica_args
from .server.router_launch import add_router_parser


def _engine_args(p: argparse.ArgumentParser, models: bool = False) -> None:
    if models:
        p.add_argument("--model", action="append", default=None, metavar="PATH|NAME=PATH",
                       help="a GGUF file, served under its file name or NAME (repeatable; default: Gemma 3 270M "
                            "Q4_K_M from its PyPI package, unless --models-dir or --models-config is given)")
    else:
        p.add_argument("--model", default=None, help="GGUF file (default: Gemma 3 270M Q4_K_M from its PyPI package)")
    p.add_argument("--threads", type=int, default=0, help="engine threads (default: one per core)")
    p.add_argument("--ctx-size", type=int, default=0, help="max tokens per sequence (default: the model's, at most 8192)")
    kv = p.add_mutually_exclusive_group()
    kv.add_argument("--num-kv-blocks", type=int, default=0, help="KV cache blocks of 16 tokens")
    kv.add_argument("--kv-cache-memory", type=_bytes, default=0, help="KV cache size in bytes (K/M/G suffixes allowed)")
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="tokens per engine step at most (default 512); with --target-itl a hard cap, without it "
                        "the budget (a smaller one cuts prompts into more chunks, so streams wait less)")
    p.add_argument("--speculative-ngram", type=_speculative_ngram, default=None, metavar="K",
                   help="speculative decoding by prompt lookup: each step drafts up to K tokens per stream from "
                        "earlier text that its last tokens match, verified in the same forward pass; outputs are "
                        "unchanged, bit for bit (default 7 for serve, 0 for generate; 0: off)")
    p.add_argument("--speculative-config", type=_speculative_config, default=None, metavar="JSON",
                   help='vLLM\'s spelling, e.g. \'{"method": "ngram", "num_speculative_tokens": 5}\' (wins over '
                        "--speculative-ngram)")


def _generate(args: argparse.Namespace) -> int:
    from .engine.llm import LLM
    from .engine.sampling_params import SamplingParams

    llm = LLM(args.model, n_threads=args.threads, n_ctx=args.ctx_size, num_kv_blocks=args.num_kv_blocks,
              kv_cache_memory=args.kv_cache_memory, max_num_seqs=args.max_num_seqs,
              max_num_batched_tokens=args.max_num_batched_tokens or 512,
              speculative_ngram=_draft_tokens(args, 0))
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed)
    t0 = time.perf_counter()
    out = llm.generate([args.prompt], params)[0].outputs[0]
    dt = time.perf_counter() - t0
    print(args.prompt + out.text)
    print(f"[{len(out.token_ids)} tokens in {dt:.2f} s, finish_reason={out.finish_reason}]", file=sys.stderr)
    return 0


def _speculative_ngram(text: str) -> int:
    from .engine.speculative import draft_tokens

    try:
        return draft_tokens(int(text))
    except ValueError:  # not an integer, or one draft_tokens refuses
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}") from None


def _speculative_config(text: str) -> dict:
    """vLLM's --speculative-config JSON, checked here (its method must be "ngram")."""
    from .engine.speculative import draft_tokens

    try:
        cfg = json.loads(text)
        draft_tokens(None, cfg)
    except ValueError as e:  # json.JSONDecodeError too
        raise argparse.ArgumentTypeError(str(e)) from None
    return cfg


def _draft_tokens(args: argparse.Namespace, default: int) -> int:
    from .engine.speculative import draft_tokens

    return draft_tokens(default if args.speculative_ngram is None else args.speculative_ngram,
                        args.speculative_config)


def _bytes(text: str) -> int:
    """A byte count, with an optional K/M/G/T suffix (powers of 1024)."""
    from .server.model_options import byte_size

    try:
        return byte_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _serve(args: argparse.Namespace) -> int:
    if args.replicas > 1:  # N replicas behind sglang-router (server/replicas.py)
        from .server.replicas import run_replicas

        return run_replicas(args)
    from .server.runner import DEFAULT_SPECULATIVE_NGRAM, DEFAULT_TARGET_ITL, ServeOptions, run

    max_loaded = args.max_loaded_models if args.max_loaded_models is not None else 0 if args.models_memory else 1
    return run(ServeOptions(models=args.model or [], host=args.host, port=args.port,
                            served_model_name=args.served_model_name or [], models_dir=args.models_dir,
                            models_config=args.models_config, max_loaded_models=max_loaded,
                            models_memory=args.models_memory, keep_alive=args.keep_alive, preload=args.preload or [],
                            chat_template=args.chat_template,
                            api_keys=args.api_key or [], api_key_file=args.api_key_file,
                            metrics_require_key=args.metrics_require_key,
                            allowed_origins=[o for v in (args.allowed_origins or []) for o in v.split(",") if o],
                            rate_limit_rpm=args.rate_limit_rpm, rate_limit_tpm=args.rate_limit_tpm,
                            max_waiting=args.max_waiting, max_queue_wait=args.max_queue_wait,
                            max_body_size=args.max_body_size, body_timeout=args.body_timeout,
                            keep_alive_timeout=args.keep_alive_timeout, drain_timeout=args.drain_timeout,
                            stalled_client_timeout=args.stalled_client_timeout, n_threads=args.threads,
                            n_ctx=args.ctx_size, num_kv_blocks=args.num_kv_blocks,
                            kv_cache_memory=args.kv_cache_memory, max_num_seqs=args.max_num_seqs,
                            max_num_batched_tokens=args.max_num_batched_tokens or 512,
                            target_itl=DEFAULT_TARGET_ITL if args.target_itl is None else args.target_itl,
                            speculative_ngram=_draft_tokens(args, DEFAULT_SPECULATIVE_NGRAM),
                            trust_request_chat_template=args.trust_request_chat_template,
                            pooling=args.pooling, normalize_embeddings=not args.no_normalize_embeddings,
                            tool_call_parser=args.tool_call_parser))


def _generate_parser(sub) -> None:
    gen = sub.add_parser("generate", help="one-shot generation from a prompt")
    _engine_args(gen)
    gen.add_argument("prompt")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.set_defaults(func=_generate)


def _serve_parser(sub) -> None:
    from .openai.tool_parsers import TOOL_PARSERS  # pure Python: cheap to import for --help

    srv = sub.add_parser("serve", help="an OpenAI-compatible HTTP server")
    _engine_args(srv, models=True)
    srv.add_argument("--host", default="127.0.0.1")
    srv.add_argument("--port", type=int, default=8000, help="0: any free port (the ready line names it)")
    srv.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                     help="the names clients use for the one --model: the first, then aliases (default: the file "
                          "name)")
    _models_args(srv)
    srv.add_argument("--chat-template", default=None, metavar="FILE", help="a Jinja chat template file")
    srv.add_argument("--trust-request-chat-template", action="store_true",
                     help="render a 'chat_template' sent in a request (with CPU and memory limits); refused "
                          "with 400 otherwise")
    srv.add_argument("--pooling", choices=("last", "mean"), default="last",
                     help="/v1/embeddings: the last token's final-norm hidden state (vLLM's default for decoder "
                          "models) or the mean over the prompt")
    srv.add_argument("--no-normalize-embeddings", action="store_true", help="embeddings without L2 normalisation")
    srv.add_argument("--target-itl", type=float, default=None, metavar="SECONDS",
                     help="step-time target while streams run: each step takes only the prompt tokens that keep "
                          "its predicted time under this, so inter-token latency holds under load (default 0.020; "
                          "0: the fixed --max-num-batched-tokens budget)")
    srv.add_argument("--tool-call-parser", default=None, choices=sorted(TOOL_PARSERS), metavar="NAME",
                     help="how the model writes tool calls: " + ", ".join(sorted(TOOL_PARSERS)) +
                          " (default: detected from the chat template; a template that renders no tools gets "
                          "the JSON polyfill)")
    _edge_args(srv)
    add_replica_args(srv)
    srv.set_defaults(func=_serve)


def _models_args(srv: argparse.ArgumentParser) -> None:
    srv.add_argument("--models-dir", default=None, metavar="DIR",
                     help="serve every *.gguf of DIR under its file name, loaded on its first request (files added "
                          "later are found)")
    srv.add_argument("--models-config", default=None, metavar="FILE",
                     help="per-model settings, a TOML (or YAML) table per model: path, aliases, ctx_size, threads, "
                          "kv_cache_memory, num_kv_blocks, max_num_seqs, max_num_batched_tokens, chat_template")
    srv.add_argument("--max-loaded-models", type=int, default=None, metavar="N",
                     help="models loaded at once; the least recently used makes room, an idle one first, a busy "
                          "one once its requests end (default 1, no bound with --models-memory; 0: no bound)")
    srv.add_argument("--models-memory", type=_bytes, default=0, metavar="BYTES",
                     help="memory the loaded models may hold, each its file plus its KV cache (0: no bound)")
    srv.add_argument("--keep-alive", type=float, default=0.0, metavar="SECONDS",
                     help="unload a model unused this long (0: keep it; --keep-alive-timeout is the connections')")
    srv.add_argument("--preload", action="append", default=None, metavar="NAME",
                     help="load this model at start (repeatable); /health is 200 once they are loaded")


def _edge_args(srv: argparse.ArgumentParser) -> None:
    srv.add_argument("--api-key", action="append", default=None, metavar="KEY",
                     help="require 'Authorization: Bearer KEY' (repeatable; also PYSERVE_API_KEY)")
    srv.add_argument("--api-key-file", default=None, metavar="FILE", help="API keys, one per line")
    srv.add_argument("--metrics-require-key", action="store_true", help="/metrics needs an API key too")
    srv.add_argument("--allowed-origins", action="append", default=None, metavar="ORIGINS",
                     help="CORS: comma-separated origins allowed ('*': any); off by default")
    srv.add_argument("--rate-limit-rpm", type=int, default=0, help="requests per minute per key (0: off)")
    srv.add_argument("--rate-limit-tpm", type=int, default=0,
                     help="tokens (prompt + max_tokens) per minute per key (0: off)")
    srv.add_argument("--max-waiting", type=int, default=0,
                     help="sequences allowed to wait beyond the running batch; more get 429 (0: unbounded)")
    srv.add_argument("--max-queue-wait", type=float, default=0.0,
                     help="refuse (429) a request estimated to start later than this many seconds, and (503) one "
                          "that waited this long for room to load its model (0: off)")
    srv.add_argument("--max-body-size", type=_bytes, default=8 << 20, help="largest request body (413 above)")
    srv.add_argument("--body-timeout", type=float, default=30.0, help="seconds to receive a body (408 after)")
    srv.add_argument("--keep-alive-timeout", type=float, default=15.0,
                     help="seconds an idle connection (or one sending its headers) is kept")
    srv.add_argument("--stalled-client-timeout", type=float, default=30.0,
                     help="abort a stream whose client has not read for this many seconds (0: never)")
    srv.add_argument("--drain-timeout", type=float, default=30.0,
                     help="seconds in-flight requests may run on after SIGINT/SIGTERM")


def _parse(parser: argparse.ArgumentParser, argv: Optional[Sequence[str]]):
    """Flags no parser knows are an error, except for a command that forwards them (`pyserve router`)."""
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "forward_unknown", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra, args.argv = extra, list(sys.argv[1:] if argv is None else argv)
    return args


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="pyserve", description="A local LLM server for GGUF models.")
    sub = parser.add_subparsers(dest="command", required=True)
    _generate_parser(sub)
    _serve_parser(sub)
    bench.add_parser(sub)
    add_router_parser(sub)
    args = _parse(parser, argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"pyserve: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
