"""Queue admission under overload: TTFT of accepted requests with and without --max-queue-wait.

Starts `pyserve serve` twice on loopback ports (once without admission control, once with
`--max-queue-wait BOUND`), warms each up, then offers an open-loop Poisson load above its capacity
(streamed /v1/completions, fixed max_tokens, ignore_eos) and prints, for each run, how many requests were
accepted and refused (429) and the TTFT percentiles of the accepted ones. With admission control the p99
TTFT should stay near the bound while the excess is refused at once; without it every request is accepted
and TTFT grows with the queue.

    PYTHONPATH=$PWD python3 scripts/bench_admission.py --rate 6 --duration 20 --max-tokens 32 \\
        --max-num-seqs 4 --bound 3
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import httpx
import trio

from pyserve.bench.launch import ServerProcess
from pyserve.bench.stats import summarize


async def one(http: httpx.AsyncClient, i: int, max_tokens: int, out: list) -> None:
    body = {"prompt": f"Request {i}: write the numbers from one upwards,", "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0, "stream": True}
    t0 = time.monotonic()
    ttft = None
    try:
        async with http.stream("POST", "/v1/completions", json=body) as r:
            if r.status_code != 200:
                await r.aread()
                out.append({"status": r.status_code, "latency": time.monotonic() - t0,
                            "retry_after": r.headers.get("retry-after")})
                return
            async for line in r.aiter_lines():
                if ttft is None and line.startswith("data: {"):
                    ttft = time.monotonic() - t0
            out.append({"status": 200, "ttft": ttft, "latency": time.monotonic() - t0})
    except httpx.HTTPError as e:
        out.append({"status": -1, "error": repr(e), "latency": time.monotonic() - t0})


async def load(url: str, rate: float, duration: float, max_tokens: int, seed: int) -> tuple[list, float]:
    rng = random.Random(seed)
    out: list = []
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=1000)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as http:
        # warm-up: a few requests in sequence, so the server has a measured finish rate
        for i in range(3):
            await one(http, -1 - i, max_tokens, [])
        t_start = time.monotonic()
        async with trio.open_nursery() as n:
            i = 0
            while time.monotonic() - t_start < duration:
                n.start_soon(one, http, i, max_tokens, out)
                i += 1
                await trio.sleep(rng.expovariate(rate))
        return out, time.monotonic() - t_start


def report(name: str, out: list, wall: float) -> dict:
    ok = [o for o in out if o["status"] == 200]
    refused = [o for o in out if o["status"] == 429]
    other = [o for o in out if o["status"] not in (200, 429)]
    ttft = summarize(o["ttft"] for o in ok if o["ttft"] is not None)
    refuse_p99 = summarize(o["latency"] for o in refused)["p99"]
    nan = float("nan")  # no such requests
    row = {"run": name, "offered": len(out), "accepted": len(ok), "refused_429": len(refused), "other": len(other),
           **{f"ttft_{k}": nan if ttft[k] is None else ttft[k] for k in ("p50", "p90", "p99", "max")},
           "refuse_latency_p99": nan if refuse_p99 is None else refuse_p99, "goodput_rps": len(ok) / wall}
    print(f"{name:>22}: offered {row['offered']:4d}  accepted {row['accepted']:4d}  refused(429) "
          f"{row['refused_429']:4d}  other {row['other']}  | TTFT p50 {row['ttft_p50']:6.2f}s  p90 "
          f"{row['ttft_p90']:6.2f}s  p99 {row['ttft_p99']:6.2f}s  max {row['ttft_max']:6.2f}s  | 429 answered in "
          f"p99 {row['refuse_latency_p99'] * 1000:5.1f} ms  | goodput {row['goodput_rps']:.2f} req/s", flush=True)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=6.0, help="offered requests per second")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds of offered load")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-num-seqs", type=int, default=4)
    ap.add_argument("--bound", type=float, default=3.0, help="--max-queue-wait for the admission run")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--only", choices=["off", "on"], default=None)
    ap.add_argument("--json", default=None, help="write the figures here")
    args = ap.parse_args()
    base = ["--max-num-seqs", str(args.max_num_seqs), "--ctx-size", "512"]
    runs = [("admission off", base), (f"max-queue-wait {args.bound:g}s", base + ["--max-queue-wait", str(args.bound)])]
    if args.only:
        runs = [runs[0 if args.only == "off" else 1]]
    print(f"offered load: Poisson {args.rate:g} req/s for {args.duration:g} s, max_tokens {args.max_tokens}, "
          f"max_num_seqs {args.max_num_seqs}, {args.threads} threads", flush=True)
    rows = []
    for name, extra in runs:
        with ServerProcess(*extra, threads=args.threads) as srv:
            out, wall = trio.run(load, srv.url, args.rate, args.duration, args.max_tokens, args.seed)
            rows.append(report(name, out, wall))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
