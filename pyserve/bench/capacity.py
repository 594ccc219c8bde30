"""The capacity searches: the highest closed-loop concurrency, or the highest Poisson arrival rate (goodput),
at which a level holds the p99 SLOs; each level's verdict; the search's JSON and its line of the text report.

A run's JSON then holds, besides its "levels" (each with "slo_ok" and "slo_failed"):
    "capacity": 2 (concurrent requests) or 6.25 (requests/s; 0 when even the first level broke an SLO),
    "slo": {"itl_p99": s | null, "ttft_p99": s | null, "max_concurrency": n (the search's bound, or the cap on
            requests in flight of the rate search)},
    "capacity_search": {"axis": "concurrency" | "request_rate", "unit": ..., "start", "max", "resolution",
                        "first_over": null (no level tried broke an SLO) | {axis: x, "failed": ["ttft_p99", ...],
                                      "itl_p99": s, "ttft_p99": s, "errors": n}}.
"""
from __future__ import annotations

import argparse
import sys
from typing import Awaitable, Callable, Optional

from .report import ms

DEFAULT_MAX_CONCURRENCY = 256
DEFAULT_MAX_REQUEST_RATE = 256.0  # requests/s
DEFAULT_RATE_RESOLUTION = 0.05  # the rate search ends when its last pass and first fail are this fraction apart
UNITS = {"concurrency": "concurrent requests", "request_rate": "requests/s"}


def slo_failures(rep: dict, itl_slo: Optional[float], ttft_slo: Optional[float]) -> list[str]:
    """What a level broke, in order: "errors" (a request failed, or none completed), "itl_p99", "ttft_p99"."""
    failed = ["errors"] if rep["errors"] or not rep["completed"] else []
    for key, slo in (("itl", itl_slo), ("ttft", ttft_slo)):
        if slo is not None and (rep[key]["p99"] is None or rep[key]["p99"] > slo):
            failed.append(f"{key}_p99")
    return failed


def judge(rep: dict, args: argparse.Namespace, label: str) -> bool:
    """Sets the level's "slo_ok" and "slo_failed", says so on stderr; whether it held."""
    rep["slo_failed"] = slo_failures(rep, args.itl_p99_slo, args.ttft_p99_slo)
    rep["slo_ok"] = not rep["slo_failed"]
    verdict = "within SLO" if rep["slo_ok"] else "over SLO (" + ", ".join(rep["slo_failed"]) + ")"
    print(f"  {label}: ITL p99 {ms(rep['itl']['p99'])} ms, TTFT p99 {ms(rep['ttft']['p99'])} ms, "
          f"{rep['errors']} errors -> {verdict}", file=sys.stderr)
    return rep["slo_ok"]


async def _search(probe: Callable, start, maximum, midpoint: Callable):
    """The highest level in [start, maximum] for which `probe` holds: doubling from `start` until it fails (or
    `maximum` is reached), then bisecting between the last pass and the first fail at `midpoint(good, bad)`
    until it says None (close enough). 0 when even `start` fails. Assumes the SLO holds below some point and
    fails above it."""
    good, level = 0, start
    while await probe(level):
        good = level
        if level >= maximum:
            return good
        level = min(2 * level, maximum)
    if not good:
        return type(start)(0)
    bad = level
    while (mid := midpoint(good, bad)) is not None:
        if await probe(mid):
            good = mid
        else:
            bad = mid
    return good


async def search_capacity(probe: Callable[[int], Awaitable[bool]], max_concurrency: int, start: int = 1) -> int:
    """The highest concurrency in [start, max_concurrency] within the SLOs (_search; bisecting to 1)."""
    return await _search(probe, start, max_concurrency, lambda good, bad: (good + bad) // 2 if bad - good > 1 else None)


def _round_rate(rate: float) -> float:
    """3 significant digits: levels read 1.25 and 1.38, not 1.3671875."""
    return float(f"{rate:.3g}")


async def search_rate(probe: Callable[[float], Awaitable[bool]], start: float, max_rate: float,
                      resolution: float) -> float:
    """The highest rate (requests/s) in [start, max_rate] within the SLOs (_search), bisecting until the last
    pass and the first fail are within `resolution` of the pass (a fraction: 0.05 is 5 %). 0.0 when even
    `start` fails."""
    def midpoint(good: float, bad: float) -> Optional[float]:
        if bad - good <= resolution * good:
            return None
        mid = _round_rate((good + bad) / 2)
        return mid if good < mid < bad else None  # rounding left nothing between them

    return await _search(probe, float(start), max_rate, midpoint)


def _first_over(levels: list[dict], axis: str) -> Optional[dict]:
    """The lowest level tried that broke an SLO (the search's bracket ends just below it), or None."""
    over = [lv for lv in levels if lv.get("slo_failed")]
    if not over:
        return None
    lv = min(over, key=lambda lv: lv[axis])
    return {axis: lv[axis], "failed": lv["slo_failed"], "itl_p99": lv["itl"]["p99"], "ttft_p99": lv["ttft"]["p99"],
            "errors": lv["errors"]}


def _result(args: argparse.Namespace, levels: list[dict], axis: str, capacity, bounds: dict, cap: int) -> dict:
    levels.sort(key=lambda lv: lv[axis])
    return {"capacity": capacity,
            "slo": {"itl_p99": args.itl_p99_slo, "ttft_p99": args.ttft_p99_slo, "max_concurrency": cap},
            "capacity_search": {"axis": axis, "unit": UNITS[axis], **bounds, "first_over": _first_over(levels, axis)}}


async def find_concurrency_capacity(runner, args: argparse.Namespace) -> dict:
    """search_capacity over closed levels of `runner` (a load.Runner), each level run once; the JSON keys."""
    max_c = args.max_concurrency or DEFAULT_MAX_CONCURRENCY
    tried: dict[int, bool] = {}

    async def probe(c: int) -> bool:
        if c not in tried:
            tried[c] = judge(await runner.closed_level(c), args, f"concurrency {c}")
        return tried[c]

    capacity = await search_capacity(probe, max_c)
    return _result(args, runner.levels, "concurrency", capacity, {"start": 1, "max": max_c, "resolution": 1}, max_c)


async def find_rate_capacity(runner, args: argparse.Namespace) -> dict:
    """search_rate over Poisson levels of `runner` from the one --request-rate given, at most --max-concurrency
    (default 256) requests in flight; the JSON keys."""
    cap = args.max_concurrency or DEFAULT_MAX_CONCURRENCY
    bounds = {"start": args.request_rate[0], "max": args.max_request_rate or DEFAULT_MAX_REQUEST_RATE,
              "resolution": args.rate_resolution or DEFAULT_RATE_RESOLUTION}
    tried: dict[float, bool] = {}

    async def probe(rate: float) -> bool:
        if rate not in tried:
            tried[rate] = judge(await runner.open_level(rate, cap), args, f"rate {rate:g}/s")
        return tried[rate]

    capacity = await search_rate(probe, bounds["start"], bounds["max"], bounds["resolution"])
    return _result(args, runner.levels, "request_rate", capacity, bounds, cap)


def capacity_line(result: dict) -> str:
    """The text report's line: the capacity, the SLOs it holds, and the level that broke them (or the bound)."""
    search, slo = result["capacity_search"], result["slo"]
    axis, unit = search["axis"], search["unit"]
    named = (("ITL p99", "itl_p99"), ("TTFT p99", "ttft_p99"))
    slos = ", ".join(f"{name} {slo[key] * 1000:g} ms" for name, key in named if slo[key] is not None)
    how = f" (Poisson arrivals, at most {slo['max_concurrency']} in flight)" if axis == "request_rate" else ""
    line = f"capacity: {result['capacity']:g} {unit}{how} within {slos}"
    over = search["first_over"]
    if over is None:
        flag = "--max-request-rate" if axis == "request_rate" else "--max-concurrency"
        return f"{line}; no level tried broke them (the search stops at {flag} {search['max']:g})"
    broke = [f"{k[:-4].upper()} p99 {ms(over[k])} ms" for k in ("itl_p99", "ttft_p99") if k in over["failed"]]
    if "errors" in over["failed"]:
        broke.append(f"{over['errors']} errors" if over["errors"] else "no request completed")
    return f"{line}; first over: {over[axis]:g} {unit} ({', '.join(broke)})"
