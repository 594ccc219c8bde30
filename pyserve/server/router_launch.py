"""`pyserve router`: sglang-router (PyPI `sglang-router`, the Rust router SGLang deployments use) in front of
pyserve replicas, with settings chosen for them. pyserve builds no router of its own: it is a worker for
theirs (routes/worker.py) and this is the glue that makes the pair one command.

    pyserve router --worker-urls http://10.0.0.1:8000 http://10.0.0.2:8000 [--port 30000] [ROUTER FLAGS...]

is `python -m sglang_router.launch_router` with DEFAULTS, then every flag given here: a flag repeated later
wins, so any default can be overridden and any other sglang-router flag passed (`--print-command` shows the
command line instead of running it). Why each default (what sglang-router 0.3.2 does with it, as read in its
source and seen in tests/clients/test_router*.py):
- cache_aware: requests go to the replica whose prefix cache most likely holds their prefix (the router keeps a
  radix tree of the text it sent each worker), unless that replica is busier than the other by more than
  --balance-abs-threshold in-flight requests and by the factor --balance-rel-threshold. 8 (its default: 64):
  a CPU replica's batch slows every stream in it, so an imbalance of 8 costs more than a prefix-cache miss.
  --cache-threshold 0.5: a shared ~400-token system prompt matches ~95 % of a request's text, another
  prompt's opening words a few % (docs/DEPLOYMENT.md); a cache miss goes to the least loaded replica;
- health checks every 2 s, out after 2 failures, in after 1 success: a replica that stops (SIGTERM: /health
  503 at once, routes/worker.py) leaves the rotation 2-6 s later, far inside pyserve's 30 s drain, and one that
  comes back is taken in at its first 200;
- retries (5, 50 ms backoff doubling to 2 s) on a refused connection or a 408/429/5xx *before* any byte was
  forwarded: a request the router could not start on one replica starts on another. A stream that already
  started is never replayed: when its replica dies the router ends the client's response at once, without
  the last chunk (tests/clients/test_router_failover.py);
- circuit breaker: 3 failures in a row take a replica out for 10 s (then one success brings it back), so the
  retries of a request move on to the other replica instead of spending every attempt on a dead one;
- Prometheus on 127.0.0.1:29000 (loopback: its metrics name every worker URL), the router on 127.0.0.1
  (pyserve's default: pass --host 0.0.0.0 to serve other machines);
- 600 s request timeout (a long stream on a CPU replica), 35 s grace on SIGTERM (pyserve's drain is 30 s).
"""
from __future__ import annotations

import importlib.util
import os
import sys
from typing import Sequence

ROUTER_MISSING = ("sglang-router is not installed: `pip install 'pyserve[router]'` (or sglang-router==0.3.2); "
                  "`pyserve router`, `pyserve serve --replicas`, tests/clients/test_router*.py and the router scripts run it")
DEFAULTS = ("--host", "127.0.0.1", "--port", "30000", "--policy", "cache_aware", "--cache-threshold", "0.5",
            "--balance-abs-threshold", "8", "--balance-rel-threshold", "1.5",
            "--health-check-interval-secs", "2", "--health-failure-threshold", "2",
            "--health-success-threshold", "1", "--health-check-timeout-secs", "5",
            "--retry-max-retries", "5", "--retry-initial-backoff-ms", "50", "--retry-max-backoff-ms", "2000",
            "--retry-backoff-multiplier", "2", "--cb-failure-threshold", "3", "--cb-success-threshold", "1",
            "--cb-timeout-duration-secs", "10", "--prometheus-host", "127.0.0.1", "--prometheus-port", "29000",
            "--worker-startup-timeout-secs", "600", "--worker-startup-check-interval", "1",
            "--request-timeout-secs", "600", "--shutdown-grace-period-secs", "35")


def router_installed() -> bool:
    return importlib.util.find_spec("sglang_router") is not None


def router_command(args: Sequence[str]) -> list[str]:
    """The router's command line: pyserve's defaults, then `args` (later flags win)."""
    return [sys.executable, "-m", "sglang_router.launch_router", *DEFAULTS, *args]


def add_router_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "router", help="sglang-router in front of pyserve replicas, with settings chosen for them",
        description="python -m sglang_router.launch_router with pyserve's defaults, then every flag given here "
                    "(a flag given here overrides its default): e.g. pyserve router --worker-urls URL1 URL2",
        epilog="defaults: " + " ".join(DEFAULTS) + "; every other flag: python -m sglang_router.launch_router --help")
    p.add_argument("--print-command", action="store_true", help="print the router's command line and exit")
    p.set_defaults(func=run_router, forward_unknown=True)


def run_router(args) -> int:
    """Replaces this process with the router (signals and the exit code are the router's own)."""
    cmd = router_command(args.extra)
    if args.print_command:
        print(" ".join(cmd))
        return 0
    if not router_installed():
        print(f"pyserve: error: {ROUTER_MISSING}", file=sys.stderr)
        return 2
    sys.stdout.flush()
    os.execv(sys.executable, cmd)
    return 0  # not reached
