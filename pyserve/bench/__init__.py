"""`pyserve bench`: a load generator for any OpenAI-compatible server.

    pyserve bench --base-url http://127.0.0.1:8000 --concurrency 1,4,16,64 --input-len 256 --output-len 128
    pyserve bench --base-url URL --request-rate 2,4,8 --duration 60          # open loop, Poisson arrivals
    pyserve bench --base-url URL --find-capacity --itl-p99-slo 0.050         # highest concurrency within SLO
    pyserve bench --base-url URL --find-capacity --request-rate 1 --itl-p99-slo 0.050 --ttft-p99-slo 1
                                                          # highest Poisson rate within both (goodput), from 1/s

Every request streams (SSE); the client measures, per request, TTFT (request sent -> first chunk with
content), each inter-token gap (ITL: the gaps between content chunks), TPOT ((e2e - ttft) / (tokens - 1)) and
e2e latency; per level, output tokens/s and requests/s over the level's wall time, errors, and mean/p50/p90/
p95/p99/max of each latency. Output tokens are the server's `usage.completion_tokens` (asked for with
`stream_options.include_usage`) or, when the server sends no usage, the number of content chunks.

Prompts are random English words cut to `--input-len` tokens, counted with the server's `POST /tokenize`
(vLLM's format) when it has one, else estimated from characters (`--chars-per-token`). With
`--shared-prefix-len P` every prompt starts with the same P-token text (for prefix caches).

Nothing here is specific to pyserve except an optional scrape of `GET /metrics` (Prometheus text) before
and after each level, whose counter deltas land in the JSON under `server_metrics`.

In open loop a request's TTFT and e2e count from its arrival, so waiting for a slot under `--max-concurrency`
is part of them (also given alone, as `queue_wait`).

Modules: cli (arguments, entry point), session (one run), load (levels), capacity (the searches over
concurrency and request rate, the SLO verdicts), client (one request's timing), prompts, stats (percentiles),
prometheus (metrics text), report (level JSON, table), plot; launch starts a real `pyserve serve` for the tests
and scripts.
"""
from __future__ import annotations

import importlib

from .cli import add_parser, check_args, run

# The rest loads on first use: every `pyserve` command imports this package for `add_parser`.
_LAZY = {
    "STAT_KEYS": "stats", "summarize": "stats",
    "parse_metrics": "prometheus", "metrics_delta": "prometheus", "total": "prometheus", "totals": "prometheus",
    "RequestResult": "client", "chunk_text": "client",
    "LengthCounter": "prompts", "PromptMaker": "prompts",
    "search_capacity": "capacity", "search_rate": "capacity", "slo_failures": "capacity",
    "capacity_line": "capacity",
    "level_report": "report", "format_table": "report",
    "plot_levels": "plot",
}

__all__ = ["add_parser", "check_args", "run", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
