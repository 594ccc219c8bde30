"""Speculative decoding by prompt lookup (n-gram drafting): decode speed with it on vs off, in the same run.

    python scripts/bench_spec.py [--max-tokens 256] [--rounds 2] [--threads 2] [--only grounded|free|concurrent]
                                 [--streams 4,16] [--on-args "--speculative-ngram 7"]
                                 [--off-args "--speculative-ngram 0"] [--json F]
    python scripts/bench_spec.py --on-args "" --off-args "" --max-tokens 48 --rounds 1   # both the same: ratio ~1

Starts two `pyserve serve` on free loopback ports, one with --on-args and one with --off-args, and never sends to
both at once: each request (or batch of streams) runs against one, then the other, the order alternating so that
the machine's drift hits both. (1) grounded: the prompts of spec_prompts.GROUNDED (a base model copying from its
input), one stream, greedy: decode tok/s per prompt and overall, (completion tokens - 1) / (last text chunk -
first), client side; the texts must be identical on vs off, else a FAIL line and exit status 1. Each prompt's
copy ratio (the output's tokens that occur in the prompt, and those whose 3-gram occurred earlier in prompt +
output) is printed beside it. (2) free: story openings (spec_prompts.FREE) at temperature 0.8 with a fixed seed
per request, ignore_eos, one stream: tok/s on vs off (target >= 0.97) and whether the texts are identical.
(3) concurrent: 16 streams (--streams) at once (a thread pool, one request each) of each workload: aggregate
completion tok/s (all completion tokens / wall time). The acceptance rate is accepted / drafted tokens over each
phase, from the ON server's /metrics counters when it exports them. Bounded: a fixed count of requests, each stream cut
off after LIMIT_S s; loopback only.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, closing
from dataclasses import dataclass
from typing import Callable, Optional

import httpx
from bench_embeddings import sse_chunks  # scripts/ is on the path when a script there runs
from spec_prompts import FREE, GROUNDED

from pyserve.bench.client import chunk_text
from pyserve.bench.launch import ServerProcess
from pyserve.bench.prometheus import parse_metrics, total

DRAFT = "pyserve:spec_decode_num_draft_tokens_total"
ACCEPTED = "pyserve:spec_decode_num_accepted_tokens_total"
LIMIT_S = 300.0  # one stream's wall-clock limit


@dataclass
class Run:
    text: str
    tokens: int  # completion tokens, as usage reports them
    first: float  # perf_counter s of the first chunk with text
    end: float  # perf_counter s of the last chunk with text


def stream(url: str, body: dict) -> Run:
    """One streamed completion, timed on the client; TimeoutError past LIMIT_S."""
    deadline = time.perf_counter() + LIMIT_S
    parts, times, tokens = [], [], 0
    with closing(sse_chunks(url, {**body, "stream_options": {"include_usage": True}})) as chunks:
        for now, chunk in chunks:
            if now > deadline:
                raise TimeoutError(f"a stream ran past {LIMIT_S:g} s")
            if text := chunk_text(chunk):
                parts.append(text)
                times.append(now)
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    if not times:
        raise RuntimeError(f"a stream produced no text: {body['prompt'][:60]!r}")
    return Run("".join(parts), tokens, times[0], times[-1])


def decode_rate(runs: list[Run]) -> float:
    """Tokens after the first per second of streaming, over all the runs."""
    return sum(r.tokens - 1 for r in runs) / max(sum(r.end - r.first for r in runs), 1e-9)


def grounded_bodies(max_tokens: int) -> list[dict]:
    return [{"prompt": p, "max_tokens": max_tokens, "temperature": 0} for _, p in GROUNDED]


def free_bodies(max_tokens: int, n: int) -> list[dict]:
    return [{"prompt": FREE[i % len(FREE)], "max_tokens": max_tokens, "temperature": 0.8, "seed": 1000 + i,
             "ignore_eos": True} for i in range(n)]


def spec_counters(url: str) -> Optional[tuple[float, float]]:
    """(drafted, accepted) tokens so far, or None when /metrics has no such counters."""
    samples, _ = parse_metrics(httpx.get(url + "/metrics", timeout=10).text)
    names = {name for name, _ in samples}
    if DRAFT not in names or ACCEPTED not in names:
        return None
    return total(samples, DRAFT), total(samples, ACCEPTED)


def with_acceptance(on_url: str, phase: Callable[[], dict]) -> dict:
    """Runs `phase` and adds the ON server's acceptance over it (accepted / drafted, None without counters)."""
    before = spec_counters(on_url)
    out = phase()
    after = spec_counters(on_url)
    drafted = after[0] - before[0] if before and after else 0
    out["acceptance"] = (after[1] - before[1]) / drafted if drafted else None
    out["drafted"] = drafted
    return out


def single(servers: dict[str, ServerProcess], bodies: list[dict], rounds: int) -> dict[str, list[list[Run]]]:
    """Each body streamed alone on each server, `rounds` times; which server goes first alternates body by body
    and round by round. {"off" | "on": [[the runs of body 0], ...]}."""
    runs = {side: [[] for _ in bodies] for side in servers}
    for r in range(rounds):
        for i, body in enumerate(bodies):
            for side in (("off", "on") if (i + r) % 2 == 0 else ("on", "off")):
                runs[side][i].append(stream(servers[side].url, body))
    return runs


def identical(runs: dict[str, list[list[Run]]]) -> list[bool]:
    """Per body: every round's text is the same on as off."""
    return [all(a.text == b.text for a, b in zip(off, on)) for off, on in zip(runs["off"], runs["on"])]


def single_row(workload: str, runs: dict[str, list[list[Run]]]) -> dict:
    off, on = (decode_rate([r for per_body in runs[side] for r in per_body]) for side in ("off", "on"))
    return {"workload": workload, "streams": 1, "off": off, "on": on, "ratio": on / off,
            "identical": all(identical(runs))}


def tokenize(url: str, text: str, special: bool) -> list[int]:
    r = httpx.post(url + "/tokenize", json={"prompt": text, "add_special_tokens": special}, timeout=30)
    r.raise_for_status()
    return r.json()["tokens"]


def copy_ratios(url: str, prompt: str, text: str) -> tuple[float, float]:
    """(the output's tokens that occur in the prompt, those whose 3-gram occurred earlier in prompt + output), as
    fractions of the output's tokens, both texts tokenized by the server."""
    p, o = tokenize(url, prompt, True), tokenize(url, text, False)
    seen, ctx = {tuple(p[i:i + 3]) for i in range(len(p) - 2)}, p[-2:]
    hits = 0
    for t in o:
        ctx = ctx[-2:] + [t]
        hits += tuple(ctx) in seen
        seen.add(tuple(ctx))
    in_prompt = set(p)
    return sum(t in in_prompt for t in o) / max(len(o), 1), hits / max(len(o), 1)


def grounded_phase(servers: dict[str, ServerProcess], a: argparse.Namespace) -> dict:
    bodies = grounded_bodies(a.max_tokens)
    runs = single(servers, bodies, a.rounds)
    same = identical(runs)
    prompts = []
    for i, (name, prompt) in enumerate(GROUNDED):
        off, on = decode_rate(runs["off"][i]), decode_rate(runs["on"][i])
        copy, gram3 = copy_ratios(servers["off"].url, prompt, runs["off"][i][0].text)
        prompts.append({"prompt": name, "tokens": runs["off"][i][0].tokens, "copy": copy, "copy_3gram": gram3,
                        "off": off, "on": on, "ratio": on / off, "identical": same[i]})
    return {**single_row("grounded", runs), "prompts": prompts}


def free_phase(servers: dict[str, ServerProcess], a: argparse.Namespace) -> dict:
    return single_row("free", single(servers, free_bodies(a.max_tokens, len(FREE)), a.rounds))


def batch(url: str, bodies: list[dict]) -> tuple[list[Run], float]:
    """All the bodies streamed at once: the runs and the aggregate completion tok/s (tokens / wall s)."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(bodies)) as pool:
        runs = list(pool.map(lambda b: stream(url, b), bodies))
    return runs, sum(r.tokens for r in runs) / (time.perf_counter() - t0)


def concurrent_row(workload: str, servers: dict[str, ServerProcess], bodies: list[dict], rounds: int) -> dict:
    rates, texts = {"off": [], "on": []}, {"off": [], "on": []}
    for r in range(rounds):
        for side in (("off", "on") if r % 2 == 0 else ("on", "off")):
            runs, rate = batch(servers[side].url, bodies)
            rates[side].append(rate)
            texts[side] += [run.text for run in runs]
    off, on = (sum(rates[side]) / rounds for side in ("off", "on"))
    return {"workload": workload, "streams": len(bodies), "off": off, "on": on, "ratio": on / off,
            "identical": texts["off"] == texts["on"]}


def concurrent_phases(servers: dict[str, ServerProcess], a: argparse.Namespace) -> list[Callable[[], dict]]:
    grounded = grounded_bodies(a.max_tokens)
    out = []
    for n in a.streams:  # n=n: each phase its own count
        out += [lambda n=n: concurrent_row("grounded", servers, [grounded[i % len(grounded)] for i in range(n)],
                                           a.rounds),
                lambda n=n: concurrent_row("free", servers, free_bodies(a.max_tokens, n), a.rounds)]
    return out


def phases(servers: dict[str, ServerProcess], a: argparse.Namespace) -> list[Callable[[], dict]]:
    chosen = {"grounded": [lambda: grounded_phase(servers, a)], "free": [lambda: free_phase(servers, a)],
              "concurrent": concurrent_phases(servers, a)}
    return [p for name, ps in chosen.items() if a.only in (None, name) for p in ps]


def print_prompts(prompts: list[dict]) -> None:
    print(f"{'grounded prompt':16} {'tokens':>6} {'copy':>5} {'3-gram':>6} {'tok/s off':>9} {'tok/s on':>9} "
          f"{'ratio':>6}  identical")
    for p in prompts:
        print(f"{p['prompt']:16} {p['tokens']:6d} {p['copy']:5.2f} {p['copy_3gram']:6.2f} {p['off']:9.1f} "
              f"{p['on']:9.1f} {p['ratio']:6.3f}  {'yes' if p['identical'] else 'NO'}")
    print()


def print_table(rows: list[dict]) -> None:
    print(f"{'workload':10} {'streams':>7} {'tok/s off':>9} {'tok/s on':>9} {'ratio':>6}  {'identical':9}  accept")
    for r in rows:
        accept = "-" if r["acceptance"] is None else f"{r['acceptance']:.2f}"
        print(f"{r['workload']:10} {r['streams']:7d} {r['off']:9.1f} {r['on']:9.1f} {r['ratio']:6.3f}  "
              f"{'yes' if r['identical'] else 'NO':9}  {accept}")


def verdict(rows: list[dict]) -> int:
    """Prints the checks' lines; 1 when the grounded single-stream texts differ on vs off."""
    code = 0
    for r in rows:
        if r["workload"] == "grounded" and r["streams"] == 1 and not r["identical"]:
            bad = [p["prompt"] for p in r["prompts"] if not p["identical"]]
            print(f"FAIL: greedy outputs differ with speculation on vs off: {', '.join(bad)}")
            code = 1
        if r["workload"] == "free" and r["streams"] == 1:
            print(f"free writing, one stream: on/off {r['ratio']:.3f} (target >= 0.97: "
                  f"{'met' if r['ratio'] >= 0.97 else 'MISSED'})")
    return code


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--on-args", default="--speculative-ngram 7", help="the ON server's extra arguments")
    ap.add_argument("--off-args", default="--speculative-ngram 0", help="the OFF server's extra arguments")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=2, help="times each request (or batch of streams) runs per side")
    ap.add_argument("--threads", type=int, default=2, help="each server's engine threads")
    ap.add_argument("--streams", type=lambda t: [int(x) for x in t.split(",")], default=[16],
                    help="the concurrent phase's stream counts, comma-separated (default 16)")
    ap.add_argument("--only", choices=("grounded", "free", "concurrent"), default=None)
    ap.add_argument("--json", default=None, metavar="F", help="write the figures to F")
    return ap.parse_args()


def main() -> int:
    a = parse_args()
    with ExitStack() as stack:
        servers = {side: stack.enter_context(ServerProcess(*shlex.split(args), threads=a.threads))
                   for side, args in (("off", a.off_args), ("on", a.on_args))}
        for srv in servers.values():  # warm-up
            stream(srv.url, {"prompt": "Hello", "max_tokens": 8, "temperature": 0})
        rows = [with_acceptance(servers["on"].url, phase) for phase in phases(servers, a)]
    for r in rows:
        if "prompts" in r:
            print_prompts(r["prompts"])
    print_table(rows)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "rows": rows}, f, indent=1)
    return verdict(rows)


if __name__ == "__main__":
    sys.exit(main())
