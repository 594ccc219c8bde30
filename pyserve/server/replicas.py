"""`pyserve serve --replicas N`: N replicas of `pyserve serve` on one machine behind sglang-router (with
`pyserve router`'s settings, router_launch.py), one command for a box with many cores.

The cores this process may run on (its affinity) are split into N contiguous shares; replica i is pinned to
share i (`os.sched_setaffinity` in the child before it starts) and runs one engine thread per core of its
share (or --threads, if given). Replicas listen on free loopback ports (the router is the way in); the router
takes --host / --port (default 127.0.0.1:8000, like `pyserve serve`). Every other `serve` flag goes to each
replica (so --kv-cache-memory is per replica); the first API key also goes to the router, which then asks
clients for it and sends it to the replicas. --router-args "..." adds router flags.

A replica that exits while the rest run is started again on its port and cores (the router takes it back at
its first healthy check). SIGINT / SIGTERM: the router stops first (it lets in-flight requests finish), then
every replica drains; exit code 0 when all of them exit 0.
"""
from __future__ import annotations

import argparse
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from functools import partial

from .auth import load_keys
from .router_launch import ROUTER_MISSING, router_command, router_installed

log = logging.getLogger("pyserve.replicas")
READY_TIMEOUT = 600.0  # seconds for every replica to load its model


def add_replica_args(srv: argparse.ArgumentParser) -> None:
    srv.add_argument("--replicas", type=int, default=1,
                     help="N > 1: N replicas, each pinned to its share of the cores, behind sglang-router "
                          "on --host/--port (see `pyserve router`)")
    srv.add_argument("--router-args", default="", metavar="ARGS",
                     help="with --replicas: more sglang-router flags, one shell-quoted string")


def core_shares(cores: list[int], n: int) -> list[list[int]]:
    """`cores` split into n contiguous shares whose sizes differ by at most one."""
    if not 1 <= n <= len(cores):
        raise ValueError(f"--replicas {n}: this process may run on {len(cores)} core(s)")
    q, r = divmod(len(cores), n)
    bounds = [i * q + min(i, r) for i in range(n + 1)]
    return [cores[bounds[i]:bounds[i + 1]] for i in range(n)]


def free_ports(n: int) -> list[int]:
    """n distinct free loopback ports (held together while chosen, so never the same one twice)."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _own_options(serve_argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The options --replicas handles itself, and the rest of `serve`'s flags (for every replica)."""
    own = argparse.ArgumentParser(add_help=False)
    for flag in ("--replicas", "--host", "--port", "--threads", "--router-args"):
        own.add_argument(flag)
    return own.parse_known_args(serve_argv)


def _local(host: str) -> str:
    """An address of this machine that reaches a server bound to `host`."""
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else f"[{host}]" if ":" in host else host


class Replica:
    """One `pyserve serve` child on a loopback port, pinned to `cores`."""

    def __init__(self, argv: list[str], port: int, cores: list[int], threads: int):
        self.port, self.cores = port, cores
        self.url = f"http://127.0.0.1:{port}"
        self.cmd = [sys.executable, "-m", "pyserve", "serve", *argv, "--host", "127.0.0.1", "--port", str(port),
                    "--threads", str(threads)]
        self.proc = self.start()

    def start(self) -> subprocess.Popen:
        # stdout to our stderr: the one ready line on stdout is the router's (run_replicas)
        self.proc = subprocess.Popen(self.cmd, stdout=sys.stderr,
                                     preexec_fn=partial(os.sched_setaffinity, 0, self.cores))
        return self.proc

    def healthy(self) -> bool:
        import httpx  # here: `pyserve serve` without --replicas does not pay for its import

        try:
            return httpx.get(self.url + "/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False


class Supervisor:
    """The replicas (started here, once every setting is known good) and the router (`start_router`)."""

    def __init__(self, args: argparse.Namespace, serve_argv: list[str]):
        if not args.port:
            raise ValueError("--replicas needs a fixed --port (the router's)")
        own, rest = _own_options(serve_argv)
        shares = core_shares(sorted(os.sched_getaffinity(0)), int(own.replicas))
        keys = load_keys(args.api_key or [], args.api_key_file)
        self.auth = {"Authorization": f"Bearer {keys[0]}"} if keys else {}
        self.host, self.port, self.model = args.host, args.port, ""
        self.replicas = [Replica(rest, port, cores, args.n_threads or len(cores))
                         for port, cores in zip(free_ports(len(shares)), shares)]
        self.router_args = ["--host", args.host, "--port", str(args.port), "--log-level", "warn",
                            *(["--api-key", keys[0]] if keys else []),
                            "--worker-urls", *[r.url for r in self.replicas], *shlex.split(args.router_args)]
        self.router = None
        self.stopping = threading.Event()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        pending = list(self.replicas)
        while pending:
            for r in [r for r in pending if r.proc.poll() is not None]:
                raise RuntimeError(f"replica on port {r.port} exited with code {r.proc.returncode} before it was ready")
            pending = [r for r in pending if not r.healthy()]
            if time.monotonic() > deadline:
                raise RuntimeError(f"replicas not ready within {READY_TIMEOUT:g} s: {[r.url for r in pending]}")
            self.stopping.wait(0.2)
            if self.stopping.is_set():
                raise KeyboardInterrupt

    def start_router(self) -> None:
        """Starts the router and waits until it counts every replica healthy; the served model's name."""
        self.router = subprocess.Popen(router_command(self.router_args), stdout=sys.stderr)  # it logs to stdout
        url = f"http://{_local(self.host)}:{self.port}"
        deadline = time.monotonic() + 60
        while not self._router_ready(url):
            if self.router.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the router did not take the replicas in (exit code {self.router.poll()})")
            self.stopping.wait(0.2)
            if self.stopping.is_set():
                raise KeyboardInterrupt
        import httpx

        self.model = httpx.get(self.replicas[0].url + "/server_info", headers=self.auth, timeout=10).json()["model"]

    def _router_ready(self, url: str) -> bool:
        import httpx

        try:
            r = httpx.get(url + "/readiness", headers=self.auth, timeout=5)
            return r.status_code == 200 and r.json().get("healthy_workers") == len(self.replicas)
        except (httpx.HTTPError, ValueError):
            return False

    def watch(self) -> int:
        """Restarts replicas that exit until a signal (then 0), or the router's exit code if it ends first."""
        while not self.stopping.wait(0.5):
            if self.router.poll() is not None:
                log.error("the router exited with code %s", self.router.returncode)
                return self.router.returncode or 1
            for r in self.replicas:
                if r.proc.poll() is not None:
                    log.warning("replica on port %d exited with code %s: starting it again", r.port, r.proc.returncode)
                    r.start()
        return 0

    def stop(self) -> int:
        """The router first (it lets its in-flight requests finish), then every replica drains at once."""
        codes = _terminate([self.router] if self.router else [], 60)
        codes += _terminate([r.proc for r in self.replicas], 60)
        return 0 if all(c == 0 for c in codes) else 1


def _terminate(procs: list, timeout: float) -> list[int]:
    """SIGTERM to each, then their exit codes (killed after `timeout` s)."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return [p.returncode for p in procs]


def run_replicas(args: argparse.Namespace) -> int:
    """`pyserve serve --replicas N`."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # its health polls
    if not router_installed():
        print(f"pyserve: error: {ROUTER_MISSING}", file=sys.stderr)
        return 2
    serve_argv = args.argv[args.argv.index("serve") + 1:]
    sup = Supervisor(args, serve_argv)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: sup.stopping.set())
    try:
        sup.wait_ready()
        sup.start_router()
        # the line `pyserve serve` prints once ready (bench/launch.py waits for it), naming the router's URL
        print(f"pyserve: serving {sup.model} on http://{args.host}:{args.port} (sglang-router over "
              f"{', '.join(r.url for r in sup.replicas)})", flush=True)
        code = sup.watch()
    except (RuntimeError, KeyboardInterrupt) as e:
        if isinstance(e, RuntimeError):
            print(f"pyserve: error: {e}", file=sys.stderr, flush=True)
        code = 2 if isinstance(e, RuntimeError) else 0
    return sup.stop() or code
