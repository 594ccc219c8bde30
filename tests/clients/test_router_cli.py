"""`pyserve router` (pyserve/server/router_launch.py) and `pyserve serve --replicas N`
(pyserve/server/replicas.py): the router's command line as sglang-router 0.3.2's own parser reads it, the
message when it is missing, and N pinned replicas behind a real router, one restarted after it dies."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from sglang_router.launch_router import parse_router_args

from pyserve.bench.launch import PYSERVE_HOME, ServerProcess
from pyserve.cli import main
from pyserve.server.replicas import core_shares, free_ports
from support.live_server import MODEL

KEY = "sekrit"
AUTH = {"Authorization": f"Bearer {KEY}"}


def _pyserve(*args: str, pre: str = "pass") -> subprocess.CompletedProcess:
    code = f"import sys; {pre}; from pyserve.cli import main; sys.exit(main({list(args)!r}))"
    env = dict(os.environ, PYTHONPATH=PYSERVE_HOME)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=PYSERVE_HOME,
                          timeout=60)


def test_router_command_as_sglang_router_reads_it():
    out = _pyserve("router", "--worker-urls", "http://10.0.0.1:8000", "http://10.0.0.2:8000", "--policy",
                   "round_robin", "--print-command")
    assert out.returncode == 0, out.stderr
    cmd = out.stdout.split()
    assert cmd[:3] == [sys.executable, "-m", "sglang_router.launch_router"]
    ra = parse_router_args(cmd[3:])
    assert ra.worker_urls == ["http://10.0.0.1:8000", "http://10.0.0.2:8000"]
    assert ra.policy == "round_robin"  # a flag given wins over pyserve's default (cache_aware)
    assert (ra.host, ra.port, ra.prometheus_host, ra.prometheus_port) == ("127.0.0.1", 30000, "127.0.0.1", 29000)
    assert (ra.cache_threshold, ra.balance_abs_threshold, ra.balance_rel_threshold) == (0.5, 8, 1.5)
    assert (ra.health_check_interval_secs, ra.health_failure_threshold, ra.health_success_threshold) == (2, 2, 1)
    assert (ra.retry_max_retries, ra.cb_failure_threshold, ra.cb_timeout_duration_secs) == (5, 3, 10)
    assert (ra.request_timeout_secs, ra.shutdown_grace_period_secs) == (600, 35)


def test_router_missing_is_explained():
    out = _pyserve("router", "--worker-urls", "http://127.0.0.1:9", pre="sys.modules['sglang_router'] = None")
    assert out.returncode == 2
    assert "sglang-router is not installed: `pip install 'pyserve[router]'`" in out.stderr


def test_unknown_flags_only_forwarded_by_router(capsys):
    with pytest.raises(SystemExit) as e:
        main(["serve", "--polcy", "round_robin"])
    assert e.value.code == 2 and "unrecognized arguments: --polcy round_robin" in capsys.readouterr().err


def test_core_shares():
    assert core_shares(list(range(6)), 4) == [[0, 1], [2, 3], [4], [5]]
    assert core_shares([3, 5], 2) == [[3], [5]]
    with pytest.raises(ValueError, match="--replicas 3"):
        core_shares([0, 1], 3)


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def _replicas(pid: int) -> dict[int, set]:
    """The `pyserve serve` children of `pid` and the cores each may run on."""
    out = {}
    for c in _children(pid):
        with open(f"/proc/{c}/cmdline", "rb") as f:
            if b"serve" in f.read():
                out[c] = os.sched_getaffinity(c)
    return out


def _port_of(pid: int) -> int:
    """The port a replica was given (the last --port of its command line)."""
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        args = f.read().split(b"\0")
    last = max(i for i, a in enumerate(args) if a == b"--port")
    return int(args[last + 1])


def _complete(url: str, headers: dict) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 4},
                      headers=headers, timeout=60)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def test_serve_replicas():
    """--replicas 2: two replicas on disjoint shares of this process's cores, a router in front answering on
    --port and asking for the API key; a replica killed is started again on its port and the router serves on;
    SIGTERM ends them all."""
    port = free_ports(1)[0]
    with ServerProcess("--replicas", "2", "--port", str(port), "--api-key", KEY, threads=1) as srv:
        assert srv.url == f"http://127.0.0.1:{port}" and srv.model == MODEL
        reps = _replicas(srv.pid)
        cores = sorted(os.sched_getaffinity(0))
        assert sorted(c for s in reps.values() for c in s) == cores  # disjoint shares, all of them
        assert max(map(len, reps.values())) - min(map(len, reps.values())) <= 1
        assert _complete(srv.url, {}).status_code == 401  # the router's own answer
        r = _complete(srv.url, AUTH)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
        victim = min(reps)
        victim_port = _port_of(victim)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not (set(_replicas(srv.pid)) - set(reps)) and time.monotonic() < deadline:
            time.sleep(0.1)
        (again,) = set(_replicas(srv.pid)) - set(reps)
        assert _port_of(again) == victim_port and os.sched_getaffinity(again) == reps[victim]
        while not _healthy(f"http://127.0.0.1:{victim_port}") and time.monotonic() < deadline:
            time.sleep(0.1)  # (it listens once started, and answers 200 once its model is loaded)
        assert _complete(srv.url, AUTH).status_code == 200
        children = _children(srv.pid)
        assert srv.stop() == 0, "".join(srv.stderr[-30:])
    assert all(not os.path.exists(f"/proc/{c}") for c in children)
