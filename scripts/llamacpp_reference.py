"""Make tests/data/llamacpp/logits.json: llama.cpp's own logits on the random-weight files of
tests/support/llamacpp_cases.py, the reference tests/models/test_llamacpp_logits.py holds pyserve's engine to.

Usage (once, after ../shared/tools/build_peer.sh; never in CI):
    python3 scripts/llamacpp_reference.py --venv /tmp/peer/venv --lib <LIB printed by build_peer.sh>

Each case's file is written by tests/support/model_factory.py (its seed is fixed, so the test writes the same bytes
again: the sha256 is stored to check it). llama.cpp runs each file under three settings: the whole prompt in
one batch without flash attention (the reference), the same with flash attention, and one token per batch.
Stored per prompt: the reference's top-10 token ids and logprobs at every position, and llama.cpp's own
spread (max |Δ logprob| over those ids between its settings); per control, how far llama.cpp itself moves on
the edited copy (so a control that does not bite is seen here, not in the test).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from support import llamacpp_cases as lc  # noqa: E402

SETTINGS = [dict(n_batch=128, n_ubatch=128, flash_attn=False), dict(n_batch=128, n_ubatch=128, flash_attn=True),
            dict(n_batch=1, n_ubatch=1, flash_attn=False)]
OUT = ROOT / "tests" / "data" / "llamacpp" / "logits.json"


def top(lp: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ids = np.argsort(-lp, axis=1, kind="stable")[:, : lc.TOP_K]
    return ids, np.take_along_axis(lp, ids, axis=1)


def run_llamacpp(args, jobs: list[dict], work: Path) -> None:
    spec = work / "jobs.json"
    spec.write_text(json.dumps({"settings": SETTINGS, "jobs": jobs}))
    env = {**os.environ, "LLAMA_CPP_LIB_PATH": args.lib}
    subprocess.run([f"{args.venv}/bin/python", str(ROOT / "scripts" / "llamacpp_logits.py"), str(spec)],
                   env=env, check=True)


def case_entry(case: lc.Case, path: Path, arrays) -> dict:
    prompts = []
    for j, (n, seed) in enumerate(lc.PROMPTS):
        ref = lc.log_softmax(arrays[f"s0_p{j}"])
        ids, ref_top = top(ref)
        spread = np.max([lc.top_deviation(arrays[f"s{i}_p{j}"], ids, ref_top).max(axis=1)
                         for i in range(1, len(SETTINGS))], axis=0)
        prompts.append({"tokens": lc.tokens(n, seed), "top_ids": ids.tolist(),
                        "top_logprobs": np.round(ref_top, 6).tolist(), "spread": np.round(spread, 6).tolist()})
    return {"arch": case.arch, "qtype": case.qtype, "sha256": lc.sha256(path), "prompts": prompts}


def control_bite(entry: dict, arrays) -> float:
    """How far llama.cpp itself moves on a control (max over prompts and positions)."""
    worst = 0.0
    for j, p in enumerate(entry["prompts"]):
        worst = max(worst, float(lc.top_deviation(arrays[f"s0_p{j}"], p["top_ids"], p["top_logprobs"]).max()))
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--venv", required=True, help="the peer's venv (build_peer.sh's VENV_PEER)")
    ap.add_argument("--lib", required=True, help="the folder of libllama.so (build_peer.sh's LIB)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="llamacpp_ref_"))
    paths = {c.id: c.write(work) for c in lc.CASES}
    controls = {k.case: k.write(paths[k.case], work / f"control-{Path(paths[k.case]).name}") for k in lc.CONTROLS}
    prompts = [lc.tokens(n, s) for n, s in lc.PROMPTS]
    jobs = [{"path": str(p), "prompts": prompts, "out": str(p) + ".npz"}
            for p in list(paths.values()) + list(controls.values())]
    run_llamacpp(args, jobs, work)
    refused = sorted(cid for cid, p in paths.items() if not Path(str(p) + ".npz").exists())
    cases = {cid: case_entry(lc.BY_ID[cid], p, np.load(str(p) + ".npz")) for cid, p in paths.items()
             if cid not in refused}
    bites = {k.case: round(control_bite(cases[k.case], np.load(str(controls[k.case]) + ".npz")), 4)
             for k in lc.CONTROLS if k.case in cases and Path(str(controls[k.case]) + ".npz").exists()}
    if refused:
        print("llama.cpp refused:", ", ".join(refused))
    OUT.write_text(json.dumps({"llama.cpp": "llama-cpp-python 0.3.36 (its vendored llama.cpp), 2 threads, f16 KV",
                               "settings": SETTINGS, "control_bite": bites, "cases": cases}, separators=(",", ":")))
    print(f"wrote {OUT} ({OUT.stat().st_size // 1024} KB): {len(cases)} cases; control bites {bites}")


if __name__ == "__main__":
    main()
