"""A level's figures from its requests' results, and the table printed at the end of a run."""
from __future__ import annotations

import sys
from collections import Counter
from typing import Optional

from .client import RequestResult
from .stats import summarize


def level_report(results: list[RequestResult], wall: float, concurrency: Optional[int]) -> dict:
    """The JSON of one level: counts, throughput over its wall time (s), and each latency's summary (s)."""
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    prompt_tokens = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    rep = {
        "concurrency": concurrency,
        "completed": len(ok),
        "errors": len(results) - len(ok),
        "duration_s": wall,
        "output_tokens": out_tokens,
        "output_tokens_per_s": out_tokens / wall if wall > 0 else 0.0,
        "requests_per_s": len(ok) / wall if wall > 0 else 0.0,
        "ttft": summarize(r.ttft for r in ok if r.ttft is not None),
        "itl": summarize(g for r in ok for g in r.itl),
        "tpot": summarize(t for r in ok if (t := r.tpot) is not None),
        "e2e": summarize(r.e2e for r in ok if r.e2e is not None),
        "output_tokens_mean": out_tokens / len(ok) if ok else None,
        "prompt_tokens_mean": sum(prompt_tokens) / len(prompt_tokens) if prompt_tokens else None,
        "usage_reported": all(r.usage_reported for r in ok) if ok else None,
    }
    errors = Counter(r.error or "error" for r in results if not r.ok)
    if errors:
        rep["error_messages"] = dict(errors.most_common(5))
    return rep


def ms(v: Optional[float]) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


def _s(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.2f}"


def _row(lv: dict, rate_mode: bool) -> list[str]:
    x = lv.get("request_rate") if rate_mode else lv["concurrency"]
    return [("inf" if x is None else f"{x:g}"), str(lv["completed"]), str(lv["errors"]),
            f"{lv['requests_per_s']:.2f}", f"{lv['output_tokens_per_s']:.1f}",
            "-" if lv["output_tokens_mean"] is None else f"{lv['output_tokens_mean']:.1f}",
            ms(lv["ttft"]["p50"]), ms(lv["ttft"]["p99"]), ms(lv["itl"]["p50"]), ms(lv["itl"]["p99"]),
            ms(lv["tpot"]["p50"]), ms(lv["tpot"]["p99"]), _s(lv["e2e"]["p50"]), _s(lv["e2e"]["p99"])]


def format_table(levels: list[dict]) -> str:
    rate_mode = any(lv.get("mode") == "poisson" for lv in levels)
    head = ["rate" if rate_mode else "conc", "done", "err", "req/s", "out tok/s", "tok/req", "TTFT p50", "TTFT p99",
            "ITL p50", "ITL p99", "TPOT p50", "TPOT p99", "E2E p50", "E2E p99"]
    rows = [_row(lv, rate_mode) for lv in levels]
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    lines.append("(TTFT/ITL/TPOT in ms, E2E in s)")
    return "\n".join(lines)


def warn_short_outputs(levels: list[dict], output_len: int) -> None:
    """Latencies of requests that stopped early are for shorter outputs than asked: say so."""
    short = [lv["output_tokens_mean"] for lv in levels
             if lv["output_tokens_mean"] is not None and lv["output_tokens_mean"] < 0.9 * output_len]
    if short:
        print(f"pyserve bench: warning: requests ended before --output-len {output_len} tokens (mean "
              f"{min(short):.1f}): the server ignores ignore_eos, or stops or interrupts streams; latencies are "
              f"for shorter outputs", file=sys.stderr)
