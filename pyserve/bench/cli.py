"""`pyserve bench`'s command line: its arguments, their checks, and the entry point."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Optional


def _int_list(text: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"concurrency levels must be >= 1: {text!r}")
    return vals


def _float_list(text: str) -> list[float]:
    try:
        vals = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text!r}") from None
    if not vals or any(not v > 0 for v in vals):
        raise argparse.ArgumentTypeError(f"request rates must be > 0 ('inf' allowed): {text!r}")
    return vals


def _load_args(load: argparse._ArgumentGroup) -> None:
    load.add_argument("--concurrency", type=_int_list, default=None,
                      help="closed-loop levels: that many requests always in flight (default 1,4,16,64)")
    load.add_argument("--request-rate", type=_float_list, default=None,
                      help="open-loop levels instead: Poisson arrivals at R requests/s ('inf': all at once); "
                           "with --find-capacity, the one rate its search starts from")
    load.add_argument("--max-concurrency", type=int, default=None,
                      help="cap on requests in flight with --request-rate; upper bound of the --find-capacity "
                           "concurrency search (default 256 with --find-capacity, either search)")
    load.add_argument("--num-prompts", type=int, default=None,
                      help="requests per level (default: max(16, 4 x concurrency), or unbounded with --duration)")
    load.add_argument("--duration", type=float, default=None,
                      help="seconds per level: no new requests after that (those in flight finish)")
    load.add_argument("--warmup", type=int, default=1, help="requests sent (and discarded) before the first level")
    load.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds")


def _prompt_args(data: argparse._ArgumentGroup) -> None:
    data.add_argument("--input-len", type=int, default=256, help="prompt length in tokens")
    data.add_argument("--output-len", type=int, default=128, help="max_tokens of every request")
    data.add_argument("--shared-prefix-len", type=int, default=0,
                      help="tokens at the start of every prompt that are the same for all (prefix-cache test)")
    data.add_argument("--chars-per-token", type=float, default=4.0,
                      help="length estimate when the server has no POST /tokenize")
    data.add_argument("--no-tokenize", action="store_true", help="do not use POST /tokenize; estimate from chars")
    data.add_argument("--seed", type=int, default=0)
    data.add_argument("--temperature", type=float, default=None, help="sent when given (default: server's)")
    data.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                      help="do not send ignore_eos: true (for servers that reject unknown fields)")
    data.add_argument("--extra-body", type=json.loads, default=None, metavar="JSON",
                      help="extra request fields, e.g. '{\"min_tokens\": 128}'")


def _output_args(p: argparse.ArgumentParser) -> None:
    cap = p.add_argument_group("capacity search")
    cap.add_argument("--find-capacity", action="store_true",
                     help="find the highest concurrency within the p99 SLO(s): doubling, then bisecting; with "
                          "--request-rate R, the highest Poisson rate (goodput), doubling from R")
    cap.add_argument("--itl-p99-slo", type=float, default=None, help="seconds, e.g. 0.050")
    cap.add_argument("--ttft-p99-slo", type=float, default=None, help="seconds")
    cap.add_argument("--max-request-rate", type=float, default=None,
                     help="upper bound (requests/s) of the --find-capacity --request-rate search (default 256)")
    cap.add_argument("--rate-resolution", type=float, default=None,
                     help="the rate search ends when its last pass and first fail are within this fraction of "
                          "the pass (default 0.05: 5 %%)")
    out = p.add_argument_group("output")
    out.add_argument("--output-json", default=None, metavar="FILE", help='write {"levels": [...], ...}')
    out.add_argument("--plot", default=None, metavar="FILE", help="PNG of throughput, TTFT and ITL per level")
    out.add_argument("--no-server-metrics", action="store_true", help="do not scrape GET /metrics")
    out.add_argument("--no-progress", action="store_true", help="no progress bar")


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench", help="load-test an OpenAI-compatible server",
        description="Load generator for any OpenAI-compatible server: streams every request and measures "
                    "TTFT, inter-token latency, TPOT, end-to-end latency and throughput per load level.")
    p.add_argument("--base-url", required=True, help="the server, e.g. http://127.0.0.1:8000 (a trailing /v1 is fine)")
    p.add_argument("--model", default=None, help="model name (default: the first of GET /v1/models)")
    p.add_argument("--endpoint", choices=("completions", "chat"), default="completions",
                   help="/v1/completions (default; exact prompt lengths) or /v1/chat/completions")
    p.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    _load_args(p.add_argument_group("load"))
    _prompt_args(p.add_argument_group("prompts"))
    _output_args(p)
    p.set_defaults(func=run)
    return p


def _check_rate_search_args(args: argparse.Namespace) -> Optional[str]:
    if not (args.find_capacity and args.request_rate):
        if args.max_request_rate is not None or args.rate_resolution is not None:
            return "--max-request-rate and --rate-resolution belong to --find-capacity --request-rate R"
        return None
    if len(args.request_rate) != 1 or math.isinf(args.request_rate[0]):
        return "--find-capacity --request-rate takes one finite rate, the search's start (requests/s)"
    if args.max_request_rate is not None and not args.max_request_rate >= args.request_rate[0]:
        return "--max-request-rate must be >= the --request-rate the search starts from"
    if args.rate_resolution is not None and not 0.01 <= args.rate_resolution < 1:
        return "--rate-resolution must be in [0.01, 1)"
    return None


def _check_capacity_args(args: argparse.Namespace) -> Optional[str]:
    if args.itl_p99_slo is None and args.ttft_p99_slo is None:
        return "--find-capacity needs --itl-p99-slo and/or --ttft-p99-slo"
    if args.itl_p99_slo is not None and args.output_len < 2:
        return "--itl-p99-slo needs --output-len >= 2"
    return None


def check_args(args: argparse.Namespace) -> Optional[str]:
    """What is wrong with the arguments, or None."""
    if args.input_len < 1 or args.output_len < 1:
        return "--input-len and --output-len must be >= 1"
    if not 0 <= args.shared_prefix_len < args.input_len:
        return "--shared-prefix-len must be below --input-len"
    if args.num_prompts is not None and args.num_prompts < 1:
        return "--num-prompts must be >= 1"
    if args.duration is not None and args.duration <= 0:
        return "--duration must be > 0"
    if args.max_concurrency is not None and args.max_concurrency < 1:
        return "--max-concurrency must be >= 1"
    if args.request_rate and args.concurrency:
        return "--concurrency and --request-rate exclude each other (cap a rate with --max-concurrency)"
    if args.request_rate and any(math.isinf(r) for r in args.request_rate) and args.num_prompts is None \
            and args.duration is not None:
        return "--request-rate inf with --duration needs --num-prompts (it would send without end)"
    if args.extra_body is not None and not isinstance(args.extra_body, dict):
        return "--extra-body must be a JSON object"
    return (_check_rate_search_args(args) or (_check_capacity_args(args) if args.find_capacity else None)
            or _check_outputs(args))


def _check_outputs(args: argparse.Namespace) -> Optional[str]:
    """A file the run will write needs a folder it can write in: found out now, not after the load."""
    for flag, path in (("--output-json", args.output_json), ("--plot", args.plot)):
        folder = os.path.dirname(os.path.abspath(path)) if path else None
        if folder and not (os.path.isdir(folder) and os.access(folder, os.W_OK)):
            return f"{flag} {path}: {folder} is not a folder this user can write in"
    return None


def run(args: argparse.Namespace) -> int:
    """`pyserve bench ARGS`: the exit status (2: bad arguments, before any request is sent)."""
    from .plot import check_matplotlib
    from .session import bench

    err = check_args(args) or (check_matplotlib() if args.plot else None)
    if err:
        print(f"pyserve bench: error: {err}", file=sys.stderr)
        return 2
    try:
        import asyncio  # here: the other commands' start-up does not pay for it

        return asyncio.run(bench(args))
    except KeyboardInterrupt:
        return 130

