"""The server's capacity on a machine that is not idle: `pyserve bench --find-capacity` against `pyserve serve`
(and llama-server on the same file with --llama-server), alone and with CPU-bound processes beside it
(`python3 -c 'while True: pass'`), each case's capacity and the figures of its last level within the SLOs.

    PYTHONPATH=. python3 scripts/bench_busy_capacity.py [--model PATH] [--threads 2]
        [--cases "idle,1 hog,2 hogs,1 hog nice 5"] [--itl-p99-slo 0.05] [--ttft-p99-slo 1.0]
        [--num-prompts 32] [--level-seconds 60] [--max-concurrency 32] [--llama-server BIN [--llama-lib DIR]]

Each server is started once (loopback, a free port) and measured in every case in turn; the hogs start before
a case's search and are killed after it. The load generator runs on the same two cores, as a user's client
would. Closed loop, 64 output tokens, the same prompts to both servers (`--no-tokenize`: 146 × 4 characters,
~106 Gemma tokens, no shared prefix), as the capacity table of docs/BENCHMARKS.md; a level ends after
--num-prompts requests or --level-seconds (then those in flight finish), whichever comes first: beside a hog a
server can slow to seconds a request. Where even one stream breaks an SLO (capacity 0), the row gives that
level's figures.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench_startup import free_port  # noqa: E402  (this folder is on the path of a script run from it)
from pyserve.bench.launch import ServerProcess  # noqa: E402
CASES = {"idle": (0, 0), "1 hog": (1, 0), "2 hogs": (2, 0), "1 hog nice 5": (1, 5), "2 hogs nice 5": (2, 5)}
HOG = "while True: pass"
SERVER_START_S = 120.0
SEARCH_TIMEOUT_S = 1800.0


def wait_health(url: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + SERVER_START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"llama-server exited ({proc.returncode}) before /health answered 200")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"/health not 200 within {SERVER_START_S:g} s")


class LlamaServer:
    """llama-server on a free loopback port, ready (/health 200) once made; stop() ends it."""

    def __init__(self, args: argparse.Namespace, model: str):
        port = free_port()
        env = dict(os.environ)
        if args.llama_lib:
            env["LD_LIBRARY_PATH"] = args.llama_lib + os.pathsep + env.get("LD_LIBRARY_PATH", "")
        cmd = [args.llama_server, "-m", model, "--host", "127.0.0.1", "--port", str(port), "-t", str(args.threads),
               "-np", "16", "-c", "16384"]
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"http://127.0.0.1:{port}"
        try:
            wait_health(self.url, self.proc)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_server(kind: str, args: argparse.Namespace, model: str):
    """A ready server with .url and .stop(): pyserve's own launcher, or llama-server."""
    if kind == "pyserve":
        return ServerProcess("--model", model, threads=args.threads).wait_ready(SERVER_START_S)
    return LlamaServer(args, model)


def search(url: str, args: argparse.Namespace) -> dict:
    """One capacity search by `pyserve bench`; its JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "capacity.json"
        cmd = [sys.executable, "-m", "pyserve", "bench", "--base-url", url, "--no-tokenize", "--input-len", "146",
               "--output-len", "64", "--no-progress", "--find-capacity", "--itl-p99-slo", str(args.itl_p99_slo),
               "--ttft-p99-slo", str(args.ttft_p99_slo), "--num-prompts", str(args.num_prompts),
               "--duration", str(args.level_seconds), "--max-concurrency", str(args.max_concurrency), "--seed", "7",
               "--output-json", str(out)]
        env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, timeout=SEARCH_TIMEOUT_S)
        return json.loads(out.read_text())


def with_hogs(hogs: int, nice: int, fn):
    procs = [subprocess.Popen([sys.executable, "-c", HOG], preexec_fn=lambda: os.nice(nice)) for _ in range(hogs)]
    try:
        return fn()
    finally:
        for p in procs:
            p.kill()
            p.wait()


def summary(result: dict) -> dict:
    """The capacity and the figures of its level (capacity 0: of the first level, which broke an SLO)."""
    levels = result["levels"]
    held = [lv for lv in levels if lv.get("slo_ok") and lv["concurrency"] == result["capacity"]]
    lv = held[-1] if held else levels[0]
    p99 = lambda key: (lv[key]["p99"] or 0.0) * 1e3  # noqa: E731
    return {"capacity": result["capacity"], "level": lv["concurrency"], "tok_s": lv["output_tokens_per_s"],
            "ttft_p99_ms": p99("ttft"), "itl_p99_ms": p99("itl")}


def measure(kind: str, args: argparse.Namespace, model: str, cases: list[str]) -> dict:
    server = start_server(kind, args, model)
    try:
        return {c: summary(with_hogs(*CASES[c], lambda: search(server.url, args))) for c in cases}
    finally:
        server.stop()


def print_table(rows: dict, cases: list[str]) -> None:
    print("| server | case | capacity (concurrent) | % of idle | figures at | tok/s | TTFT p99 (ms) | ITL p99 (ms) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for kind, by_case in rows.items():
        idle = by_case.get("idle", {}).get("capacity") or 0
        for c in cases:
            r = by_case[c]
            share = f"{r['capacity'] / idle:.0%}" if idle else "-"
            print(f"| {kind} | {c} | {r['capacity']} | {share} | c={r['level']} | {r['tok_s']:.1f} | {r['ttft_p99_ms']:.0f} | "
                  f"{r['itl_p99_ms']:.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cases", default="idle,1 hog,2 hogs")
    ap.add_argument("--itl-p99-slo", type=float, default=0.050)
    ap.add_argument("--ttft-p99-slo", type=float, default=1.0)
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--level-seconds", type=float, default=60.0)
    ap.add_argument("--max-concurrency", type=int, default=32)
    ap.add_argument("--llama-server", help="also measure this llama-server binary on the same file")
    ap.add_argument("--llama-lib", help="LD_LIBRARY_PATH for it (a build's bin folder)")
    args = ap.parse_args()
    cases = [c.strip() for c in args.cases.split(",")]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        ap.error(f"unknown cases {unknown}; known: {list(CASES)}")
    from pyserve.engine.model_source import resolve_model

    model = resolve_model(args.model)
    kinds = ["pyserve"] + (["llama-server"] if args.llama_server else [])
    rows = {k: measure(k, args, model, cases) for k in kinds}
    print(f"model {model}, threads {args.threads}, SLOs ITL p99 {args.itl_p99_slo * 1e3:g} ms, "
          f"TTFT p99 {args.ttft_p99_slo:g} s")
    print_table(rows, cases)


if __name__ == "__main__":
    main()
