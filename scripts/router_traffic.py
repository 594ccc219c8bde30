#!/usr/bin/env python3
"""Two `pyserve serve` replicas behind sglang-router (PyPI `sglang-router`, the Rust router SGLang deployments
use), shared traffic through the router for N minutes: issue 11's acceptance scenario.

    python3 scripts/router_traffic.py                                  # 3 minutes, 4 requests in flight
    python3 scripts/router_traffic.py --minutes 1 --concurrency 2 --json out.json

(pyserve must import: installed, or a checkout built in place with PYTHONPATH=$PWD; sglang-router too:
`pip install 'pyserve[router]'`.) Everything listens on 127.0.0.1: the replicas on free ports (`--threads 1`
each), the router and its Prometheus exporter on two more. The router is `pyserve router` (its defaults:
pyserve/server/router_launch.py) with these flags (RouterProcess):

    pyserve router --port P --prometheus-port Q --worker-urls URL1 URL2 --policy round_robin
        --shutdown-grace-period-secs 5

Traffic: `--concurrency` workers loop until the deadline over a fixed set of requests (completions and chat,
streamed and not, temperature 0) naming the model the router's /v1/models lists (or --model). Every answer is
compared with the same request sent straight to a replica before the load: the text must be identical.

Printed at the end: requests sent, status counts, 5xx count, transport errors, wrong answers, replica exits
during the run (with the tail of a dead replica's stderr), requests each replica served (the first also took
the 12 reference requests), leaked KV blocks per replica (`pyserve:kv_blocks_used` once the load is over),
connections a replica ended on an error (`pyserve:connection_errors_total`) and each replica's exit code on
SIGTERM. Exit status 0 when all hold: only 200s, no transport error, no wrong answer, no replica down, 0 blocks,
0 connection errors, exit codes 0.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Optional

import httpx
import trio

from pyserve.bench.launch import PYSERVE_HOME, ServerProcess
from pyserve.bench.prometheus import parse_metrics, totals
from pyserve.server.replicas import free_ports
from pyserve.server.router_launch import ROUTER_MISSING, router_installed

PROMPTS = ["Once upon a time", "The capital of France is", "List three colours:", "def fibonacci(n):",
           "Explain gravity to a child.", "1, 2, 3, 4,"]
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # the router colours its log even into a pipe


VLLM_ROUTER_MISSING = "vllm-router is not installed: `pip install vllm-router==0.1.17` (tests/clients/test_router.py runs it)"
# the router programs: `pyserve router` (sglang-router with pyserve's settings) and vLLM's router as it comes
LAUNCHERS = {"pyserve": ["-m", "pyserve", "router"],
             "vllm": ["-m", "vllm_router.launch_router", "--host", "127.0.0.1", "--prometheus-host", "127.0.0.1"]}


class RouterProcess:
    """A router (`launcher`: "pyserve" or "vllm", see LAUNCHERS) on two free loopback ports (its HTTP server and
    its Prometheus exporter) over `worker_urls`, round robin unless `args` say otherwise (later flags win).
    `wait_ready` returns once it reports every worker healthy; `lines` keeps the last 4000 lines it logged."""

    def __init__(self, worker_urls: list[str], *args: str, policy: str = "round_robin", launcher: str = "pyserve"):
        self.port, self.metrics_port = free_ports(2)
        self.url = f"http://127.0.0.1:{self.port}"
        self.metrics_url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        self.cmd = [sys.executable, *LAUNCHERS[launcher], "--port", str(self.port),
                    "--prometheus-port", str(self.metrics_port), "--worker-urls", *worker_urls, "--policy", policy]
        if launcher == "pyserve":  # on SIGTERM it waits that long for in-flight requests (pyserve router: 35 s)
            self.cmd += ["--shutdown-grace-period-secs", "5"]
        self.cmd += args
        env = dict(os.environ, PYTHONPATH=PYSERVE_HOME + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     cwd=PYSERVE_HOME, env=env)
        self.lines: deque[str] = deque(maxlen=4000)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(_ANSI.sub("", line))

    def log_tail(self, n: int = 40) -> str:
        return "".join(list(self.lines)[-n:])

    def wait_ready(self, n_workers: int, timeout: float = 120.0) -> "RouterProcess":
        """Polls GET /readiness until it counts `n_workers` healthy workers; else stops it, RuntimeError."""
        deadline = time.monotonic() + timeout
        while True:
            if self.proc.poll() is not None:
                self._fail("it exited")
            try:
                r = httpx.get(self.url + "/readiness", timeout=5)
                if r.status_code == 200 and r.json().get("healthy_workers") == n_workers:
                    return self
            except (httpx.HTTPError, ValueError):
                pass
            if time.monotonic() > deadline:
                self._fail(f"not {n_workers} healthy workers within {timeout:g} s")
            time.sleep(0.1)

    def _fail(self, why: str) -> None:
        code = self.stop()
        raise RuntimeError(f"the router did not start ({why}; exit code {code}): {' '.join(self.cmd)}\n"
                           f"{self.log_tail()}")

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        self._reader.join(5)
        return code


class Deployment:
    """`replicas` pyserve replicas (`ServerProcess`, --threads 1 each, loading side by side) and a router in
    front of them, started in that order (so it registers them at once); `stop` ends the router, then sends
    each replica SIGTERM and returns their exit codes."""

    def __init__(self, replicas: int = 2, server_args: tuple = (), router_args: tuple = (),
                 policy: str = "round_robin", launcher: str = "pyserve"):
        self.n, self.server_args, self.router_args, self.policy = replicas, server_args, router_args, policy
        self.launcher = launcher
        self.replicas: list[ServerProcess] = []
        self.router: Optional[RouterProcess] = None

    def __enter__(self) -> "Deployment":
        try:
            self.replicas = [ServerProcess(*self.server_args, threads=1) for _ in range(self.n)]
            for r in self.replicas:
                r.wait_ready()
            self.router = RouterProcess([r.url for r in self.replicas], *self.router_args, policy=self.policy,
                                        launcher=self.launcher).wait_ready(self.n)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> list[int]:
        if self.router is not None:
            self.router.stop()
        return [r.stop() for r in self.replicas]

    def __exit__(self, *exc) -> None:
        self.stop()


# ---------------------------------------------------------------------------------------------------
# traffic
# ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Spec:
    route: str  # COMPLETIONS or CHAT
    prompt: str
    stream: bool


def specs() -> list[Spec]:
    return [Spec(route, p, stream) for p in PROMPTS for route in (COMPLETIONS, CHAT) for stream in (False, True)]


def request_body(spec: Spec, model: str, max_tokens: int) -> dict:
    body = {"model": model, "max_tokens": max_tokens, "temperature": 0, "stream": spec.stream}
    if spec.route == CHAT:
        body["messages"] = [{"role": "user", "content": spec.prompt}]
    else:
        body["prompt"] = spec.prompt
    return body


def _delta_text(route: str, choice: dict) -> str:
    return (choice.get("text") if route == COMPLETIONS else choice.get("delta", {}).get("content")) or ""


async def fetch(client: httpx.AsyncClient, url: str, spec: Spec, model: str,
                max_tokens: int) -> tuple[int, Optional[str]]:
    """(status, text): a 200's text (a stream's deltas joined; None for a stream that carried an error chunk or
    ended without [DONE]), or another status and its body."""
    body = request_body(spec, model, max_tokens)
    if not spec.stream:
        r = await client.post(url + spec.route, json=body)
        if r.status_code != 200:
            return r.status_code, r.text
        choice = r.json()["choices"][0]
        return 200, choice["text"] if spec.route == COMPLETIONS else choice["message"]["content"]
    async with client.stream("POST", url + spec.route, json=body) as r:
        if r.status_code != 200:
            return r.status_code, (await r.aread()).decode(errors="replace")
        parts = []
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                return 200, "".join(parts)
            event = json.loads(line[6:])
            if "error" in event:
                return 200, None
            parts.extend(_delta_text(spec.route, c) for c in event.get("choices", []))
        return 200, None


async def reference_texts(url: str, model: str, max_tokens: int) -> dict[Spec, str]:
    """Each spec's text from one replica directly, one request at a time (a stream's text is its non-streamed
    twin's)."""
    refs: dict[Spec, str] = {}
    async with httpx.AsyncClient(timeout=120) as client:
        for spec in specs():
            if not spec.stream:
                status, text = await fetch(client, url, spec, model, max_tokens)
                if status != 200:
                    raise RuntimeError(f"reference request {spec} answered {status}: {text}")
                refs[spec] = refs[Spec(spec.route, spec.prompt, True)] = text
    return refs


@dataclass
class Tally:
    sent: int = 0
    statuses: Counter = field(default_factory=Counter)
    errors: Counter = field(default_factory=Counter)  # transport failures (no HTTP status), by exception type
    wrong: list = field(default_factory=list)  # (spec, status, what came back) of 200s unlike the reference
    replica_exits: dict = field(default_factory=dict)  # replica index -> (replica_down's why, s into the load)

    @property
    def server_errors(self) -> int:
        return sum(n for s, n in self.statuses.items() if s >= 500)


def replica_down(r: ServerProcess) -> Optional[str]:
    """Why a replica no longer serves ('exit code N', 'not listening'), or None: its process runs and its port
    takes connections (a crash in Hypercorn's connection handling takes the listener down; the process may stay
    up a while after)."""
    code = r.proc.poll()
    if code is not None:
        return f"exit code {code}"
    try:
        socket.create_connection(("127.0.0.1", r.port), timeout=5).close()
    except OSError:
        return "not listening"
    return None


def note_exits(replicas: list[ServerProcess], tally: Tally, t0: float) -> None:
    for i, r in enumerate(replicas):
        why = None if i in tally.replica_exits else replica_down(r)
        if why:
            tally.replica_exits[i] = (why, round(time.monotonic() - t0, 1))


async def _watch(replicas: list[ServerProcess], tally: Tally, t0: float) -> None:
    while True:
        note_exits(replicas, tally, t0)
        await trio.sleep(0.2)


async def shared_traffic(router_url: str, model: str, refs: dict[Spec, str], replicas: list[ServerProcess], *,
                         concurrency: int, max_tokens: int, requests: Optional[int] = None,
                         seconds: Optional[float] = None) -> Tally:
    """`concurrency` workers send the specs in turn through the router until `requests` were sent or
    `seconds` passed (whichever is given; both: the first reached), while a watcher notes replica exits."""
    tally, order = Tally(), itertools.count()
    t0 = time.monotonic()
    all_specs = list(refs)

    async def worker(client: httpx.AsyncClient) -> None:
        while (requests is None or tally.sent < requests) and (seconds is None or time.monotonic() - t0 < seconds):
            spec = all_specs[next(order) % len(all_specs)]
            tally.sent += 1
            try:
                status, text = await fetch(client, router_url, spec, model, max_tokens)
            except httpx.HTTPError as e:
                tally.errors[type(e).__name__] += 1
                continue
            tally.statuses[status] += 1
            if status == 200 and text != refs[spec]:
                tally.wrong.append((spec, status, text))

    async with httpx.AsyncClient(timeout=120, limits=httpx.Limits(max_connections=concurrency)) as client:
        async with trio.open_nursery() as outer:
            outer.start_soon(_watch, replicas, tally, t0)
            async with trio.open_nursery() as load:
                for _ in range(concurrency):
                    load.start_soon(worker, client)
            outer.cancel_scope.cancel()
    note_exits(replicas, tally, t0)
    return tally


async def settle(url: str, timeout: float = 20.0) -> dict[str, float]:
    """A replica's `pyserve:` totals once its KV blocks and running requests are back to 0 (or at `timeout`)."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=10) as client:
        while True:
            m = totals(parse_metrics((await client.get(url + "/metrics")).text)[0], "pyserve:")
            if (m.get("kv_blocks_used", 1) == 0 and m.get("num_requests_running", 1) == 0) \
                    or time.monotonic() > deadline:
                return m
            await trio.sleep(0.1)


def router_models(router_url: str) -> list[str]:
    return [m["id"] for m in httpx.get(router_url + "/v1/models", timeout=10).json()["data"]]


# ---------------------------------------------------------------------------------------------------
# the script
# ---------------------------------------------------------------------------------------------------

def run(args) -> dict:
    with Deployment() as d:
        model = args.model or router_models(d.router.url)[0]
        up = [r for r in d.replicas if replica_down(r) is None]  # one may be down already (issue 11)
        tally = Tally()
        if up:
            refs = trio.run(reference_texts, up[0].url, up[0].model, args.max_tokens)
            tally = trio.run(lambda: shared_traffic(d.router.url, model, refs, d.replicas, max_tokens=args.max_tokens,
                                                    concurrency=args.concurrency, requests=args.max_requests,
                                                    seconds=args.minutes * 60))
        note_exits(d.replicas, tally, time.monotonic())
        after = [trio.run(settle, r.url) if i not in tally.replica_exits else None for i, r in enumerate(d.replicas)]
        exits = d.stop()
    return {"router_cmd": " ".join(d.router.cmd), "model": model, "sent": tally.sent,
            "statuses": {str(k): v for k, v in sorted(tally.statuses.items())}, "5xx": tally.server_errors,
            "transport_errors": dict(tally.errors), "wrong": len(tally.wrong),
            "wrong_examples": [[s.route, s.prompt, s.stream, status, text] for s, status, text in tally.wrong[:5]],
            "replica_exits_during_run": {str(i): v for i, v in tally.replica_exits.items()},
            "served": [m and m.get("request_success_total", 0) for m in after],
            "leaked_blocks": [m and m.get("kv_blocks_used") for m in after],
            "connection_errors": [m and m.get("connection_errors_total", 0) for m in after],
            "exit_codes_on_sigterm": exits,
            "dead_replica_stderr": {str(i): "".join(d.replicas[i].stderr)[-4000:] for i in tally.replica_exits},
            "router_log_tail": d.router.log_tail(20)}


def ok(report: dict) -> bool:
    return (report["5xx"] == 0 and not report["transport_errors"] and report["wrong"] == 0
            and not report["replica_exits_during_run"] and all(b == 0 for b in report["leaked_blocks"])
            and all(n == 0 for n in report["connection_errors"])
            and all(c == 0 for c in report["exit_codes_on_sigterm"]) and set(report["statuses"]) == {"200"})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=3.0, help="traffic duration (at most 60)")
    ap.add_argument("--concurrency", type=int, default=4, help="requests in flight (1-16)")
    ap.add_argument("--max-requests", type=int, default=100_000, help="stop after this many requests")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--model", help="the model name to send (default: the first the router's /v1/models lists)")
    ap.add_argument("--json", help="write the report here too")
    args = ap.parse_args()
    if not 0 < args.minutes <= 60 or not 1 <= args.concurrency <= 16 or args.max_requests < 1:
        ap.error("--minutes must be in (0, 60], --concurrency in [1, 16], --max-requests >= 1")
    if not router_installed():
        print(ROUTER_MISSING, file=sys.stderr)
        return 2
    report = run(args)
    report["ok"] = ok(report)
    for key in ("router_cmd", "model", "sent", "statuses", "5xx", "transport_errors", "wrong", "wrong_examples",
                "replica_exits_during_run", "served", "leaked_blocks", "connection_errors", "exit_codes_on_sigterm",
                "ok"):
        print(f"{key}: {report[key]}")
    for i, tail in report["dead_replica_stderr"].items():
        print(f"--- replica {i} exited; the end of its stderr:\n{tail}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
