"""One `pyserve bench` run: the client, the model, the prompts, the warm-up, the levels, then the output."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Optional

from .capacity import capacity_line, find_concurrency_capacity, find_rate_capacity
from .client import Target, send_request
from .load import Runner
from .plot import plot_levels
from .prompts import LengthCounter, PromptMaker, PromptSource
from .report import format_table, warn_short_outputs


def root_url(url: str) -> str:
    """scheme://host:port[/path] without a trailing / or /v1."""
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


async def _first_model(client, root: str, headers: dict) -> Optional[str]:
    try:
        resp = await client.get(root + "/v1/models", headers=headers)
        resp.raise_for_status()
        return resp.json()["data"][0]["id"]
    except Exception as e:
        print(f"pyserve bench: error: no --model given and GET {root}/v1/models failed: {e}", file=sys.stderr)
        return None


async def _prompts(args: argparse.Namespace, client, root: str, model: str, headers: dict) -> PromptMaker:
    counter = LengthCounter(None if args.no_tokenize else client, root, model, headers, args.chars_per_token)
    await counter.probe()
    if counter.max_model_len and args.input_len + args.output_len > counter.max_model_len:
        print(f"pyserve bench: warning: input + output length {args.input_len + args.output_len} exceeds the "
              f"server's max_model_len {counter.max_model_len}", file=sys.stderr)
    maker = PromptMaker(counter, args.input_len, args.shared_prefix_len, args.seed)
    await maker.setup()
    print(f"pyserve bench: {model} at {root} ({args.endpoint}), input {args.input_len} {counter.unit}"
          f"{f' (shared prefix {args.shared_prefix_len})' if args.shared_prefix_len else ''}, "
          f"output {args.output_len} tokens", file=sys.stderr)
    return maker


async def _levels(args: argparse.Namespace, runner: Runner) -> dict[str, Any]:
    result: dict[str, Any] = {"levels": runner.levels}
    if args.find_capacity:  # over request rates when one is given, else over concurrency
        find = find_rate_capacity if args.request_rate else find_concurrency_capacity
        result.update(await find(runner, args))
    elif args.request_rate:
        for rate in args.request_rate:
            await runner.open_level(rate, args.max_concurrency)
    else:
        for c in args.concurrency or [1, 4, 16, 64]:
            await runner.closed_level(c)
    return result


def _output(args: argparse.Namespace, result: dict) -> None:
    print(format_table(result["levels"]))
    warn_short_outputs(result["levels"], args.output_len)
    if args.find_capacity:
        print(capacity_line(result))
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(result, f, indent=2)
    if args.plot:
        plot_levels(result, args.plot)


async def bench(args: argparse.Namespace) -> int:
    """The whole run; the exit status."""
    import httpx  # here, not at the top: every `pyserve` command imports this package for its parser

    root = root_url(args.base_url)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(args.timeout, connect=min(args.timeout, 30.0))
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        model = args.model or await _first_model(client, root, headers)
        if model is None:
            return 1
        maker = await _prompts(args, client, root, model, headers)
        source = PromptSource(maker)
        target = Target(root, model, args.endpoint, args.output_len, headers, args.ignore_eos, args.temperature,
                        args.extra_body or {})
        runner = Runner(args, client, target, source, None if args.no_server_metrics else root + "/metrics")
        for _ in range(args.warmup):
            r = await send_request(client, target, await source.get())
            if not r.ok:
                print(f"pyserve bench: warning: warm-up request failed: {r.error}", file=sys.stderr)
        result = await _levels(args, runner)
    result["config"] = {k: v for k, v in vars(args).items() if k not in ("func", "api_key", "command")}
    result["config"].update(model=model, base_url=root, length_unit=maker.counter.unit,
                            prompt_len_mean=sum(maker.lengths) / len(maker.lengths) if maker.lengths else None)
    _output(args, result)
    return 0
