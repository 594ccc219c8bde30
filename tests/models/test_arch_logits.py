"""The C++ engine's prompt logits against the NumPy reference, on small random models of every
architecture and weight type (tests/support/model_factory.py).

Engine API used: ``pyserve._engine.Engine(path, n_threads=1).prompt_logits(token_ids)`` ->
``np.ndarray [T, n_vocab]``: the logits of every position of one sequence starting at position 0.
Skipped while the engine does not have it.

Tolerances. With F32 weights the only legitimate differences are f32 arithmetic and an f16 KV cache
(the reference's emulation of an f16 KV cache moves the logits by <= ~0.015 here), so the bound is
tight (0.05) and catches structural mistakes (RoPE pairing, window, norms, scales: those are O(1)).
With quantized weights an engine that rounds activations to 8 bits like ggml (Q8_0 / Q8_K) moves
the logits by up to ~0.6 (mean ~0.05-0.09) on these models, so the bound is derived from the
reference's own ggml emulation: max|d| <= 0.05 + 2.5 * (its max deviation), mean|d| <= 0.01 +
2.5 * (its mean deviation). A dequantization bug (wrong nibble order, scale packing) gives errors
of several units and still fails.

Mixtures of experts: rounding moves the router's scores, and where a token's n_used-th and next expert
nearly tie, the exact reference picks the other one (its logits then differ by units at that position;
even the f16 KV cache does it). So a MoE model is compared with the reference run in pyserve's own
numerics (numpy_ref.PYSERVE_NUMERICS: 8-bit activations with float32 scales, f16 K/V), which makes the
engine's choices but for float32-vs-float64 noise: what remains is accumulation order and the odd
round-half (one such in an early layer moves the rest of a prompt by ~0.15), <= 0.53 (mean <= 0.03) on
these models, bounded by MOE_TOL. Positions where some layer's
choice is within MOE_TIE of a tie in that reference are left out: at most a quarter of them (or one) may be.
A rounding event upstream can still swap an expert at a position whose margin was wider: with quantized
weights the worst tenth of the positions (at least one) may be off by up to MOE_SWAP_TOL.

Hybrids (Qwen3.5's Gated DeltaNet layers): a head's DeltaNet output is RMS-normed, and where it is small (q
nearly orthogonal to what the state holds) the norm magnifies whatever moved it; 8-bit activation rounding
alone then moves these models' logits by up to ~3.5 against the exact reference (ggml's rounding as much as
pyserve's). With F32 weights the engine is within 0.001 of the exact reference, so the float bounds stand;
with quantized weights it is compared with the reference in pyserve's numerics (as a MoE model), bounded by
HYBRID_TOL (seen: max 0.39, mean 0.05).
"""
from __future__ import annotations

import numpy as np
import pytest

from pyserve import _engine
from support import model_factory as tm
from support import numpy_ref as nr

# exact-arithmetic bounds on max |d logit| for the float weight types (see the module doc)
FLOAT_TOL = {"F32": 0.05, "F16": 0.08, "BF16": 0.3}
MOE_TOL = (0.75, 0.06)  # max, mean |d logit| of a quantized MoE model against the reference in pyserve's numerics
MOE_SWAP_TOL = 8.0  # what a swapped expert may move a logit by (a dequantization bug moves every position)
HYBRID_TOL = (0.6, 0.08)  # max, mean |d logit| of a quantized hybrid against the reference in pyserve's numerics
MOE_TIE = 0.02  # a routing margin (router-logit units) below which float32 noise may swap the choice (seen: 0.009)

QTYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "MXFP4", "Q2_K", "Q3_K", "Q4_K",
          "Q5_K", "Q6_K", "IQ4_XS", "IQ3_S", "mixed"]

CASES = [pytest.param(arch, q, {}, id=f"{arch}-{q}") for arch in tm.ARCHS for q in QTYPES]
CASES += [
    pytest.param("llama", "F32", {"rope_freqs": True}, id="llama-F32-rope_freqs"),
    pytest.param("llama", "Q4_K", {"rope_freqs": True, "tied": False}, id="llama-Q4_K-rope_freqs-untied"),
    pytest.param("llama", "F32", {"biases": True}, id="llama-F32-biases"),
    pytest.param("llama", "F32", {"tied": False}, id="llama-F32-untied"),
    pytest.param("qwen2", "Q8_0", {"tied": False}, id="qwen2-Q8_0-untied"),
    pytest.param("gemma3", "F32", {"tied": False}, id="gemma3-F32-untied"),
    pytest.param("gemma3", "Q8_0", {"sliding_window": 3}, id="gemma3-Q8_0-window3"),
    pytest.param("gemma3", "F32", {"n_layer": 7}, id="gemma3-F32-7layers"),
    # hyper-parameters that must come from the metadata, set where a wrong value shows
    pytest.param("llama", "F32", {"eps": 0.05}, id="llama-F32-eps0.05"),
    pytest.param("qwen2", "F32", {"eps": 0.05}, id="qwen2-F32-eps0.05"),
    pytest.param("qwen3", "F32", {"eps": 0.05}, id="qwen3-F32-eps0.05"),
    pytest.param("qwen3", "Q8_0", {"tied": False}, id="qwen3-Q8_0-untied"),
    pytest.param("qwen3", "F32", {"rope_base": 50.0}, id="qwen3-F32-base50"),
    pytest.param("smollm3", "F32", {"rope_base": 50.0, "n_layer": 8}, id="smollm3-F32-base50-8layers"),
    pytest.param("gemma3", "F32", {"eps": 0.05}, id="gemma3-F32-eps0.05"),
    pytest.param("llama", "F32", {"rope_base": 50.0}, id="llama-F32-base50"),
    pytest.param("gemma3", "F32", {"rope_base": 50.0}, id="gemma3-F32-base50"),
    pytest.param("llama", "F32", {"n_head_kv": 4}, id="llama-F32-mha"),
    pytest.param("qwen2", "F32", {"n_head_kv": 1}, id="qwen2-F32-mqa"),
    # mixtures of experts: every routing kind, shared experts, leading dense layers, a Mixtral-style llama
    pytest.param("qwen3moe", "F32", {"moe": {"n_used": 1}}, id="qwen3moe-F32-top1"),
    pytest.param("qwen3moe", "F32", {"moe": {"n_used": 8}}, id="qwen3moe-F32-all8"),
    pytest.param("qwen3moe", "F32", {"moe": {"norm": False, "scale": 2.5}}, id="qwen3moe-F32-unnormed-scaled"),
    pytest.param("qwen3moe", "F32", {"moe": {"gating": 2, "select_bias": True, "n_shared": 1, "dense_lead": 1,
                                             "n_expert": 16, "n_used": 4}, "n_layer": 3},
                 id="qwen3moe-F32-sigmoid-bias-shared-denselead"),
    pytest.param("qwen3moe", "F32", {"moe": {"gating": 3, "n_used": 4}}, id="qwen3moe-F32-softmax-over-chosen"),
    pytest.param("qwen3moe", "Q4_K", {"moe": {"n_shared": 2, "dense_lead": 1}, "n_layer": 3},
                 id="qwen3moe-Q4_K-shared-denselead"),
    pytest.param("llama", "F32", {"moe": {"n_expert": 4}}, id="llama-F32-mixtral"),
    pytest.param("llama", "Q8_0", {"moe": {"n_expert": 4}}, id="llama-Q8_0-mixtral"),
    pytest.param("glm4moe", "F32", {"moe": {"n_expert": 16, "n_used": 4}, "n_layer": 4}, id="glm4moe-F32-16experts"),
    pytest.param("glm4moe", "Q4_K", {"biases": False}, id="glm4moe-Q4_K-nobias"),
    # lfm2: a window on its attention layers, other layer kinds and conv widths, more experts
    pytest.param("lfm2", "F32", {"sliding_window": 5}, id="lfm2-F32-window5"),
    pytest.param("lfm2", "Q8_0", {"sliding_window": 5, "tied": False}, id="lfm2-Q8_0-window5-untied"),
    pytest.param("lfm2", "F32", {"attn_layers": (0, 3), "l_cache": 5}, id="lfm2-F32-attn0,3-lcache5"),
    pytest.param("lfm2moe", "F32", {"moe": {"n_expert": 16, "n_used": 4, "dense_lead": 2}},
                 id="lfm2moe-F32-16experts-denselead2"),
    # soft-caps that bite (the real files' 50 / 30 hardly touch a random model's scores), multipliers, norms
    pytest.param("gemma2", "F32", {"attn_softcap": 1.5, "final_softcap": 2.0}, id="gemma2-F32-softcaps-that-bite"),
    pytest.param("gemma2", "Q8_0", {"sliding_window": 3, "n_layer": 5}, id="gemma2-Q8_0-window3-5layers"),
    pytest.param("granite", "Q8_0", {"tied": False, "residual_scale": 0.2, "logit_scale": 0.5},
                 id="granite-Q8_0-untied-rescaled"),
    pytest.param("olmo2", "F32", {"eps": 0.05}, id="olmo2-F32-eps0.05"),
    # RoPE scaling as files declare it, on other architectures too
    pytest.param("mistral3", "F32", {"rope_scaling": {"type": "yarn", "factor": 8.0, "original_context": 12,
                                                      "log_mul": 0.5, "attn_factor": 0.9}},
                 id="mistral3-F32-yarn-logmul-attnfactor"),
    pytest.param("qwen3", "F32", {"rope_scaling": {"type": "yarn", "factor": 4.0, "original_context": 8}},
                 id="qwen3-F32-yarn"),
    pytest.param("llama", "F32", {"rope_scaling": {"type": "linear", "factor": 4.0}}, id="llama-F32-linear4"),
    pytest.param("phi3", "F32", {"rope_scaling": {"type": "longrope", "factor": 1.0, "original_context": 4096}},
                 id="phi3-F32-short-factors"),
    pytest.param("llama", "F32", {"attn_temperature": 0.3, "rope_scaling": {"type": "none", "factor": 1.0,
                                                                             "original_context": 4}},
                 id="llama-F32-temperature"),
    # gemma4: per-layer embeddings, shared-KV layers, K as V, a soft-cap that bites, all at once
    pytest.param("gemma4", "F32", {"per_layer": True}, id="gemma4-F32-per_layer"),
    pytest.param("gemma4", "Q8_0", {"per_layer": True}, id="gemma4-Q8_0-per_layer"),
    pytest.param("gemma4", "F32", {"shared_kv": True}, id="gemma4-F32-shared_kv"),
    pytest.param("gemma4", "Q4_K", {"shared_kv": True, "per_layer": True}, id="gemma4-Q4_K-shared_kv-per_layer"),
    pytest.param("gemma4", "F32", {"no_v": True}, id="gemma4-F32-no_v"),
    pytest.param("gemma4", "F32", {"final_softcap": 2.0, "tied": False}, id="gemma4-F32-softcap2-untied"),
    pytest.param("gemma4", "mixed", {"per_layer": True, "shared_kv": True, "no_v": True, "sliding_window": 9},
                 id="gemma4-mixed-everything"),
    pytest.param("gemma4", "F32", {"experts": True}, id="gemma4-F32-moe"),
    pytest.param("gemma4", "F32", {"experts": True, "fused_experts": True, "per_layer": True}, id="gemma4-F32-moe-fused"),
    pytest.param("gemma4", "Q8_0", {"experts": True, "shared_kv": True}, id="gemma4-Q8_0-moe-shared_kv"),
    # (K-quant MoE files are left out: the engine's K-quant rounding of gemma's larger activations departs from the
    # reference's emulation of it by ~0.1 at longer prompts, enough to swap experts; the dense K-quant cases run)
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("arch_models")


def _tokens(n: int, seed: int = 1) -> list[int]:
    _, _, _, bos, _ = tm.tokenizer_vocab()
    rng = np.random.default_rng(seed)
    return [bos] + [int(t) for t in rng.integers(0, bos, n - 1)]


def _reference(path, toks, qtype, moe: bool, hybrid: bool = False) -> tuple[np.ndarray, float, float, np.ndarray]:
    """(reference logits, max bound, mean bound, positions the max applies to) for this model (see the module doc)."""
    everywhere = np.ones(len(toks), bool)
    if hybrid and not moe and qtype not in FLOAT_TOL:
        return nr.ref_logits(path, toks, emulate_ggml=nr.PYSERVE_NUMERICS), *HYBRID_TOL, everywhere
    if moe:
        trace: dict = {}
        ref = nr.ref_logits(path, toks, emulate_ggml=nr.PYSERVE_NUMERICS, trace=trace)
        margins = [v for k, v in trace.items() if k.endswith(".route_margin")]
        clear = np.min(margins, axis=0) > MOE_TIE
        assert (~clear).sum() <= max(1, len(toks) // 4), f"{path}: near-tied routing at {np.flatnonzero(~clear).tolist()}"
        tol = (FLOAT_TOL[qtype], FLOAT_TOL[qtype] / 4) if qtype in FLOAT_TOL else MOE_TOL
        return ref, *tol, clear
    exact = nr.ref_logits(path, toks)
    if qtype in FLOAT_TOL:
        return exact, FLOAT_TOL[qtype], FLOAT_TOL[qtype] / 4, everywhere
    devs = [np.abs(nr.ref_logits(path, toks, emulate_ggml=True, emulate_seed=s) - exact) for s in (None, 0, 1)]
    return exact, 0.05 + 2.5 * max(d.max() for d in devs), 0.01 + 2.5 * max(d.mean() for d in devs), everywhere


def _compare(engine_logits: np.ndarray, ref: np.ndarray, max_tol: float, mean_tol: float, what: str,
             rows: np.ndarray | None = None, spare: int = 0) -> None:
    """Engine logits against the reference's on the positions `rows` (a mask; default all), of which the
    `spare` worst may differ by up to MOE_SWAP_TOL (a swapped expert; see the module doc)."""
    got = np.asarray(engine_logits, dtype=np.float64)
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    if rows is not None:
        got, ref = got[rows], ref[rows]
    if spare and len(got):
        worst = np.argsort(-np.abs(got - ref).max(axis=1))[:spare]
        assert np.abs(got - ref)[worst].max() <= MOE_SWAP_TOL, f"{what}: a position off by more than a swap"
        keep = np.setdiff1d(np.arange(len(got)), worst)
        got, ref = got[keep], ref[keep]
    if not len(got):
        return
    assert np.isfinite(got).all(), f"{what}: non-finite logits"
    d = np.abs(got - ref)
    worst = np.unravel_index(d.argmax(), d.shape)
    msg = (f"{what}: max|d| {d.max():.4f} (bound {max_tol:.4f}) at position {worst[0]} token {worst[1]}, "
           f"mean|d| {d.mean():.4f} (bound {mean_tol:.4f}); per position max: {np.round(d.max(axis=1), 3).tolist()}")
    assert d.max() <= max_tol and d.mean() <= mean_tol, msg
    # greedy choices agree wherever the reference's top-2 gap is clearly above the tolerance
    srt = np.sort(ref, axis=1)
    clear = (srt[:, -1] - srt[:, -2]) > 2 * max_tol
    assert (got.argmax(axis=1)[clear] == ref.argmax(axis=1)[clear]).all(), what + ": argmax differs"


@pytest.mark.parametrize("arch,qtype,kw", CASES)
def test_prompt_logits_match_reference(model_dir, arch, qtype, kw):
    name = f"{arch}-{qtype}-" + "-".join(f"{k}{v}" for k, v in sorted(kw.items())).replace(" ", "").replace("'", "") + ".gguf"
    path = tm.write_test_model(model_dir / name, arch, qtype=qtype, **kw)
    eng = _engine.Engine(str(path), n_threads=1)
    moe = tm.moe_config(arch, qtype, kw.get("moe")) is not None or bool(kw.get("experts"))  # gemma4's option
    for n, seed in ((24, 1), (1, 2), (41, 3)):
        toks = _tokens(n, seed)
        ref, max_tol, mean_tol, rows = _reference(path, toks, qtype, moe, arch in tm.hybrid.ARCHS)
        spare = max(1, n // 10) if moe and qtype not in FLOAT_TOL else 0
        _compare(eng.prompt_logits(toks), ref, max_tol, mean_tol, f"{name} T={n}", rows, spare)


@pytest.mark.parametrize("type_id,name", [(16, "IQ2_XXS"), (35, "TQ2_0")])  # real GGML types the engine lacks
def test_unsupported_tensor_type_is_a_clear_error(tmp_path, type_id, name):
    path = tm.write_test_model(tmp_path / "m.gguf", "llama", qtype="Q8_0")
    tm.patch_tensor_type(path, "token_embd.weight", type_id)
    with pytest.raises(_engine.GGUFError, match=rf"token_embd.weight.*unsupported tensor type {type_id} \({name}\)"):
        _engine.Engine(str(path), n_threads=1)


@pytest.mark.parametrize("arch", tm.ARCHS)
def test_decoding_through_the_kv_cache_gives_the_prefills_tokens(model_dir, arch):
    """Greedy decoding (one token a step, K/V read back from the paged cache, two sequences batched) picks
    what one prefill of the whole text would: the argmax of its logits at each position, and the same
    tokens alone as batched."""
    path = tm.write_test_model(model_dir / f"{arch}-decode.gguf", arch, qtype="Q8_0")
    eng = _engine.Engine(str(path), n_threads=1, block_size=4)
    prompts = [_tokens(7, 5), _tokens(12, 6)]
    tm.assert_decode_is_prefill_argmax(eng, prompts, 10)


