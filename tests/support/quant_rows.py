"""Random rows of every GGML type as raw bytes (valid blocks, scales over several decades), activations with
outliers, and the bit-for-bit comparison the kernel tests make."""
from __future__ import annotations

import gguf
import numpy as np

Q = gguf.GGMLQuantizationType


def block_size(t):
    return gguf.GGML_QUANT_SIZES[t][0]


def type_size(t):
    return gguf.GGML_QUANT_SIZES[t][1]


# ---------------------------------------------------------------------------------------------- data

def _scales(rng, nb, positive=False):
    """fp16 scales over several decades, with some subnormal and zero ones."""
    s = rng.uniform(0.2, 1.0, nb) * 10.0 ** rng.uniform(-4, 0, nb)
    if not positive:
        s *= rng.choice([-1.0, 1.0], nb)
    s[rng.random(nb) < 0.05] = 3e-6  # fp16 subnormal
    s[rng.random(nb) < 0.03] = 0.0
    return s.astype(np.float16).view(np.uint8).reshape(nb, 2)


# byte offsets of a block's fp16 scales (positive ones, as real quantizers write them for the types with a min)
SCALE_AT = {Q.Q4_0: [0], Q.Q5_0: [0], Q.Q8_0: [0], Q.IQ4_NL: [0], Q.IQ4_XS: [0], Q.IQ3_S: [0], Q.Q4_1: [0, 2],
            Q.Q5_1: [0, 2], Q.Q6_K: [208], Q.Q3_K: [108]}
POSITIVE_SCALES_AT = {Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q2_K: [80, 82]}


def rand_row(t, n, rng):
    """Raw bytes of a random row of n elements: random bytes are valid blocks once the fp16 scales are sane
    (MXFP4: its E8M0 exponent byte kept to scales 2^-30 .. 2^8, now and then the subnormal 2^-128, 2^-127)."""
    if t == Q.F32:
        return rng.normal(size=n).astype(np.float32).view(np.uint8)
    if t == Q.F16:
        return rng.normal(size=n).astype(np.float16).view(np.uint8)
    if t == Q.BF16:
        return (rng.normal(size=n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    nb = n // block_size(t)
    raw = rng.integers(0, 256, size=(nb, type_size(t)), dtype=np.uint8)
    for at in SCALE_AT.get(t, []):
        raw[:, at:at + 2] = _scales(rng, nb)
    for at in POSITIVE_SCALES_AT.get(t, []):
        raw[:, at:at + 2] = _scales(rng, nb, positive=True)
    if t == Q.MXFP4:
        raw[:, 0] = rng.integers(98, 137, nb)
        raw[rng.random(nb) < 0.03, 0] = rng.integers(0, 2)
    return raw.reshape(-1)


def rand_act(n, rng, ncols=None):
    shape = (n,) if ncols is None else (ncols, n)
    x = rng.normal(size=shape) * rng.choice([1e-3, 1.0, 50.0], size=shape[:-1] + (1,))
    x[..., rng.integers(0, n)] *= 30.0  # an outlier per row
    return x.astype(np.float32)


def assert_same_bits(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    assert a.shape == b.shape
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32)), np.flatnonzero(a.view(np.uint32) != b.view(np.uint32))[:10]
