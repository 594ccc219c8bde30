"""The tiled attention kernel's step (csrc/attention/attention_tile.h): a K/V tile widened once, scores 16 keys at a
time, exp-weights with their denominator, and the rescaled weighted sum. The SIMD kernels equal their scalar twins
bit for bit for every row count, key count and head width (register blocks and their remainders), and the
twins compute what the header says, checked in float64."""
from __future__ import annotations

import numpy as np
import pytest

from pyserve import _engine

T = _engine.testing
DTYPES = ["f32", "f16", "bf16", "q8_0"]
LANES = 16  # kTileLanes: keys padded to a multiple


def case(dtype, rows, nt, hd, seed):
    rng = np.random.default_rng(seed)
    k = T.kv_write(dtype, rng.standard_normal((nt, hd)).astype(np.float32))
    v = T.kv_write(dtype, rng.standard_normal((nt, hd)).astype(np.float32))
    q = (rng.standard_normal((rows, hd)) * 0.3).astype(np.float32)
    m = (rng.standard_normal(rows) + 2.0).astype(np.float32)
    corr = rng.uniform(0.0, 1.0, rows).astype(np.float32)
    o = rng.standard_normal((rows, hd)).astype(np.float32)
    return q, k, v, m, corr, o


SHAPES = [(1, 1, 64), (4, 7, 64), (4, 16, 64), (3, 33, 128), (5, 128, 64), (8, 100, 256), (2, 17, 96),
          (9, 64, 32)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,nt,hd", SHAPES)
def test_tile_kernels_equal_their_scalar_twins(dtype, rows, nt, hd):
    q, k, v, m, corr, o = case(dtype, rows, nt, hd, rows * 1000 + nt + hd)
    """In place or widened to f32 (exact, so the same bits either way)."""
    ref = [T.attn_tile_step(dtype, q, k, v, n, m, corr, o, impl="ref") for n in sorted({1, max(1, nt // 2), nt})]
    for widen in (False, True):
        for n, want in zip(sorted({1, max(1, nt // 2), nt}), ref):
            got = T.attn_tile_step(dtype, q, k, v, n, m, corr, o, widen=widen, impl="simd")
            for name, a, b in zip(("k", "v", "scores", "weights", "denominators", "o"), got, want):
                assert np.array_equal(a, b), (name, n, widen)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_tile_holds_the_rows(dtype):
    """K as [keys padded to 16, hd] with zero rows for padding, V as rows, in place or widened: the stored
    values exactly."""
    for nt, hd in ((1, 32), (15, 64), (16, 64), (40, 96), (129, 128)):
        q, k, v, m, corr, o = case(dtype, 1, nt, hd, nt + hd)
        for widen in (False, True):
            kw, vw = T.attn_tile_step(dtype, q, k, v, nt, m, corr, o, widen=widen)[:2]
            ntp = -(-nt // LANES) * LANES
            assert kw.shape == (ntp, hd) and vw.shape == (nt, hd)
            assert np.array_equal(kw[:nt], T.kv_read(dtype, k, hd)) and not kw[nt:].any()
            assert np.array_equal(vw, T.kv_read(dtype, v, hd))


@pytest.mark.parametrize("rows,nt,hd", [(4, 100, 64), (3, 16, 256), (1, 5, 40)])
def test_the_step_computes_attention(rows, nt, hd):
    """In float64: scores q·kᵀ (padding keys 0), weights exp(s − m) over the first n keys and exactly 0
    beyond, their sum, and o·corr + weights·V."""
    q, k, v, m, corr, o = case("f16", rows, nt, hd, 7)
    kf, vf = T.kv_read("f16", k, hd).astype(np.float64), T.kv_read("f16", v, hd).astype(np.float64)
    n = nt - 3 if nt > 3 else nt
    _, _, s, w, den, out = T.attn_tile_step("f16", q, k, v, n, m, corr, o)
    np.testing.assert_allclose(s[:, :nt], q.astype(np.float64) @ kf.T, rtol=1e-5, atol=1e-5)
    assert not s[:, nt:].any()
    want = np.exp(s[:, :n].astype(np.float64) - m[:, None])
    np.testing.assert_allclose(w[:, :n], want, rtol=1e-6, atol=0)
    assert not w[:, n:].any()
    np.testing.assert_allclose(den, want.sum(axis=1), rtol=1e-6)
    np.testing.assert_allclose(out, o * corr[:, None] + want @ vf[:n], rtol=1e-5, atol=1e-5 * want.sum())


def test_a_tile_step_refuses_bad_shapes():
    q, k, v, m, corr, o = case("f16", 2, 8, 64, 0)
    for bad in (dict(n=0), dict(n=9), dict(m=m[:1]), dict(o=o[:, :32]), dict(impl="fast")):
        args = dict(n=8, m=m, corr=corr, o=o, widen=False, impl="simd") | bad
        with pytest.raises(ValueError):
            T.attn_tile_step("f16", q, k, v, **args)
