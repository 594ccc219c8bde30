"""Start-up time: `pyserve serve` from spawn to its first /health 200, and where the load's time goes.

    PYTHONPATH=. python3 scripts/bench_startup.py [--runs 5] [--model PATH] [--threads 2] [--cold]
                                                  [--profile] [--llama-server BIN [--llama-lib DIR]]
                                                  [-- extra serve args]

Each run spawns `python -m pyserve serve --host 127.0.0.1 --port P` (P a free loopback port), polls GET
/health every 5 ms from the spawn on, and records: the first accepted connection (the process is up and
listening; /health says 503 while the model loads), the first 200, and the phases the server logs for the
load ("model … loaded in …": header, engine | tokenizer side by side, calibrate, serving tables), and the
process's CPU time at its first 200 (user + system, all threads: a figure a busy machine disturbs less than
the wall times). Then it
stops the server (SIGTERM). --cold gives every run an empty pyserve cache folder (PYSERVE_CACHE_DIR): the
tokenizer is derived from the vocabulary and the default model's file hashed, as on a first start; without
it the runs share one folder, filled by a first, unreported warm-up start. One table, medians and per run.

--llama-server BIN (with --llama-lib DIR, its libraries): after each start, llama-server on the same file with
the same threads, polled the same way (its /health is 503 while it loads); its own table.

The tree's modules are byte-compiled first (compileall, as `pip install` does for an installed pyserve): an
environment with PYTHONDONTWRITEBYTECODE set would otherwise compile ~110 modules from source on every start
(~0.09 s measured here), a cost no installed server pays.

--profile: instead, the load's phases run one after another in this process under cProfile (a cold
tokenizer build, a cached one, the engine with the serving options), each with its top functions.
"""
from __future__ import annotations

import argparse
import compileall
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOADED = re.compile(r"model (\S+) loaded in ([\d.]+) s \((.*)\)")
PHASE = re.compile(r"([a-z][a-z ]*?) ([\d.]+) s")
MAX_RUNS = 20


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def health(port: int) -> int:
    """The status of GET /health (0: no connection)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as s:
            s.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            head = s.recv(64)
    except OSError:
        return 0
    m = re.match(rb"HTTP/1\.[01] (\d{3})", head)
    return int(m.group(1)) if m else -1


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process (all its threads) so far; less sensitive than wall time to a
    machine shared with other work (nan where /proc is not there)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def until_healthy(cmd: list[str], env: dict, port: int, timeout: float) -> tuple[dict, str]:
    """Spawns `cmd`, polls its /health until 200, stops it (SIGTERM): ({listening, health 200, cpu}, its stderr)."""
    with tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)
        up = ok = None
        try:
            while ok is None and time.perf_counter() - t0 < timeout:
                code = health(port)
                now = time.perf_counter() - t0
                if code and up is None:
                    up = now
                if code == 200:
                    ok, cpu = now, cpu_seconds(proc.pid)
                elif proc.poll() is not None:
                    break
                else:
                    time.sleep(0.005)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        err.seek(0)
        log = err.read()
    if ok is None:
        raise RuntimeError(f"no /health 200 within {timeout:g} s (exit {proc.returncode}):\n{log[-3000:]}")
    return {"listening": up, "health 200": ok, "cpu": cpu}, log


def one_start(args, cache: str, extra: list[str]) -> dict:
    port = free_port()
    cmd = [sys.executable, "-m", "pyserve", "serve", "--host", "127.0.0.1", "--port", str(port),
           "--threads", str(args.threads), *(["--model", args.model] if args.model else []), *extra]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYSERVE_CACHE_DIR=cache)
    row, log = until_healthy(cmd, env, port, args.timeout)
    m = LOADED.search(log)
    if m:
        row["load"] = float(m.group(2))
        detail = m.group(3)
        row.update({name.strip(): float(v) for name, v in PHASE.findall(detail) if name.strip() != "resolve"})
        row["tokenizer from"] = "cache" if "(cached)" in detail else "built"
    return row


def peer_start(args, model: str) -> dict:
    """llama-server on the same file and threads (its /health is 503 while it loads, 200 once ready)."""
    port = free_port()
    cmd = [args.llama_server, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", str(args.threads)]
    env = dict(os.environ)
    if args.llama_lib:
        env["LD_LIBRARY_PATH"] = args.llama_lib + os.pathsep + env.get("LD_LIBRARY_PATH", "")
    return until_healthy(cmd, env, port, args.timeout)[0]


def table(rows: list[dict]) -> str:
    cols = [c for c in rows[0] if c != "tokenizer from"]
    lines = ["| run | " + " | ".join(f"{c} (s)" for c in cols) + " | tokenizer |",
             "|---|" + "---:|" * len(cols) + "---|"]
    for i, r in enumerate(rows, 1):
        lines.append(f"| {i} | " + " | ".join(f"{r.get(c, float('nan')):.3f}" for c in cols)
                     + f" | {r.get('tokenizer from', '?')} |")
    med = {c: statistics.median(r[c] for r in rows if c in r) for c in cols}
    lines.append("| median | " + " | ".join(f"**{med[c]:.3f}**" for c in cols) + " | |")
    return "\n".join(lines)


def profile(args) -> None:
    import cProfile
    import pstats

    sys.path.insert(0, str(ROOT))
    from pyserve import _engine
    from pyserve.engine.model_source import resolve_model
    from pyserve.engine.options import EngineOptions
    from pyserve.engine.tokenizer_cache import load_tokenizer

    path = resolve_model(args.model)
    meta = _engine.read_gguf(path)[0]
    opts = EngineOptions.serving(n_threads=args.threads).as_dict()
    with tempfile.TemporaryDirectory() as d:
        for label, fn in (("tokenizer, derived (cold cache)", lambda: load_tokenizer(meta, Path(d))),
                          ("tokenizer, from the cache", lambda: load_tokenizer(meta, Path(d))),
                          ("engine (serving options)", lambda: _engine.Engine(path, **opts))):
            pr = cProfile.Profile()
            t0 = time.perf_counter()
            pr.runcall(fn)
            print(f"\n## {label}: {time.perf_counter() - t0:.3f} s")
            pstats.Stats(pr).sort_stats("tottime").print_stats(12)


def measured_starts(args, runs: int, extra: list[str]) -> tuple[list[dict], list[dict]]:
    """`runs` starts of pyserve (one_start's rows), each followed by llama-server's (peer_start's) when
    args.llama_server is set; the tree byte-compiled first and, unless args.cold, a first unreported start
    filling the shared cache folder."""
    compileall.compile_dir(str(ROOT / "pyserve"), quiet=1)
    rows, peer = [], []
    model = args.model
    if args.llama_server and not model:
        sys.path.insert(0, str(ROOT))
        from pyserve.engine.model_source import resolve_model

        model = resolve_model(None)
    with tempfile.TemporaryDirectory(prefix="pyserve-cache-") as shared:
        if not args.cold:
            one_start(args, shared, extra)  # fills the cache; not reported
        for _ in range(runs):
            with tempfile.TemporaryDirectory(prefix="pyserve-cache-") as fresh:
                rows.append(one_start(args, fresh if args.cold else shared, extra))
            if args.llama_server:
                peer.append(peer_start(args, model))
    return rows, peer


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=5, help=f"starts measured (at most {MAX_RUNS})")
    ap.add_argument("--model", help="a GGUF path (default: the default model)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cold", action="store_true", help="an empty pyserve cache folder for every start")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a start may take")
    ap.add_argument("--profile", action="store_true", help="cProfile the load's phases in this process")
    ap.add_argument("--llama-server", help="also start this llama-server binary on the same file, alternating")
    ap.add_argument("--llama-lib", help="LD_LIBRARY_PATH for it (a build's bin folder)")
    args, extra = ap.parse_known_args()
    extra = [a for a in extra if a != "--"]
    if args.profile:
        profile(args)
        return 0
    runs = max(1, min(args.runs, MAX_RUNS))
    rows, peer = measured_starts(args, runs, extra)
    print(f"`pyserve serve` to /health 200, {'cold' if args.cold else 'warm'} cache, "
          f"{args.model or 'the default model'}, --threads {args.threads}, {runs} runs")
    print(table(rows))
    if peer:
        print(f"\n`{args.llama_server}` on the same file, -t {args.threads}, alternating with the runs above")
        print(table(peer))
    return 0


if __name__ == "__main__":
    sys.exit(main())
