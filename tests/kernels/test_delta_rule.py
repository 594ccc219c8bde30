"""The gated delta rule's kernel (csrc/kernels/delta_rule.cpp, the recurrence of Qwen3.5's Gated DeltaNet layers): the
SIMD kernel equals its scalar twin bit for bit (outputs, state and per-token snapshots) at head widths that
use every path (blocks of four vectors, single vectors, scalar tails, several panels of the state), a run
split in two gives the bits of one run, and both agree with a float64 NumPy token loop on the state's
documented layout (panels of 64 value rows, each [head_k][width])."""
from __future__ import annotations

import numpy as np
import pytest

from pyserve import _engine

T = _engine.testing
PANEL = 64
SHAPES = [(16, 16), (128, 128), (32, 80), (8, 13), (64, 200)]  # (head_k, head_v)


def _inputs(n: int, head_k: int, head_v: int, seed: int):
    rng = np.random.default_rng(seed)
    q, k = (rng.standard_normal((n, head_k)).astype(np.float32) for _ in range(2))
    q /= np.linalg.norm(q, axis=1, keepdims=True)  # the layer L2-normalises q and k
    k /= np.linalg.norm(k, axis=1, keepdims=True)
    v = rng.standard_normal((n, head_v)).astype(np.float32)
    decay = np.exp(-rng.uniform(0.0, 0.5, n)).astype(np.float32)
    beta = rng.uniform(0.05, 0.95, n).astype(np.float32)
    M = (0.1 * rng.standard_normal(head_k * head_v)).astype(np.float32)
    return q, k, v, decay, beta, M


def _to_rows(flat: np.ndarray, head_k: int, head_v: int) -> np.ndarray:
    """The state's panels -> M [head_v, head_k] (value row j, key column i)."""
    out = np.empty((head_v, head_k), dtype=np.float64)
    for jv in range(0, head_v, PANEL):
        w = min(PANEL, head_v - jv)
        out[jv:jv + w] = flat[jv * head_k:(jv + w) * head_k].reshape(head_k, w).T
    return out


def _numpy_rule(q, k, v, decay, beta, M, scale):
    """float64, token by token: m ← m·decay; d = beta·(v − M k); M ← M + d kᵀ; o = (M q)·scale."""
    M = M.copy()
    o = np.empty(v.shape, dtype=np.float64)
    for t in range(len(q)):
        M *= decay[t]
        d = beta[t] * (v[t] - M @ k[t])
        M += np.outer(d, k[t])
        o[t] = (M @ q[t]) * scale
    return o, M


@pytest.mark.parametrize("head_k,head_v", SHAPES)
def test_simd_equals_its_scalar_twin_bit_for_bit(head_k, head_v):
    q, k, v, decay, beta, M = _inputs(37, head_k, head_v, head_k + head_v)
    snaps = [0, 5, 35, 36]
    simd = T.delta_rule(q, k, v, decay, beta, M, scale=0.25, snap_at=snaps, impl="simd")
    ref = T.delta_rule(q, k, v, decay, beta, M, scale=0.25, snap_at=snaps, impl="ref")
    for a, b in zip(simd, ref):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(simd[2][-1], simd[1])  # the last token's snapshot is the state left


@pytest.mark.parametrize("head_k,head_v", SHAPES[:3])
def test_a_run_split_in_two_gives_one_runs_bits(head_k, head_v):
    q, k, v, decay, beta, M = _inputs(40, head_k, head_v, 7)
    whole = T.delta_rule(q, k, v, decay, beta, M, scale=0.5, snap_at=[16])
    o1, m1, _ = T.delta_rule(q[:17], k[:17], v[:17], decay[:17], beta[:17], M, scale=0.5)
    o2, m2, _ = T.delta_rule(q[17:], k[17:], v[17:], decay[17:], beta[17:], m1, scale=0.5)
    np.testing.assert_array_equal(np.concatenate([o1, o2]), whole[0])
    np.testing.assert_array_equal(m2, whole[1])
    np.testing.assert_array_equal(m1, whole[2][0])  # the snapshot after token 16 is the state a run ending there leaves


@pytest.mark.parametrize("head_k,head_v", SHAPES)
def test_matches_a_float64_token_loop_on_the_documented_layout(head_k, head_v):
    q, k, v, decay, beta, M = _inputs(50, head_k, head_v, 3)
    o, m_after, _ = T.delta_rule(q, k, v, decay, beta, M, scale=0.125)
    want_o, want_m = _numpy_rule(q, k, v, decay, beta, _to_rows(M, head_k, head_v), 0.125)
    np.testing.assert_allclose(o, want_o, rtol=0, atol=2e-5)
    np.testing.assert_allclose(_to_rows(m_after, head_k, head_v), want_m, rtol=0, atol=2e-5)
    assert np.abs(want_o).max() > 0.01  # the outputs are not vanishing


def test_bad_shapes_are_refused():
    q, k, v, decay, beta, M = _inputs(4, 16, 16, 1)
    with pytest.raises(ValueError, match="head_k"):
        T.delta_rule(q, k, v, decay[:3], beta, M)
    with pytest.raises(ValueError, match="snap_at"):
        T.delta_rule(q, k, v, decay, beta, M, snap_at=[4])
    with pytest.raises(ValueError, match="impl"):
        T.delta_rule(q, k, v, decay, beta, M, impl="fast")
