"""Issue 28's speed figures in one table from one run: pyserve beside llama.cpp (where its tools are given),
each figure against its limit.

    PYTHONPATH=. python3 scripts/bench_report.py [--threads 2] [--folder DIR] [--families "llama-3.2-1b,..."]
        [--rounds 1] [--long-model PATH] [--depths 8192] [--startup-runs 3] [--skip sizes,long,busy,startup]
        [--llama-bench BIN/llama-bench] [--llama-server BIN/llama-server] [--llama-lib DIR] [--llama-cpp]

One row a figure, `| area | case | pyserve | llama.cpp | pyserve vs llama.cpp | against its limit |`, the areas
measured one after another by the scripts that own them (their own docstrings say how):
- sizes (bench_families.py: its random-weight files at real shapes, written into --folder or reused): decode
  tok/s, its weight bytes read per second as a share of this machine's read bandwidth (and, bench_families'
  decode_share, the median share of the read measured in the same seconds), and 512-token prefill
  tok/s, its weight multiply-adds per second as a share of the vpdpbusd and AMX int8 peaks (the limits
  measured before each file's runs and after the last, the best kept: csrc/kernels/machine_limits.h); llama.cpp: `llama-bench -p 512 -n 64` (--llama-bench).
- long context (bench_long_context.py on --long-model, default the default model): prefill of each --depths
  prompt and decode at that depth, f16 KV; llama.cpp: llama-bench with flash attention on. Limit: ≥ 1.0×.
- a machine that is not idle (bench_busy.py, the default model): prefill and decode beside 1 and 2 CPU hogs at
  nice 0 and 5 as a share of idle (≥ 40 %), ITL p99 against idle's (≤ 3×); llama.cpp through llama-cpp-python
  with --llama-cpp (run this script with that venv's python, LLAMA_CPP_LIB_PATH set).
- start-up (bench_startup.py, the default model, a warm cache): `pyserve serve` to /health 200, the median of
  --startup-runs after a warm-up start (≤ 0.5 s); llama-server (--llama-server) alternating.
With --rounds R the sizes and busy figures are the best of R alternations.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from types import SimpleNamespace

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
sys.path.insert(0, HERE)

import bench_busy as busy_bench  # noqa: E402
import bench_families as families  # noqa: E402
import bench_long_context as long_bench  # noqa: E402
import bench_startup as startup_bench  # noqa: E402
from bench_bandwidth import read_bandwidth  # noqa: E402

AREAS = ("sizes", "long", "busy", "startup")


def row(area: str, case: str, ours: float, theirs: float | None, limit: str, unit: str,
        lower_is_better: bool = False) -> None:
    """One line of the table; the ratio is how many times better pyserve's figure is."""
    ratio = "—" if not theirs else f"**{(theirs / ours if lower_is_better else ours / theirs):.2f}×**"
    peer = "—" if theirs is None else f"{number(theirs)} {unit}"
    print(f"| {area} | {case} | {number(ours)} {unit} | {peer} | {ratio} | {limit} |", flush=True)


def number(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.1f}" if v >= 10 else f"{v:.3g}"


def limits(threads: int, before: tuple | None = None) -> tuple[float, dict]:
    """(read bandwidth, int8 peaks), each the best of this measurement and `before`'s: on a shared machine a
    neighbour's load lowers a limit for minutes, and the limit is what the machine can do."""
    bw, peaks = read_bandwidth(threads, 2048, 5), families.int8_peaks(threads)
    if before:
        bw, peaks = max(bw, before[0]), {k: max(p, before[1][k]) for k, p in peaks.items()}
    return bw, peaks


def sizes(args) -> None:
    figures = {}
    lim = None
    for name in args.families.split(","):
        lim = limits(args.threads, lim)  # before each file's runs, and after the last: the best of all
        path = families.write(args.folder, name)
        figures[name] = (path, *families.side_by_side(path, args.threads, args.rounds, args.llama_bench,
                                                      args.llama_lib))
    bw, peaks = limits(args.threads, lim)
    for name, (path, ours, theirs) in figures.items():
        read, macs = families.per_token(path)
        dec, pre = ours["decode_tok_s"], ours["prefill_tok_s"]
        same = families.decode_share(path, args.threads)
        row("sizes", f"{name}: decode", dec, theirs.get("decode_tok_s"),
            f"{100 * dec * read / bw:.0f} % of the {bw / 1e9:.1f} GB/s read bandwidth; {100 * same:.0f} % of the "
            "read in the same seconds", "tok/s")
        row("sizes", f"{name}: 512-token prefill", pre, theirs.get("prefill_tok_s"),
            families.peak_shares(pre * macs, peaks), "tok/s")


def long_context(args) -> None:
    path = args.long_model or default_model()
    peer = SimpleNamespace(llama_bench=args.llama_bench, llama_lib=args.llama_lib, model=path, threads=args.threads,
                           flash_attn="on", kv_cache_dtype="f16", decode=32)
    for depth in (int(d) for d in args.depths.split(",")):
        ours = long_bench.pyserve_run(path, args.threads, depth, 32, "f16")
        theirs = long_bench.peer_run(peer, depth) if args.llama_bench else {}
        row("long context", f"{depth}-token prefill", ours["prefill"], theirs.get("prefill"), "≥ 1.0× llama.cpp",
            "tok/s")
        row("long context", f"decode at depth {depth}", ours["decode"], theirs.get("decode"), "≥ 1.0× llama.cpp",
            "tok/s")


def busy(args) -> None:
    model = default_model()
    engines = ["pyserve"] + (["llama.cpp"] if args.llama_cpp else [])
    best = busy_bench.best_cases(engines, model, args.threads, args.rounds)
    ours, peer = best["pyserve"], best.get("llama.cpp", {})
    for name, _, _ in busy_bench.CASES[1:]:
        for key, label in (("prefill_tok_s", "prefill"), ("decode_tok_s", "decode")):
            share = ours[name][key] / ours["idle"][key]
            row("busy machine", f"{name}: {label}", ours[name][key], peer.get(name, {}).get(key),
                f"{100 * share:.0f} % of idle (≥ 40 %)", "tok/s")
        itl = ours[name]["itl_p99_ms"]
        row("busy machine", f"{name}: ITL p99", itl, None, f"{itl / ours['idle']['itl_p99_ms']:.1f}× idle (≤ 3×)",
            "ms")


def startup(args) -> None:
    ns = SimpleNamespace(threads=args.threads, model=None, timeout=120.0, cold=False,
                         llama_server=args.llama_server, llama_lib=args.llama_lib)
    ours, theirs = startup_bench.measured_starts(ns, args.startup_runs, [])
    row("start-up", "the default model: /health 200", statistics.median(r["health 200"] for r in ours),
        statistics.median(r["health 200"] for r in theirs) if theirs else None, "≤ 0.5 s", "s",
        lower_is_better=True)


def default_model() -> str:
    from pyserve.engine.model_source import resolve_model

    return resolve_model(None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--folder", default=None, help="where the families' files are written and reused")
    ap.add_argument("--families", default="llama-3.2-1b,llama-3.2-1b q8_0,qwen3-1.7b,qwen3-4b")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--long-model", default=None, help="the long-context file (default: the default model)")
    ap.add_argument("--depths", default="8192", help="long-context prompt lengths, comma-separated")
    ap.add_argument("--startup-runs", type=int, default=3)
    ap.add_argument("--skip", default="", help=f"areas left out, comma-separated, of {','.join(AREAS)}")
    ap.add_argument("--llama-bench", default=None, help="llama-bench from ../shared/tools/build_peer.sh")
    ap.add_argument("--llama-server", default=None, help="llama-server from the same build")
    ap.add_argument("--llama-lib", default=None, help="a folder put first on their library path")
    ap.add_argument("--llama-cpp", action="store_true", help="llama-cpp-python importable: the busy rows too")
    args = ap.parse_args()
    skip = {a for a in args.skip.split(",") if a}
    if skip - set(AREAS):
        ap.error(f"--skip takes {', '.join(AREAS)}")
    print("| area | case | pyserve | llama.cpp | pyserve vs llama.cpp | against its limit |\n|---|---|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        args.folder = args.folder or tmp
        for area, run in (("sizes", sizes), ("long", long_context), ("busy", busy), ("startup", startup)):
            if area not in skip:
                run(args)


if __name__ == "__main__":
    main()
