"""Packed matmul kernels (csrc/kernels/packed.cpp): Q4_0 / Q5_0 / Q8_0 / Q4_K / Q5_K / Q6_K rows interleaved 8 at a
time.

Their contract is stronger than the SIMD tolerance of test_quant: every output element is the chain
Σ_blocks fma(d_w·d_a, exact block sum, acc) in block order (K-quants: then fma(−dmin·d_a, Σ mins, acc)),
which is what vec_dot_ref computes, so the
packed product must equal the scalar reference bit for bit — for any number of columns (batch
invariance), any row count (rows past the last group of 8 go through the reference itself) and threads.
"""
import numpy as np
import pytest

from pyserve import _engine
from support.quant_rows import Q, assert_same_bits, rand_act, rand_row

PACKED = [Q.Q4_0, Q.Q5_0, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K]


def reference(t, rows, x):
    return np.array([[_engine.testing.vec_dot(int(t), r, xc, impl="ref") for r in rows] for xc in x], np.float32)


@pytest.mark.parametrize("t", PACKED, ids=lambda t: t.name)
def test_a_build_with_the_avx2_kernels_packs_these_types(t):
    """Packed layouts exist for the AVX2 kernels; a portable (scalar) build keeps the file's rows."""
    assert _engine.testing.packable(int(t)) == _engine.testing.simd()["avx2"]


def test_a_native_build_here_has_the_avx2_kernels():
    flags = set()
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    if {"avx2", "fma", "f16c"} <= flags:
        assert _engine.testing.simd()["avx2"]
    if {"avx512bw", "avx512vl", "avx512_vnni"} <= flags:
        assert _engine.testing.simd()["avx512bw"] and _engine.testing.simd()["vnni"] == 1


@pytest.mark.parametrize("t", [Q.F32, Q.F16, Q.BF16, Q.Q4_1, Q.Q5_1], ids=lambda t: t.name)
def test_other_types_are_not_packed_and_match_the_tiles(t):
    rng = np.random.default_rng(int(t))
    n = 512
    rows = np.stack([rand_row(t, n, rng) for _ in range(11)])
    x = rand_act(n, rng, 5)
    assert not _engine.testing.packable(int(t))
    assert_same_bits(_engine.testing.matmul(int(t), rows, x), _engine.testing.vec_dot_tile(int(t), rows, x))


@pytest.mark.parametrize("t", PACKED, ids=lambda t: t.name)
@pytest.mark.parametrize("n_rows", [8, 24, 37, 64])  # 24: a pair of groups and one alone (decode takes two at a time)
def test_packed_equals_the_scalar_reference_bit_for_bit(t, n_rows):
    """Random raw blocks: every code (Q8_0's −128 too), fp16 scales over decades, zero and subnormal ones."""
    rng = np.random.default_rng(1000 * int(t) + n_rows)
    n = 768  # 24 legacy blocks, 3 super-blocks
    rows = np.stack([rand_row(t, n, rng) for _ in range(n_rows)])
    x = rand_act(n, rng, 17)
    want = reference(t, rows, x)
    for T in (1, 3, 8, 9, 16, 17):
        for threads in (1, 2):
            got = _engine.testing.matmul(int(t), rows, x[:T], threads=threads)
            assert_same_bits(got, want[:T])


@pytest.mark.parametrize("t", PACKED, ids=lambda t: t.name)
def test_a_column_gives_the_same_bits_in_any_slot(t):
    rng = np.random.default_rng(77 + int(t))
    rows = np.stack([rand_row(t, 256, rng) for _ in range(24)])
    x = rand_act(256, rng, 12)
    base = _engine.testing.matmul(int(t), rows, x)
    for perm in (np.arange(12)[::-1], rng.permutation(12)):
        assert_same_bits(_engine.testing.matmul(int(t), rows, x[perm]), base[perm])
    for c in range(12):
        assert_same_bits(_engine.testing.matmul(int(t), rows, x[c:c + 1])[0], base[c])


def test_extreme_codes_do_not_saturate():
    """Q8_0 codes all −128 against activations all +127: the block sum −520192 is exact (a saturating
    16-bit pair sum or a wrong offset correction would show)."""
    n, n_rows = 256, 16
    block = np.zeros(34, np.uint8)
    block[0:2] = np.array([1.0], np.float16).view(np.uint8)
    block[2:] = np.uint8(0x80)
    rows = np.tile(block, (n_rows, n // 32))
    x = np.ones((3, n), np.float32)  # quantizes to d = 1/127, all codes 127
    for T in (1, 3):  # 1: decode's kernel of two groups at once
        got = _engine.testing.matmul(int(Q.Q8_0), rows, x[:T])
        assert np.allclose(got, -128.0 * n, rtol=1e-6)  # d_w = 1, d_a · 127 = 1
        assert_same_bits(got, reference(Q.Q8_0, rows, x[:T]))


def test_matmul_rejects_a_wrong_row_size():
    rng = np.random.default_rng(5)
    rows = np.stack([rand_row(Q.Q8_0, 256, rng) for _ in range(8)])
    with pytest.raises(ValueError, match="row size"):
        _engine.testing.matmul(int(Q.Q8_0), rows, rand_act(288, rng, 2))


@pytest.mark.parametrize("t", PACKED, ids=lambda t: t.name)
def test_prefill_sized_products_equal_the_reference_bit_for_bit(t):
    """16 columns and more: on a CPU with AMX (simd()["amx"]) whole 16 × 16 tiles go through
    csrc/kernels/packed_amx.cpp, the columns past them and an odd last group through the AVX kernels. Rows of
    1,536 elements (48 legacy blocks, 6 super-blocks: batches of 4 with a remainder for Q5_0's 48), 5 groups
    (the fifth alone) plus 3 rows past them; 16, 33 and 50 columns on 1 and 2 threads."""
    rng = np.random.default_rng(4242 + int(t))
    n, n_rows = 1536, 43
    rows = np.stack([rand_row(t, n, rng) for _ in range(n_rows)])
    x = rand_act(n, rng, 50)
    want = reference(t, rows, x)
    for T in (16, 33, 50):
        for threads in (1, 2):
            assert_same_bits(_engine.testing.matmul(int(t), rows, x[:T], threads=threads), want[:T])


def test_amx_runs_where_the_cpu_and_the_os_have_it():
    """The AMX kernels are not left out silently on a machine that has AMX-INT8 (Linux grants the tile
    state to any process that asks)."""
    with open("/proc/cpuinfo") as f:
        flags = next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    simd = _engine.testing.simd()
    if {"amx_tile", "amx_int8", "avx512bw", "avx512vl"} <= flags and simd["avx512bw"]:
        assert simd["amx"]
    if "amx_int8" not in flags:
        assert not simd["amx"]
