"""Two builds of the engine side by side: single-stream decode tok/s of one GGUF file, each build in its own
fresh process, alternated pair by pair, and the median of the per-pair ratios (this tree over the other).

    PYTHONPATH=. python3 scripts/bench_builds.py --other DIR --model PATH [--pairs 6] [--tokens 128]

DIR is another checkout with its extension built (e.g. `git worktree add /tmp/before HEAD~1`, then its
`pip install -e .` or a CMake build into it): a folder holding the `pyserve` package to import. On a machine
shared with other tenants (bandwidth and clock swing 2x between minutes here) one run of each is noise; a
change shows as the median of several alternated pairs, all measured within the same minutes.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _one(model: str, tokens: int, threads: int) -> float:
    """Decode tok/s of one fresh engine (after a short warm-up that touches the weights once)."""
    sys.path.insert(0, str(HERE))
    import bench_engine as be
    from pyserve import _engine

    eng = _engine.Engine(model, n_threads=threads, enable_prefix_caching=False)
    vocab = eng.hparams["n_vocab"]
    eng.add("w", be.synthetic_prompt(16, vocab), {"temperature": 0.0}, 4, True)
    be.run_to_end(eng, {"w": 1})
    return be.one_stream_decode(eng, be.synthetic_prompt(8, vocab, 2), tokens)


def _run(root: str, a: argparse.Namespace) -> float:
    """One measurement in a child process importing pyserve from `root`."""
    env = dict(os.environ, PYTHONPATH=root)
    cmd = [sys.executable, __file__, "--one", "--model", a.model, "--tokens", str(a.tokens),
           "--threads", str(a.threads)]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True, timeout=600).stdout
    return float(out.split()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--other", help="a folder holding the other build's pyserve package")
    ap.add_argument("--model", required=True)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a measurement's own process
    a = ap.parse_args()
    if a.one:
        print(f"{_one(a.model, a.tokens, a.threads):.3f}")
        return
    if not a.other or not (Path(a.other) / "pyserve").is_dir():
        ap.error("--other must be a folder holding a built pyserve package")
    this = str(HERE.parent)
    print(f"decode tok/s, {a.model}, {a.tokens} tokens, {a.threads} threads: other | this | this / other")
    ratios = []
    for _ in range(a.pairs):
        other, mine = _run(a.other, a), _run(this, a)
        ratios.append(mine / other)
        print(f"{other:8.2f} | {mine:8.2f} | {mine / other:.3f}", flush=True)
    print(f"median ratio {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})")


if __name__ == "__main__":
    main()
