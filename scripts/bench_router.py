#!/usr/bin/env python3
"""What a prefix-aware router buys pyserve replicas, and what the router costs (issue 17; outside CI).

    python3 scripts/bench_router.py                               # 8 system prompts x 6 questions, 2 in flight
    python3 scripts/bench_router.py --questions 3 --json out.json  # smaller

(pyserve must import: installed, or a checkout built in place with PYTHONPATH=$PWD; sglang-router too.)

Policies: for each of round_robin, cache_aware (pyserve router's defaults) and consistent_hashing (the client
names its system prompt in `X-SMG-Routing-Key`; sglang-router 0.3.2 has the policy but its command line does
not offer it, so it is started through its Python API), a fresh deployment of two replicas (--threads 1 each,
--num-kv-blocks sized so each holds about half of the shared prefixes) behind a fresh router. Traffic: every
system prompt (~400 tokens, random words) with every question, shuffled (seeded), `--concurrency` streamed
completions in flight, temperature 0, 8 tokens each. Measured: the replicas' prefix-cache hit rate (Δhits /
Δqueries of `pyserve:prefix_cache_hits` / `pyserve:prefix_cache_queries` in their /metrics, over both) and
the client's TTFT p50 / p99 through the router.

Router overhead: with the last policy's deployment, one stream at a time (a short prompt, 64 tokens), alternating
straight to a replica and through the router: TTFT and ITL (gaps between content chunks) p50 / p99 of each.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import router_traffic as rt  # noqa: E402

from pyserve.bench.prometheus import parse_metrics, totals  # noqa: E402
from pyserve.bench.prompts import WORDS  # noqa: E402
from pyserve.bench.stats import summarize  # noqa: E402

ROUTING_KEY = "X-SMG-Routing-Key"
CH_LAUNCH = ("import sys; from sglang_router.launch_router import launch_router, parse_router_args; "
             "from pyserve.server.router_launch import DEFAULTS; "
             "a = parse_router_args([*DEFAULTS, *sys.argv[1:]]); a.policy = 'consistent_hashing'; launch_router(a)")
rt.LAUNCHERS["consistent_hashing"] = ["-c", CH_LAUNCH]
QUESTIONS = ["What is the main subject of the text above?", "Summarise the text above in one sentence.",
             "Which word appears most often above?", "Is the text above about people or places?",
             "Give the text above a title.", "What comes next after the text above?", "Who wrote the text above?",
             "List three words from the text above."]


def system_prompts(n: int, tokens: int, url: str) -> list[str]:
    """n texts of random words, each about `tokens` long in the server's tokens (counted with /tokenize)."""
    out = []
    for i in range(n):
        rng = random.Random(i)
        words = int(tokens / 1.3)
        for _ in range(3):  # scale the word count to the measured length
            text = f"Document {i}. " + " ".join(rng.choice(WORDS) for _ in range(words))
            count = httpx.post(url + "/tokenize", json={"prompt": text}).json()["count"]
            words = max(1, round(words * tokens / count))
        out.append(text)
    return out


def requests_for(systems: list[str], n_questions: int, seed: int) -> list[tuple[int, str]]:
    reqs = [(i, f"{s}\n\nQuestion: {q}\nAnswer:") for i, s in enumerate(systems) for q in QUESTIONS[:n_questions]]
    random.Random(seed).shuffle(reqs)
    return reqs


async def stream_ttft(client: httpx.AsyncClient, url: str, model: str, prompt: str, max_tokens: int,
                      headers: dict) -> tuple[float, list[float]]:
    """(TTFT, the gaps between content chunks) of one streamed completion, in seconds."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}
    t0 = time.perf_counter()
    stamps = []
    async with client.stream("POST", url + "/v1/completions", json=body, headers=headers) as r:
        assert r.status_code == 200, (r.status_code, await r.aread())
        async for line in r.aiter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                stamps.append(time.perf_counter())
    return stamps[0] - t0, [b - a for a, b in zip(stamps, stamps[1:])]


async def run_traffic(router_url: str, model: str, reqs: list, concurrency: int, keyed: bool) -> list[float]:
    ttfts, queue = [], list(reqs)

    async def worker(client: httpx.AsyncClient) -> None:
        while queue:
            system, prompt = queue.pop(0)
            headers = {ROUTING_KEY: f"system-{system}"} if keyed else {}
            ttfts.append((await stream_ttft(client, router_url, model, prompt, 8, headers))[0])

    async with httpx.AsyncClient(timeout=300) as client:
        async with trio.open_nursery() as n:
            for _ in range(concurrency):
                n.start_soon(worker, client)
    return ttfts


def cache_counters(replicas) -> tuple[float, float]:
    hits = queries = 0.0
    for r in replicas:
        m = totals(parse_metrics(httpx.get(r.url + "/metrics").text)[0], "pyserve:")
        hits, queries = hits + m.get("prefix_cache_hits_total", 0), queries + m.get("prefix_cache_queries_total", 0)
    return hits, queries


def served(replicas) -> list[int]:
    return [int(trio.run(rt.settle, r.url).get("request_success_total", 0)) for r in replicas]


def summary(values: list[float]) -> dict:
    s = summarize(values)
    return {"p50_ms": round(1000 * s["p50"], 1), "p99_ms": round(1000 * s["p99"], 1), "n": len(values)}


def one_policy(policy: str, args, systems: list[str], overhead_streams: int = 0) -> dict:
    """The traffic through a fresh deployment under `policy`; then, if asked, the router's overhead."""
    launcher = "consistent_hashing" if policy == "consistent_hashing" else "pyserve"
    with rt.Deployment(server_args=("--num-kv-blocks", str(args.kv_blocks)),
                       policy=policy if launcher == "pyserve" else "round_robin", launcher=launcher) as d:
        h0, q0 = cache_counters(d.replicas)
        s0 = served(d.replicas)
        reqs = requests_for(systems, args.questions, args.seed)
        t0 = time.monotonic()
        ttfts = trio.run(run_traffic, d.router.url, d.replicas[0].model, reqs, args.concurrency,
                         policy == "consistent_hashing")
        h1, q1 = cache_counters(d.replicas)
        result = {"policy": policy, "requests": len(reqs), "seconds": round(time.monotonic() - t0, 1),
                  "hit_rate": round((h1 - h0) / (q1 - q0), 3) if q1 > q0 else None,
                  "served": [b - a for a, b in zip(s0, served(d.replicas))], "ttft": summary(ttfts)}
        print(json.dumps(result), flush=True)
        if overhead_streams:
            result["router_overhead"] = trio.run(overhead, d, overhead_streams)
            print(json.dumps({"router_overhead": result["router_overhead"]}), flush=True)
    return result


async def overhead(d: "rt.Deployment", n: int) -> dict:
    """One stream at a time, alternating straight to replica 0 and through the router."""
    out = {"direct": ([], []), "router": ([], [])}
    async with httpx.AsyncClient(timeout=120) as client:
        for i in range(2 * n):
            where, url = ("direct", d.replicas[0].url) if i % 2 == 0 else ("router", d.router.url)
            ttft, gaps = await stream_ttft(client, url, d.replicas[0].model, f"Request {i}: tell me about the sea.",
                                           64, {})
            out[where][0].append(ttft)
            out[where][1].extend(gaps)
    return {k: {"ttft": summary(t), "itl": summary(g)} for k, (t, g) in out.items()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--systems", type=int, default=8, help="system prompts")
    ap.add_argument("--questions", type=int, default=6, help="questions per system prompt (at most 8)")
    ap.add_argument("--system-tokens", type=int, default=400)
    ap.add_argument("--concurrency", type=int, default=2)
    ap.add_argument("--kv-blocks", type=int, default=112,
                    help="KV blocks (16 tokens) per replica: 112 hold ~4 of the 8 prefixes beside 2 running")
    ap.add_argument("--policies", default="round_robin,cache_aware,consistent_hashing")
    ap.add_argument("--overhead-streams", type=int, default=10, help="streams each way for the router overhead")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    if not rt.router_installed():
        print(rt.ROUTER_MISSING, file=sys.stderr)
        return 2
    with rt.ServerProcess(threads=1) as probe:  # the prompts' lengths, in the replicas' tokens
        systems = system_prompts(args.systems, args.system_tokens, probe.url)
    policies = args.policies.split(",")
    results = [one_policy(p, args, systems, args.overhead_streams if p == policies[-1] else 0) for p in policies]
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "policies": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
