"""pyserve's prompt logprobs against llama.cpp's own, on the same random-weight files.

llama.cpp is the oracle: scripts/llamacpp_reference.py ran it (llama-cpp-python 0.3.36 over its vendored
llama.cpp) on every file of tests/support/llamacpp_cases.py and stored in tests/data/llamacpp/logits.json, per prompt
and position, its top-10 tokens' logprobs and its own spread between settings (flash attention on/off, one token
per batch). Here each file is written again (the same bytes: its sha256 is checked), run through the engine,
and the engine's logprobs of llama.cpp's top-10 tokens compared.

Bound at every position: BASE + 2 · spread (llama.cpp's own largest disagreement between its settings on this
file), with BASE by kind:
- float weights (F32, F16): 0.01; BF16 0.03. Seen: max 0.0005-0.016, mean <= 0.0025 (gemma4's MoE at F32 0.041
  where llama.cpp's spread is 0.035).
- quantized weights: 0.05. Both engines round activations to 8 bits; llama.cpp's settings share its rounding,
  pyserve's differs in the scales (float32, not fp16), which moves these small random models by ~0.1-0.4.
- quantized hybrids (qwen35, qwen35moe): 0.5. A DeltaNet head's output is RMS-normed and magnifies any
  rounding difference (tests/models/test_arch_logits.py): the NumPy reference in ggml's numerics is within 0.07 of
  llama.cpp here, in pyserve's within 0.02 of the engine, and the two numerics differ by 0.3-0.5.
- quantized mixtures of experts: where a routing choice is a near-tie (a margin below MOE_TIE in the NumPy
  reference run in ggml's or in pyserve's rounding, tests/support/numpy_ref.py), the two roundings may break it apart;
  those positions, the AFTER_TIE after each, and the worst tenth of the rest (at least one: a swap moves the next positions too) may be
  off by up to SWAP_TOL (seen: gpt-oss Q8_0 at one position, where the exact reference sides with pyserve;
  lfm2moe's mix at its first token, margin 0.02).
Means over all compared logprobs: MEAN_TOL by kind + spread / 2. Each architecture's control (its file with one feature
switched off, tests/support/llamacpp_cases.py CONTROLS) must fail the same comparison.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from pyserve import _engine
from support import llamacpp_cases as lc
from support import model_factory as tm
from support import numpy_ref as nr
from support.paths import DATA

DATA = json.loads((DATA / "llamacpp" / "logits.json").read_text())
BASE = {"float": 0.01, "BF16": 0.03, "quant": 0.05, "hybrid": 0.5}
MEAN_TOL = {"float": 0.004, "BF16": 0.02, "quant": 0.1, "hybrid": 0.15}
SWAP_TOL = 8.0
MOE_TIE = 0.05  # router-logit margin under which the two roundings may choose differently (seen: 0.045)
AFTER_TIE = 3  # positions after a near-tie that a swap there moves by more than the bound (seen: 3)


def kind(case: lc.Case) -> str:
    if case.qtype in ("F32", "F16"):
        return "float"
    if case.qtype == "BF16":
        return "BF16"
    return "hybrid" if case.arch in tm.hybrid.ARCHS else "quant"


def near_ties(path: Path, tokens: list[int]) -> np.ndarray:
    """Positions where some layer's routing is a near-tie in ggml's or pyserve's rounding, and the AFTER_TIE
    positions after each (they attend to the token whose expert may have swapped)."""
    tied = np.zeros(len(tokens), bool)
    for numerics in (True, nr.PYSERVE_NUMERICS):
        trace: dict = {}
        nr.ref_logits(path, tokens, emulate_ggml=numerics, trace=trace)
        tied |= np.min([v for k, v in trace.items() if k.endswith(".route_margin")], axis=0) < MOE_TIE
    for j in np.flatnonzero(tied):
        tied[j:j + AFTER_TIE + 1] = True
    return tied


def mismatch(eng, case: lc.Case, entry: dict, path: Path) -> str | None:
    """Why the engine's logprobs miss llama.cpp's for this case (None: they agree within the bounds)."""
    k = kind(case)
    spread = max(max(p["spread"]) for p in entry["prompts"])
    bound, mean_bound = BASE[k] + 2 * spread, MEAN_TOL[k] + spread / 2
    swaps = case.moe and k != "float"
    for p in entry["prompts"]:
        ids = p["top_ids"]
        d = lc.top_deviation(eng.prompt_logits(p["tokens"]), ids, p["top_logprobs"])
        over = d.max(axis=1) - bound
        tied = near_ties(path, p["tokens"]) if swaps else np.zeros(len(over), bool)
        spare = max(1, len(over) // 10) if swaps else 0
        ranked = [j for j in np.argsort(-over) if not tied[j]]
        worst = np.array(sorted(set(np.flatnonzero(tied)) | set(ranked[:spare])), int)
        if spare and d[worst].max() > SWAP_TOL:
            return f"T={len(ids)}: position {worst[0]} off by {d[worst].max():.3f}, more than a swapped expert"
        rest = np.setdiff1d(np.arange(len(over)), worst)
        if len(rest) and over[rest].max() > 0:
            j = rest[over[rest].argmax()]
            return (f"T={len(ids)}: position {j}: max|Δ logprob| {d[j].max():.4f} over the bound "
                    f"{bound:.4f}; per position {np.round(d.max(axis=1), 3).tolist()}")
        if len(rest) and d[rest].mean() > mean_bound:
            return f"T={len(ids)}: mean|Δ logprob| {d[rest].mean():.4f} > {mean_bound:.4f}"
    return None


def _engine_for(path: Path):
    return _engine.Engine(str(path), n_threads=1)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("llamacpp_cases")


def _written(case: lc.Case, folder: Path, entry: dict) -> Path:
    path = case.write(folder)
    assert lc.sha256(path) == entry["sha256"], (
        f"{case.id}: tests/support/model_factory.py no longer writes the file llama.cpp was run on; "
        "rerun scripts/llamacpp_reference.py")
    return path


@pytest.mark.parametrize("case_id", sorted(DATA["cases"]))
def test_engine_matches_llamacpp(folder, case_id):
    case, entry = lc.BY_ID[case_id], DATA["cases"][case_id]
    path = _written(case, folder, entry)
    why = mismatch(_engine_for(path), case, entry, path)
    assert why is None, f"{case_id}: {why}"


@pytest.mark.parametrize("control", lc.CONTROLS, ids=[k.case for k in lc.CONTROLS])
def test_control_is_caught(folder, control):
    case, entry = lc.BY_ID[control.case], DATA["cases"][control.case]
    original = _written(case, folder, entry)
    path = control.write(original, folder / f"control-{original.name}")
    assert mismatch(_engine_for(path), case, entry, path) is not None, f"{control.case}: '{control.what}' not caught"


def test_every_architecture_has_a_reference_and_a_control():
    archs = {e["arch"] for e in DATA["cases"].values()}
    assert archs == set(tm.ARCHS), f"no llama.cpp reference for {sorted(set(tm.ARCHS) - archs)}"
    controlled = {lc.BY_ID[k.case].arch for k in lc.CONTROLS}
    assert controlled == set(tm.ARCHS), f"no control for {sorted(set(tm.ARCHS) - controlled)}"
    assert set(lc.BY_ID) == set(DATA["cases"]), "cases and stored references differ: rerun the script"
