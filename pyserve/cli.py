"""The `pyserve` command line."""
from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import time
from typing import Optional, Sequence

from . import bench
from .server.replicas import add_replica_args
from .server.router_launch import add_router_parser


def _engine_args(p: argparse.ArgumentParser, defaults, models: bool = False) -> None:
    """--model, then a flag for every EngineOptions field (its help and default from the field), and vLLM's
    --speculative-config."""
    from .engine.options import EngineOptions

    if models:
        p.add_argument("--model", action="append", default=None, metavar="PATH|NAME=PATH",
                       help="a GGUF file, served under its file name or NAME (repeatable; default: Gemma 3 270M "
                            "Q4_K_M from its PyPI package, unless --models-dir or --models-config is given)")
    else:
        p.add_argument("--model", default=None, help="GGUF file (default: Gemma 3 270M Q4_K_M from its PyPI package)")
    groups: dict = {}
    for f in dataclasses.fields(EngineOptions):
        _engine_flag(p, groups, f, getattr(defaults, f.name))
    p.add_argument("--speculative-config", type=_speculative_config, default=None, metavar="JSON",
                   help='vLLM\'s spelling, e.g. \'{"method": "ngram", "num_speculative_tokens": 5}\' (wins over '
                        "--speculative-ngram)")


def _engine_flag(p: argparse.ArgumentParser, groups: dict, f, default) -> None:
    from .engine.options import option

    opt = option(f)
    if opt.exclusive and opt.exclusive not in groups:
        groups[opt.exclusive] = p.add_mutually_exclusive_group()
    target = groups[opt.exclusive] if opt.exclusive else p
    shown = opt.zero_means if opt.zero_means and not default else default
    kw = dict(dest=f.name, default=None, help=f"{opt.help} (default: {shown})")
    if str(f.type) == "bool":
        target.add_argument(opt.flag, action=argparse.BooleanOptionalAction, **kw)
    else:
        target.add_argument(opt.flag, type=_option_type(f), metavar=opt.metavar or "N", **kw)


def _option_type(f):
    """argparse's type for one EngineOptions field: its parser, then EngineOptions' own check of the value."""
    from .engine.options import EngineOptions, parse_value

    def parse(text: str):
        try:
            value = parse_value(f, text)
            EngineOptions().replace(**{f.name: value})
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return value
    parse.__name__ = f.name
    return parse


def _engine_options(args: argparse.Namespace, defaults):
    """The engine options the flags give, over `defaults`."""
    from .engine.options import FIELDS
    from .engine.speculative import speculation

    given = {name: getattr(args, name) for name in FIELDS if getattr(args, name) is not None}
    if args.speculative_config is not None:
        given.update(speculation(args.speculative_config))
    return defaults.replace(**given)


def _generate(args: argparse.Namespace) -> int:
    from .engine.llm import LLM
    from .engine.options import EngineOptions
    from .engine.sampling_params import SamplingParams

    llm = LLM(args.model, options=_engine_options(args, EngineOptions()))
    params = SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens, seed=args.seed)
    t0 = time.perf_counter()
    out = llm.generate([args.prompt], params)[0].outputs[0]
    dt = time.perf_counter() - t0
    print(args.prompt + out.text)
    print(f"[{len(out.token_ids)} tokens in {dt:.2f} s, finish_reason={out.finish_reason}]", file=sys.stderr)
    return 0


def _speculative_config(text: str) -> dict:
    """vLLM's --speculative-config JSON, checked here (its method "ngram" or "mtp")."""
    from .engine.speculative import speculation

    try:
        cfg = json.loads(text)
        speculation(cfg)
    except ValueError as e:  # json.JSONDecodeError too
        raise argparse.ArgumentTypeError(str(e)) from None
    return cfg


def _bytes(text: str) -> int:
    """A byte count, with an optional K/M/G/T suffix (powers of 1024)."""
    from .engine.options import byte_size

    try:
        return byte_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _serve(args: argparse.Namespace) -> int:
    if args.replicas > 1:  # N replicas behind sglang-router (server/replicas.py)
        from .server.replicas import run_replicas

        return run_replicas(args)
    # The server's imports allocate objects that all live as long as the process: no collector passes over
    # them (~8 % of the imports' time). runner.run freezes them and turns the collector back on.
    gc.disable()
    from .engine.options import EngineOptions

    engine = _engine_options(args, EngineOptions.serving())
    _load_early(args, engine)
    from .server.runner import ServeOptions, run

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
                            stalled_client_timeout=args.stalled_client_timeout,
                            sse_keepalive=args.sse_keepalive, shared_prefix_cache=args.shared_prefix_cache,
                            engine=engine,
                            trust_request_chat_template=args.trust_request_chat_template,
                            pooling=args.pooling, normalize_embeddings=not args.no_normalize_embeddings,
                            tool_call_parser=args.tool_call_parser,
                            reasoning_parser=args.reasoning_parser, reasoning_budget=args.reasoning_budget,
                            response_store_size=args.response_store_size,
                            response_store_ttl=args.response_store_ttl,
                            response_store_bytes=args.response_store_bytes))


def _load_early(args: argparse.Namespace, engine) -> None:
    """One model, no catalog and no memory budget (the server then loads it at start): its load begins now,
    beside the server's imports (model_load.py hands it over; runner.py drops it if its load did not take it)."""
    if args.models_dir or args.models_config or args.models_memory or len(args.model or []) > 1:
        return
    from .engine.model_load import start_early
    from .server.model_options import model_arg

    start_early(model_arg(args.model[0]).path if args.model else None, engine.as_dict())


def _generate_parser(sub) -> None:
    gen = sub.add_parser("generate", help="one-shot generation from a prompt")
    from .engine.options import EngineOptions

    _engine_args(gen, EngineOptions())
    gen.add_argument("prompt")
    gen.add_argument("--max-tokens", type=int, default=64)
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.set_defaults(func=_generate)


def _serve_parser(sub) -> None:
    from .api.chat.reasoning import REASONING_PARSERS  # pure Python: cheap to import for --help
    from .api.chat.tool_parsers import TOOL_PARSERS

    from .engine.options import EngineOptions

    srv = sub.add_parser("serve", help="an OpenAI-compatible HTTP server")
    _engine_args(srv, EngineOptions.serving(), models=True)
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
    srv.add_argument("--tool-call-parser", default=None, choices=sorted(TOOL_PARSERS), metavar="NAME",
                     help="how the model writes tool calls: " + ", ".join(sorted(TOOL_PARSERS)) +
                          " (default: detected from the chat template; a template that renders no tools gets "
                          "the JSON polyfill)")
    srv.add_argument("--reasoning-parser", default="auto", choices=["auto", "none", *sorted(REASONING_PARSERS)],
                     metavar="NAME", help="how the model writes its reasoning (split into reasoning_content): " +
                     ", ".join(sorted(REASONING_PARSERS)) + "; auto (default): detected from the chat template; "
                     "none: the text is left alone")
    srv.add_argument("--reasoning-budget", type=int, default=-1, metavar="N",
                     help="tokens a reasoning may take unless a request sends thinking_token_budget; then the "
                          "server closes the think block and the answer follows (-1, the default: no bound)")
    _edge_args(srv)
    add_replica_args(srv)
    srv.set_defaults(func=_serve)


def _models_args(srv: argparse.ArgumentParser) -> None:
    from .engine.options import BY_KEY

    srv.add_argument("--models-dir", default=None, metavar="DIR",
                     help="serve every *.gguf of DIR under its file name, loaded on its first request (files added "
                          "later are found)")
    srv.add_argument("--models-config", default=None, metavar="FILE",
                     help="per-model settings, a TOML (or YAML) table per model: path, aliases, chat_template, "
                          "and any engine flag's name (" + ", ".join(BY_KEY) + ")")
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
    srv.add_argument("--sse-keepalive", type=float, default=10.0, metavar="SECONDS",
                     help="send an SSE comment line (': keep-alive') on a stream silent this long, e.g. through a "
                          "long prefill, so clients and proxies with read timeouts keep it (0: never)")
    srv.add_argument("--shared-prefix-cache", action="store_true",
                     help="with several API keys: let every key's requests reuse each other's cached prompts "
                          "(default: each key's prompts are its own, so no key can probe another's by timing)")
    srv.add_argument("--response-store-size", type=int, default=1000, metavar="N",
                     help="past /v1/responses kept in memory for previous_response_id and GET (0: off)")
    srv.add_argument("--response-store-ttl", type=float, default=3600.0, metavar="SECONDS",
                     help="seconds a stored response is kept")
    srv.add_argument("--response-store-bytes", type=_bytes, default=256 << 20, metavar="BYTES",
                     help="bytes the stored responses may take, as JSON (default 256M; the oldest go first)")
    srv.add_argument("--drain-timeout", type=float, default=30.0,
                     help="seconds in-flight requests may run on after SIGINT/SIGTERM")


def _parse(parser: argparse.ArgumentParser, argv: Optional[Sequence[str]]):
    """Flags no parser knows are an error, except for a command that forwards them (`pyserve router`)."""
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "forward_unknown", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.extra, args.argv = extra, list(sys.argv[1:] if argv is None else argv)
    return args


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pyserve", description="A local LLM server for GGUF models.")
    sub = parser.add_subparsers(dest="command", required=True)
    _generate_parser(sub)
    _serve_parser(sub)
    bench.add_parser(sub)
    add_router_parser(sub)
    return parser


def engine_options(argv: Sequence[str]):
    """The EngineOptions a `pyserve serve …` or `pyserve generate …` command line gives (for tests and tools)."""
    from .engine.options import EngineOptions

    args = _parse(build_parser(), argv)
    return _engine_options(args, EngineOptions.serving() if args.command == "serve" else EngineOptions())


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = _parse(build_parser(), argv)
    try:
        return args.func(args)
    except (ValueError, FileNotFoundError) as e:
        print(f"pyserve: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
