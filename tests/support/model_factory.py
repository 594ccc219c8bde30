"""Small random GGUF test models for the engine tests (no test functions in here).

    from .model_factory import write_test_model
    path = write_test_model(tmp_path / "m.gguf", "llama", qtype="Q4_K", rope_freqs=True, tied=False)

``write_test_model(path, arch, *, qtype="F32", rope_freqs=False, tied=None, seed=0, ...)`` writes a
complete model with the real tensor names and metadata keys of llama.cpp, random weights scaled so
that the activations stay of order 1, and a tiny byte-level BPE tokenizer (tokenizer.ggml.model
"gpt2", pre "gpt-2": the 256 GPT-2 byte symbols in bytes_to_unicode order, a few merged tokens, then
the control tokens ``<s>`` (BOS) and ``</s>`` (EOS)), so the whole pipeline can load it.

Sizes: with 32-element quants (or F32/F16/BF16) n_embd 64, head_dim 16 (gemma3: 32, so that
n_head*head_dim != n_embd as in the real Gemma 3), n_ff 128; with 256-element blocks (K-quants, IQ4_XS, IQ3_S)
n_embd 256, head_dim 64 (gemma3: 128), n_ff 512. Always 4 heads and 2 KV heads. Layers: llama/qwen2
2, smollm3 4 (the 4th position-free), qwen3 and qwen3moe 2 (head_dim 32 / 128: n_head * head_dim != n_embd),
gemma3 6 (layers 0-4 sliding-window with window 8, layer 5 global: llama.cpp's fixed pattern 6), gemma2 4
(layers 0 and 2 local, window 8; soft-caps 50 / 30 as the real files, ``attn_softcap`` / ``final_softcap``
override), granite 2 (embedding_scale 4, residual_scale 0.5, logit_scale 2, attention.scale 0.1), olmo2 2
(post-norms only, q/k normed over the whole projection), glm4moe 3 + a NextN block, mistral3 2 (YaRN x16 from
an original context of 16, attention temperature 0.1), phi3 2 (fused attn_qkv and gate/up, 3/4 of each head
rotated, LongRoPE factors with an original context of 256: the long ones at the default context), gpt-oss 2
(layer 0 local over 8, YaRN x32 from 16 on both, q/k/v/output biases, attention sinks, 8 experts with router and
expert biases, routed by a softmax over the chosen two, the clamped SwiGLU), gemma4 6 (model_factory_gemma4.py: its
per-layer shapes and options), qwen35 / qwen35moe 4 (model_factory_hybrid.py: 3 Gated DeltaNet layers, then
attention), lfm2 / lfm2moe 4 (model_factory_lfm2.py: gated short convs, layer 2 attention; ``attn_layers``,
``l_cache``, ``conv_flip``). ``rope_scaling={"type": "linear" | "yarn", "factor": f,
"original_context": n, "attn_factor": a, "log_mul": m}`` and ``attn_temperature=s`` apply to any arch.

Mixture of experts (qwen3moe always; any arch with ``moe={...}``): 8 experts of width 64 (K-quants: 256),
2 used per token, llama.cpp's tensor names (ffn_gate_inp F32 as its quantizer leaves it, 3-D
ffn_{gate,up,down}_exps [n_expert, n_out, n_in]). ``moe`` overrides: n_expert, n_used, n_ff, n_shared
(shared experts of width n_ff each), dense_lead (leading dense layers), gating (1 softmax, 2 sigmoid, 3
softmax over the chosen), norm (expert_weights_norm; absent: the arch's default), scale, select_bias
(an exp_probs_b tensor). The router is scaled so that its logits spread by ~4: a token's best experts are
seldom near a tie that rounding could swap.

qtype: a type name for every 2-D weight ("F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1",
"Q8_0", "IQ4_NL", "MXFP4", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ3_S"), "mixed" (a Q4_K_M-like mix like the real Gemma 3
file: attn_q/attn_k/ffn_gate/ffn_up Q5_0, attn_v and token_embd Q8_0, attn_output Q4_K, ffn_down and
output Q6_K), or a dict {"default": type, "attn_q": type, "token_embd": type, ...} keyed by the tensor
name's role. Norms, biases and rope_freqs stay F32 (as llama.cpp's quantizer leaves them).
gguf-py cannot quantize to K-quants, IQ4_NL, IQ4_XS or IQ3_S; the encoders below write valid blocks
(simple, not llama.cpp's optimal search) that gguf's dequantize (and so ggml) reads back within the
format's precision.
"""
from __future__ import annotations

import functools
import os
import struct
from pathlib import Path
from typing import Any, Mapping

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFWriter, TokenType

from pyserve.engine.tokenizer import bytes_to_unicode

from . import model_factory_hybrid as hybrid
from . import model_factory_lfm2 as lfm2

QK_K = 256
ARCHS = ("llama", "qwen2", "qwen3", "qwen3moe", "smollm3", "gemma2", "gemma3", "glm4moe", "granite", "olmo2",
         "mistral3", "phi3", "gpt-oss", "gemma4") + hybrid.ARCHS + lfm2.ARCHS
GEMMAS = ("gemma2", "gemma3")
UNTIED_ARCHS = ("olmo2", "gpt-oss")
MOE_ARCHS = ("qwen3moe", "glm4moe", "gpt-oss", "qwen35moe", "lfm2moe")  # always mixtures of experts (any other arch becomes one with moe={...})

K_QUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
BLOCK_256 = K_QUANTS + ("IQ4_XS", "IQ3_S")      # super-blocks of 256 elements
BLOCK_32 = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "MXFP4")
FLOAT_TYPES = ("F32", "F16", "BF16")
ALL_QTYPES = FLOAT_TYPES + BLOCK_32 + BLOCK_256

MIXED = {"default": "Q5_0", "attn_q": "Q5_0", "attn_k": "Q5_0", "ffn_gate": "Q5_0", "ffn_up": "Q5_0",
         "attn_v": "Q8_0", "token_embd": "Q8_0", "attn_output": "Q4_K", "ffn_down": "Q6_K",
         "output": "Q6_K"}

# general.file_type (llama_ftype) for a uniform qtype
FILE_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10,
              "IQ4_NL": 25, "IQ3_S": 26, "IQ4_XS": 30, "MXFP4": 38,
              "Q3_K": 12, "Q4_K": 15, "Q5_K": 17, "Q6_K": 18, "BF16": 32, "mixed": 15}


# --------------------------------------------------------------------------------------------------
# encoders of the types gguf-py cannot quantize (the inverse of gguf.quants' dequantize_blocks layouts)
# --------------------------------------------------------------------------------------------------

def _f16(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, dtype=np.float32).astype(np.float16)


def _safe_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(b != 0, a / np.where(b != 0, b, 1), 0)


def _scale_min_quant(x: np.ndarray, nmax: int, smax: int):
    """Asymmetric sub-block quantization x ~ d*sc*q - dmin*m with q in [0, nmax], sc/m in [0, smax].
    x: (nb, n_sub, sub). Returns d16, dmin16 (nb,), sc, m (nb, n_sub) ints, q (nb, n_sub, sub) ints."""
    mn = np.minimum(x.min(axis=2), 0.0)
    mx = x.max(axis=2)
    scale = (mx - mn) / nmax
    mins = -mn
    d16 = _f16(scale.max(axis=1) / smax)
    dmin16 = _f16(mins.max(axis=1) / smax)
    d, dmin = d16.astype(np.float32), dmin16.astype(np.float32)
    sc = np.clip(np.round(_safe_div(scale, d[:, None])), 0, smax).astype(np.int64)
    m = np.clip(np.round(_safe_div(mins, dmin[:, None])), 0, smax).astype(np.int64)
    eff_d = (d[:, None] * sc)[..., None]
    eff_m = (dmin[:, None] * m)[..., None]
    q = np.clip(np.round(_safe_div(x + eff_m, eff_d)), 0, nmax).astype(np.int64)
    return d16, dmin16, sc, m, q


def _pack_scale_min_k4(sc: np.ndarray, m: np.ndarray) -> np.ndarray:
    """The 12-byte 6-bit scale/min packing of Q4_K/Q5_K (get_scale_min_k4)."""
    nb = sc.shape[0]
    out = np.zeros((nb, 12), dtype=np.uint8)
    out[:, 0:4] = (sc[:, 0:4] & 63) | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = (m[:, 0:4] & 63) | ((m[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 15) | ((m[:, 4:8] & 15) << 4)
    return out


def _nibbles_q4k(q: np.ndarray) -> np.ndarray:
    """q (nb, 8, 32) in [0, 15] -> 128 bytes: group g holds sub-blocks 2g (low) and 2g+1 (high)."""
    nb = q.shape[0]
    q = q.reshape(nb, 4, 2, 32)
    return (q[:, :, 0, :] | (q[:, :, 1, :] << 4)).reshape(nb, 128).astype(np.uint8)


def quantize_q4_k(blocks: np.ndarray) -> np.ndarray:
    nb = blocks.shape[0]
    d16, dmin16, sc, m, q = _scale_min_quant(blocks.reshape(nb, 8, 32), 15, 63)
    return np.concatenate([d16.view(np.uint8).reshape(nb, 2), dmin16.view(np.uint8).reshape(nb, 2),
                           _pack_scale_min_k4(sc, m), _nibbles_q4k(q)], axis=1)


def quantize_q5_k(blocks: np.ndarray) -> np.ndarray:
    nb = blocks.shape[0]
    d16, dmin16, sc, m, q = _scale_min_quant(blocks.reshape(nb, 8, 32), 31, 63)
    qh = np.zeros((nb, 32), dtype=np.uint8)
    for j in range(8):
        qh |= (((q[:, j, :] >> 4) & 1) << j).astype(np.uint8)
    return np.concatenate([d16.view(np.uint8).reshape(nb, 2), dmin16.view(np.uint8).reshape(nb, 2),
                           _pack_scale_min_k4(sc, m), qh, _nibbles_q4k(q & 15)], axis=1)


def quantize_q6_k(blocks: np.ndarray) -> np.ndarray:
    nb = blocks.shape[0]
    x = blocks.reshape(nb, 16, 16)
    scale = np.abs(x).max(axis=2) / 31.0
    d16 = _f16(scale.max(axis=1) / 127.0)
    d = d16.astype(np.float32)
    sc = np.clip(np.round(_safe_div(scale, d[:, None])), 0, 127).astype(np.int64)
    eff = (d[:, None] * sc)[..., None]
    q = (np.clip(np.round(_safe_div(x, eff)), -32, 31) + 32).astype(np.int64).reshape(nb, 2, 128)
    ql = (q[:, :, 0:64] & 15) | ((q[:, :, 64:128] & 15) << 4)                     # (nb, 2, 64)
    hi = (q >> 4) & 3                                                              # (nb, 2, 128)
    qh = hi[:, :, 0:32] | (hi[:, :, 32:64] << 2) | (hi[:, :, 64:96] << 4) | (hi[:, :, 96:128] << 6)
    return np.concatenate([ql.reshape(nb, 128).astype(np.uint8), qh.reshape(nb, 64).astype(np.uint8),
                           sc.astype(np.int8).view(np.uint8), d16.view(np.uint8).reshape(nb, 2)], axis=1)


def _crumbs(q: np.ndarray) -> np.ndarray:
    """(nb, 256) 2-bit values -> 64 bytes: byte h*32+l holds elements h*128 + k*32 + l at bits 2k."""
    nb = q.shape[0]
    q = q.reshape(nb, 2, 4, 32)
    return (q[:, :, 0] | (q[:, :, 1] << 2) | (q[:, :, 2] << 4) | (q[:, :, 3] << 6)).reshape(nb, 64).astype(np.uint8)


def quantize_q2_k(blocks: np.ndarray) -> np.ndarray:
    nb = blocks.shape[0]
    d16, dmin16, sc, m, q = _scale_min_quant(blocks.reshape(nb, 16, 16), 3, 15)
    scales = (sc | (m << 4)).astype(np.uint8)
    return np.concatenate([scales, _crumbs(q.reshape(nb, 256)), d16.view(np.uint8).reshape(nb, 2),
                           dmin16.view(np.uint8).reshape(nb, 2)], axis=1)


def _extreme_over(x: np.ndarray, level: float) -> np.ndarray:
    """Per row of the last axis: the scale that maps the value of largest magnitude to `level`."""
    imax = np.abs(x).argmax(axis=-1)
    return np.take_along_axis(x, imax[..., None], axis=-1)[..., 0] / level


def _sub_scales(x: np.ndarray, level: float):
    """(nb, n_sub, sub) -> fp16 d, 6-bit signed sub-block scales ls (-32..31) with d*ls ~ the scale that maps
    each sub-block's extreme to `level`, and the effective scales d*ls [nb, n_sub, 1] (Q3_K, IQ4_XS)."""
    scale = _extreme_over(x, level)
    d16 = _f16(np.abs(scale).max(axis=1) / 31.0)
    d = d16.astype(np.float32)
    ls = np.clip(np.round(_safe_div(scale, d[:, None])), -32, 31).astype(np.int64)
    return d16, ls, (d[:, None] * ls)[..., None]


def quantize_q3_k(blocks: np.ndarray) -> np.ndarray:
    nb = blocks.shape[0]
    x = blocks.reshape(nb, 16, 16)
    d16, ls, eff = _sub_scales(x, -4.0)                    # the largest |x| maps to -4
    qv = np.clip(np.round(_safe_div(x, eff)), -4, 3).astype(np.int64).reshape(nb, 256)
    u = qv + 4                                            # 0..7: low 2 bits in qs, bit 2 in hmask
    hbit = (u >> 2).reshape(nb, 8, 32)
    hmask = np.zeros((nb, 32), dtype=np.uint8)
    for k in range(8):
        hmask |= (hbit[:, k, :] << k).astype(np.uint8)
    s = ls + 32                                           # 6-bit
    scales = np.zeros((nb, 12), dtype=np.uint8)
    scales[:, 0:8] = (s[:, 0:8] & 15) | ((s[:, 8:16] & 15) << 4)
    hs = (s >> 4) & 3
    scales[:, 8:12] = hs[:, 0:4] | (hs[:, 4:8] << 2) | (hs[:, 8:12] << 4) | (hs[:, 12:16] << 6)
    return np.concatenate([hmask, _crumbs(u & 3), scales, d16.view(np.uint8).reshape(nb, 2)], axis=1)


# ---- codebook types (IQ4_NL, IQ4_XS, IQ3_S); gguf-py quantizes MXFP4 itself

IQ4_LEVELS = np.array(gguf.quants.IQ4_NL.kvalues, dtype=np.float32)


def _nearest(x: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Index of the level nearest to each x."""
    return np.abs(x[..., None] - levels).argmin(axis=-1)


def _nibbles_32(q: np.ndarray) -> np.ndarray:
    """(..., 32) 4-bit codes -> (..., 16) bytes: elements 0..15 in the low nibbles, 16..31 in the high."""
    return (q[..., :16] | (q[..., 16:] << 4)).astype(np.uint8)


def quantize_iq4_nl(blocks: np.ndarray) -> np.ndarray:
    nb = blocks.shape[0]
    d16 = _f16(_extreme_over(blocks, -127.0))
    q = _nearest(_safe_div(blocks, d16.astype(np.float32)[:, None]), IQ4_LEVELS)
    return np.concatenate([d16.view(np.uint8).reshape(nb, 2), _nibbles_32(q)], axis=1)


def quantize_iq4_xs(blocks: np.ndarray) -> np.ndarray:
    nb = blocks.shape[0]
    x = blocks.reshape(nb, 8, 32)
    d16, ls, eff = _sub_scales(x, -127.0)
    q = _nearest(_safe_div(x, eff), IQ4_LEVELS)
    s = ls + 32                                            # 6 bits: low 4 in scales_l, high 2 in scales_h
    scales_l = ((s[:, 0::2] & 15) | ((s[:, 1::2] & 15) << 4)).astype(np.uint8)
    scales_h = sum(((s[:, j] >> 4) & 3) << (2 * j) for j in range(8)).astype(np.uint16)
    return np.concatenate([d16.view(np.uint8).reshape(nb, 2), scales_h.view(np.uint8).reshape(nb, 2), scales_l,
                           _nibbles_32(q).reshape(nb, 128)], axis=1)


@functools.lru_cache(maxsize=None)
def _iq3s_nearest() -> np.ndarray:
    """For each 4 odd magnitudes (1..15, 3 bits each: key = sum of (m_c - 1) / 2 << 3c) the nearest of
    IQ3_S's 512 grid points."""
    gguf.quants.IQ3_S.init_grid()
    grid = np.asarray(gguf.quants.IQ3_S.grid, dtype=np.float32).reshape(512, 4)
    keys = np.arange(4096)
    tuples = np.stack([2 * ((keys >> (3 * c)) & 7) + 1 for c in range(4)], axis=1).astype(np.float32)
    return ((tuples[:, None, :] - grid[None]) ** 2).sum(axis=2).argmin(axis=1)


def quantize_iq3_s(blocks: np.ndarray) -> np.ndarray:
    """Sub-block factor 1 + 2s (s 0..15) maps each sub-block's largest magnitude to 15; each 4 magnitudes,
    rounded to odd values, take the grid point nearest to those; signs from the values."""
    nb = blocks.shape[0]
    x = blocks.reshape(nb, 8, 32)
    scale = np.abs(x).max(axis=2) / 15.0
    d16 = _f16(scale.max(axis=1) / 31.0)
    d = d16.astype(np.float32)
    s = np.clip(np.round((_safe_div(scale, d[:, None]) - 1) / 2), 0, 15).astype(np.int64)
    mag = _safe_div(np.abs(x), (d[:, None] * (1 + 2 * s))[..., None]).reshape(nb, 64, 4)
    odd = np.clip(np.round((mag - 1) / 2), 0, 7).astype(np.int64)
    idx = _iq3s_nearest()[sum(odd[..., c] << (3 * c) for c in range(4))]          # (nb, 64)
    qh = sum(((idx[:, j::8] >> 8) & 1) << j for j in range(8)).astype(np.uint8)   # bit i%8 of byte i/8
    neg = (x.reshape(nb, 32, 8) < 0).astype(np.int64)
    signs = sum(neg[:, :, j] << j for j in range(8)).astype(np.uint8)
    scales = (s[:, 0::2] | (s[:, 1::2] << 4)).astype(np.uint8)
    return np.concatenate([d16.view(np.uint8).reshape(nb, 2), (idx & 255).astype(np.uint8), qh, signs, scales],
                          axis=1)


_ENCODERS = {"Q2_K": quantize_q2_k, "Q3_K": quantize_q3_k, "Q4_K": quantize_q4_k, "Q5_K": quantize_q5_k,
             "Q6_K": quantize_q6_k, "IQ4_XS": quantize_iq4_xs, "IQ3_S": quantize_iq3_s, "IQ4_NL": quantize_iq4_nl}


def quantize(data: np.ndarray, qtype: str) -> np.ndarray:
    """data [..., n] float -> the GGUF storage array of that type (uint8 blocks, or f32/f16)."""
    data = np.ascontiguousarray(data, dtype=np.float32)
    if qtype in _ENCODERS:
        block, size = gguf.GGML_QUANT_SIZES[QT[qtype]]
        if data.shape[-1] % block:
            raise ValueError(f"{qtype} needs rows that are a multiple of {block}, got {data.shape}")
        out = _ENCODERS[qtype](data.reshape(-1, block))
        assert out.dtype == np.uint8 and out.shape[1] == size
        return out.reshape(*data.shape[:-1], data.shape[-1] // block * size)
    return gguf.quants.quantize(data, QT[qtype])


# --------------------------------------------------------------------------------------------------
# tokenizer
# --------------------------------------------------------------------------------------------------

# merges applied in this order (rank = index); each merged token becomes a vocabulary entry
TOKENIZER_MERGES = [
    "Ġ t", "h e", "Ġ a", "i n", "Ġt he", "e r", "o n", "Ġ s", "r e", "a t", "e n", "Ġ w", "o r",
    "i s", "Ġ o", "e s", "a n", "Ġ c", "l l", "Ġ h", "Ġ b", "Ġ f", "Ġ m", "o u", "i t", "in g",
    "Ġ p", "e d", "Ġ d", "Ġ i", "Ġa n", "Ġan d", "Ġo f", "Ġ l", "e ll", "H ell", "Hell o", "Ġw or",
    "Ġwor l", "Ġworl d", "Ġ 1", "Ġ 2",
]
SPECIAL_TOKENS = ["<s>", "</s>"]


def tokenizer_vocab() -> tuple[list[str], list[int], list[str], int, int]:
    """(tokens, token_types, merges, bos_id, eos_id) of the test tokenizer."""
    tokens = list(bytes_to_unicode().values())
    types = [int(TokenType.NORMAL)] * len(tokens)
    seen = set(tokens)
    for mrg in TOKENIZER_MERGES:
        a, b = mrg.split(" ")
        assert a in seen and b in seen, mrg
        t = a + b
        assert t not in seen, mrg
        tokens.append(t)
        types.append(int(TokenType.NORMAL))
        seen.add(t)
    bos = len(tokens)
    for s in SPECIAL_TOKENS:
        tokens.append(s)
        types.append(int(TokenType.CONTROL))
    return tokens, types, list(TOKENIZER_MERGES), bos, bos + 1


N_VOCAB = len(tokenizer_vocab()[0])


# --------------------------------------------------------------------------------------------------
# the model
# --------------------------------------------------------------------------------------------------

def _qtype_for(role: str, qtype: Any) -> str:
    if isinstance(qtype, str):
        if qtype == "mixed":
            return MIXED.get(role, MIXED["default"])
        return qtype
    if isinstance(qtype, Mapping):
        return qtype.get(role, qtype.get("default", "F32"))
    raise TypeError(qtype)


def _all_qtypes(qtype: Any) -> set[str]:
    if isinstance(qtype, str):
        return set(MIXED.values()) if qtype == "mixed" else {qtype}
    return set(qtype.values())


def default_dims(arch: str, qtype: Any) -> dict:
    """The model's sizes for an arch and qtype (see the module doc)."""
    kq = bool(_all_qtypes(qtype) & set(BLOCK_256))
    d = dict(n_embd=256 if kq else 64, n_head=4, n_head_kv=2, head_dim=64 if kq else 16,
             n_ff=512 if kq else 128, n_layer=2, n_ctx=512, eps=1e-5, rope_base=10000.0)
    if arch == "glm4moe":  # GLM-4.5-Air's shape in small: half the head rotates, 1 dense + 2 MoE layers
        d.update(n_layer=3, eps=1e-5, rope_base=1000000.0)
    if arch == "qwen2":
        d.update(eps=1e-6, rope_base=1000000.0)
    if arch == "smollm3":  # 4 layers: the last is position-free (llama.cpp's NoPE step 4)
        d.update(n_layer=4, rope_base=5000000.0)
    if arch == "gpt-oss":  # gpt-oss-20b's shape in small: layer 0 local, YaRN x32 on every layer
        d.update(head_dim=128 if kq else 32, rope_base=150000.0, sliding_window=8,
                 rope_scaling={"type": "yarn", "factor": 32.0, "original_context": 16})
    if arch in ("qwen3", "qwen3moe"):  # n_head * head_dim != n_embd, as in the real Qwen3 files (0.6B: 16 x 128 vs 1024)
        d.update(head_dim=128 if kq else 32, eps=1e-6, rope_base=1000000.0)
    if arch == "gemma3":
        d.update(head_dim=128 if kq else 32, n_layer=6, eps=1e-6, rope_base=1000000.0, sliding_window=8)
    if arch == "gemma2":  # 4 layers: 0 and 2 local; the real files' soft-caps
        d.update(n_layer=4, eps=1e-6, sliding_window=8, attn_softcap=50.0, final_softcap=30.0)
    if arch == "mistral3":  # Ministral 3's YaRN and attention temperature, the original context cut to 16 so
        # that the ramp and the temperature (positions >= 16) show in a short prompt
        d.update(rope_base=1000000.0, rope_scaling={"type": "yarn", "factor": 16.0, "original_context": 16},
                 attn_temperature=0.1)
    if arch == "phi3":  # Phi-4-mini's shape in small: 3/4 of each head rotates, LongRoPE past an original 256
        d.update(rope_scaling={"type": "longrope", "factor": 1.0, "original_context": 256, "attn_factor": 1.19})
    if arch == "granite":  # Granite 3's multipliers, scaled to this size
        d.update(embedding_scale=4.0, residual_scale=0.5, logit_scale=2.0, attention_scale=0.1)
    if arch in hybrid.ARCHS:  # Qwen3.5: 3 Gated DeltaNet layers, then full attention (model_factory_hybrid.py)
        d.update(hybrid.hybrid_dims(kq))
    if arch in lfm2.ARCHS:  # LFM2: gated short convs and one attention layer (model_factory_lfm2.py)
        d.update(lfm2.lfm2_dims(kq))
    return d


MOE_KEYS = ("n_expert", "n_used", "n_ff", "n_shared", "dense_lead", "gating", "norm", "scale", "select_bias", "biases",
            "shared_gate")


def moe_config(arch: str, qtype: Any, moe: Mapping | None) -> dict | None:
    """The MoE sizes of a model (None: dense), defaults overridden by ``moe``."""
    if moe is None and arch not in MOE_ARCHS:
        return None
    unknown = set(moe or {}) - set(MOE_KEYS)
    if unknown:
        raise TypeError(f"unknown moe keys {unknown}")
    kq = bool(_all_qtypes(qtype) & set(BLOCK_256))
    cfg = dict(n_expert=8, n_used=2, n_ff=256 if kq else 64, n_shared=0, dense_lead=0, gating=None, norm=None,
               scale=None, select_bias=False, biases=False, shared_gate=False)
    if arch == "glm4moe":  # as the GLM-4.5 files: sigmoid routing with a choosing bias, one shared expert
        cfg.update(n_shared=1, dense_lead=1, gating=2, norm=True, scale=2.5, select_bias=True)
    if arch == "gpt-oss":  # router and expert biases (the routing kind is the architecture's: no key)
        cfg.update(biases=True)
    if arch == "qwen35moe":  # one shared expert (no count key: the architecture's), its output sigmoid-gated
        cfg.update(n_shared=1, shared_gate=True)
    if arch == "lfm2moe":  # as the LFM2-8B-A1B file: leading dense layers, sigmoid routing with a choosing bias
        cfg.update(dense_lead=1, gating=2, select_bias=True)
    cfg.update(moe or {})
    return cfg


def _add_experts(add, rng, p: str, n_embd: int, moe: dict) -> None:
    """One MoE layer's tensors: router, experts (3-D), optional choosing bias and shared experts."""
    n_exp, f = moe["n_expert"], moe["n_ff"]

    def experts(n_out: int, n_in: int) -> np.ndarray:
        return (rng.standard_normal((n_exp, n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    add(p + "ffn_gate_inp.weight", (4.0 * rng.standard_normal((n_exp, n_embd)) / np.sqrt(n_embd)).astype(np.float32))
    add(p + "ffn_gate_exps.weight", experts(f, n_embd), "ffn_gate_exps")
    add(p + "ffn_up_exps.weight", experts(f, n_embd), "ffn_up_exps")
    add(p + "ffn_down_exps.weight", experts(n_embd, f), "ffn_down_exps")
    if moe["select_bias"]:
        add(p + "exp_probs_b.bias", (0.3 * rng.standard_normal(n_exp)).astype(np.float32))
    if moe["biases"]:  # gpt-oss: the router's and each expert's
        add(p + "ffn_gate_inp.bias", (0.5 * rng.standard_normal(n_exp)).astype(np.float32))
        for name, width in (("ffn_gate_exps", f), ("ffn_up_exps", f), ("ffn_down_exps", n_embd)):
            add(p + name + ".bias", (0.3 * rng.standard_normal((n_exp, width))).astype(np.float32))
    if moe["n_shared"]:
        fs = moe["n_shared"] * f
        add(p + "ffn_gate_shexp.weight", (rng.standard_normal((fs, n_embd)) / np.sqrt(n_embd)).astype(np.float32), "ffn_gate")
        add(p + "ffn_up_shexp.weight", (rng.standard_normal((fs, n_embd)) / np.sqrt(n_embd)).astype(np.float32), "ffn_up")
        add(p + "ffn_down_shexp.weight", (rng.standard_normal((n_embd, fs)) / np.sqrt(fs)).astype(np.float32), "ffn_down")
    if moe["shared_gate"]:
        add(p + "ffn_gate_inp_shexp.weight", (rng.standard_normal(n_embd) / np.sqrt(n_embd)).astype(np.float32))


def _write_moe_keys(w: GGUFWriter, moe: dict) -> None:
    w.add_expert_count(moe["n_expert"])
    w.add_expert_used_count(moe["n_used"])
    w.add_expert_feed_forward_length(moe["n_ff"])
    if moe["n_shared"]:
        if not moe["shared_gate"]:  # qwen35moe's files have no count: one, the architecture's
            w.add_expert_shared_count(moe["n_shared"])
        w.add_expert_shared_feed_forward_length(moe["n_ff"])
    if moe["dense_lead"]:
        w.add_leading_dense_block_count(moe["dense_lead"])
    if moe["gating"] is not None:  # 3 (softmax over the chosen, gpt-oss) has no name in gguf-py's enum
        w.add_uint32(gguf.Keys.LLM.EXPERT_GATING_FUNC.format(arch=w.arch), int(moe["gating"]))
    if moe["norm"] is not None:
        w.add_expert_weights_norm(bool(moe["norm"]))
    if moe["scale"] is not None:
        w.add_expert_weights_scale(float(moe["scale"]))


def _rope_dim(arch: str, hd: int) -> int:
    return hd * 3 // 4 if arch == "phi3" else hd


def _write_rope_scaling(w: GGUFWriter, cfg: dict) -> None:
    """rope_scaling {type, factor, original_context, attn_factor, log_mul} and attn_temperature: llama.cpp's keys."""
    rs = cfg.get("rope_scaling")
    if rs:
        w.add_string(f"{w.arch}.rope.scaling.type", rs["type"])
        w.add_float32(f"{w.arch}.rope.scaling.factor", float(rs["factor"]))
        if "original_context" in rs:
            w.add_uint32(f"{w.arch}.rope.scaling.original_context_length", int(rs["original_context"]))
        if "attn_factor" in rs:
            w.add_float32(f"{w.arch}.rope.scaling.attn_factor", float(rs["attn_factor"]))
        if "log_mul" in rs:
            w.add_float32(f"{w.arch}.rope.scaling.yarn_log_multiplier", float(rs["log_mul"]))
    if cfg.get("attn_temperature"):
        w.add_float32(f"{w.arch}.attention.temperature_scale", float(cfg["attn_temperature"]))


def _write_multipliers(w: GGUFWriter, arch: str, cfg: dict) -> None:
    """gemma2's soft-caps, granite's scales: llama.cpp's key names."""
    if arch == "gemma2":
        w.add_float32(f"{arch}.attn_logit_softcapping", float(cfg["attn_softcap"]))
        w.add_float32(f"{arch}.final_logit_softcapping", float(cfg["final_softcap"]))
    if arch == "granite":
        w.add_float32(f"{arch}.embedding_scale", float(cfg["embedding_scale"]))
        w.add_float32(f"{arch}.residual_scale", float(cfg["residual_scale"]))
        w.add_float32(f"{arch}.logit_scale", float(cfg["logit_scale"]))
        w.add_float32(f"{arch}.attention.scale", float(cfg["attention_scale"]))


def _write_rerank_keys(w: GGUFWriter, template: str | None) -> None:
    """What llama.cpp's converter writes for Qwen3-Reranker: pooling RANK and the query/document template."""
    w.add_pooling_type(gguf.PoolingType.RANK)
    if template is not None:
        w.add_string("tokenizer.chat_template.rerank", template)


def _add_hybrid_layer(add, rng, mat, norm, il: int, cfg: dict, moe_cfg: dict | None, own) -> None:
    """Layer il of a hybrid: its module's (model_factory_hybrid / _lfm2) mixer, then a dense or MoE FFN."""
    p, E, F = f"blk.{il}.", cfg["n_embd"], cfg["n_ff"]
    own.add_layer(add, rng, mat, norm, il, cfg)
    if moe_cfg and il >= moe_cfg["dense_lead"]:
        _add_experts(add, rng, p, E, moe_cfg)
        return
    add(p + "ffn_gate.weight", mat(F, E), "ffn_gate")
    add(p + "ffn_up.weight", mat(F, E), "ffn_up")
    add(p + "ffn_down.weight", mat(E, F), "ffn_down")


def _add_nextn(add, mat, norm, p: str, n_embd: int) -> None:
    """An MTP (NextN) block's own tensors (llama.cpp's names; Qwen3.5's mtp.fc, pre_fc_norm_embedding,
    pre_fc_norm_hidden and norm): the projection of [normed embedding ; normed state], their norms, the head's."""
    add(p + "nextn.eh_proj.weight", mat(n_embd, 2 * n_embd), "attn_q")
    for part in ("enorm", "hnorm", "shared_head_norm"):
        add(p + f"nextn.{part}.weight", norm(n_embd))


def _echo_mtp(tensors: list, p: str, n_embd: int) -> list:
    """The MTP block p as write_test_model's mtp="echo" says: eh_proj = [I | 0], its outputs' weights zero."""
    def echo(name: str, data: np.ndarray) -> np.ndarray:
        if name == p + "nextn.eh_proj.weight":
            return np.hstack([np.eye(n_embd), np.zeros((n_embd, n_embd))]).astype(np.float32)
        if name.startswith(p) and name.split(".")[2] in ("attn_output", "ffn_down", "ffn_down_exps", "ffn_down_shexp"):
            return np.zeros_like(data)
        return data
    return [(name, echo(name, data), role) for name, data, role in tensors]


def write_test_model(path: str | os.PathLike, arch: str, *, qtype: Any = "F32", rope_freqs: bool = False,
                     tied: bool | None = None, seed: int = 0, biases: bool | None = None,
                     chat_template: str | None = None, name: str | None = None, moe: Mapping | None = None,
                     rerank: int = 0, rerank_template: str | None = None, rerank_bias: bool = False,
                     vocab: Mapping[str, Any] | None = None, drop: tuple[str, ...] = (),
                     keys: Mapping[str, Any] | None = None, mtp: bool | str = False, **dims: Any) -> Path:
    """Write a random ``arch`` model to ``path`` and return the path.

    biases: q/k/v biases (default: True for qwen2, which requires them; False otherwise; llama may
    have them, gemma3 not). rope_freqs: llama only (llama3-style frequency factors). dims: override
    default_dims() (n_embd, n_head, n_head_kv, head_dim, n_ff, n_layer, n_ctx, eps, rope_base,
    sliding_window). rerank: rows of a reranker's classifier head cls.output.weight (Qwen3-Reranker: 2, its
    "yes" and "no" rows) with pooling_type RANK, 0 = none; rerank_template: its tokenizer.chat_template.rerank;
    rerank_bias: the head's cls.output.bias too.
    vocab: ``tokenizer.ggml.*`` metadata (key -> value, e.g. a vocabulary of tests/data/vocab
    read by gguf_vocab.vocab_meta) written in place of the built-in byte-level vocabulary.
    drop: tensor names or metadata keys left out of the file (an inconsistent file, for the loader's errors).
    keys: more metadata (key -> bool, int, str or list), e.g. ``{"lfm2.attention.causal": False}``.
    mtp: qwen35 / qwen35moe: a multi-token-prediction block after the layers, as Qwen3.5/3.6 files carry it
    (a gated attention layer, its FFN, then its nextn tensors; glm4moe always has one). mtp="echo": one that
    guesses the token it is given comes again (its projection passes the normed embedding alone, its layer
    adds nothing, the head is tied), so a target that repeats a token has its MTP drafts accepted.
    """
    if arch not in ARCHS:
        raise ValueError(f"arch must be one of {ARCHS}")
    if arch == "gemma4":  # its own shapes and options: model_factory_gemma4.py
        tied = True if tied is None else tied
        from .model_factory_gemma4 import write_gemma4
        if rope_freqs or biases or moe or rerank or drop or keys:
            raise ValueError("gemma4 test models take none of rope_freqs, biases, moe, rerank, drop, keys")
        return write_gemma4(path, qtype=qtype, seed=seed, tied=tied, name=name, chat_template=chat_template,
                            vocab=vocab, **dims)
    if tied is None:  # llama.cpp requires output.weight of these (their real files are untied)
        tied = arch not in UNTIED_ARCHS or mtp == "echo"
    if mtp and arch not in hybrid.ARCHS:
        raise ValueError("mtp: a qwen35 / qwen35moe option (glm4moe files always carry their NextN block)")
    if rope_freqs and arch != "llama":
        raise ValueError("rope_freqs.weight is a llama tensor (llama.cpp would reject it for " + arch + ")")
    if biases is None:
        biases = arch in ("qwen2", "glm4moe", "gpt-oss")
    if biases and arch in ("gemma2", "gemma3", "qwen3", "qwen3moe"):
        raise ValueError(f"{arch} has no attention biases")
    for t in _all_qtypes(qtype):
        if t not in ALL_QTYPES:
            raise ValueError(f"unsupported qtype {t}")
    cfg = default_dims(arch, qtype)
    unknown = set(dims) - set(cfg) - {"sliding_window", "attn_softcap", "final_softcap", "rope_scaling", "attn_temperature"}
    if unknown:
        raise TypeError(f"unknown dims {unknown}")
    cfg.update(dims)
    n_embd, n_head, n_head_kv, hd = cfg["n_embd"], cfg["n_head"], cfg["n_head_kv"], cfg["head_dim"]
    n_ff, n_layer = cfg["n_ff"], cfg["n_layer"]
    moe_cfg = moe_config(arch, qtype, moe)
    if arch == "llama" and moe_cfg and "n_ff" not in (moe or {}):  # Mixtral: experts as wide as the FFN (no key)
        moe_cfg["n_ff"] = n_ff

    n_vocab = len((vocab or default_vocab())["tokenizer.ggml.tokens"])
    rng = np.random.default_rng(seed)

    def mat(n_out: int, n_in: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in)) * scale / np.sqrt(n_in)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    tensors: list[tuple[str, np.ndarray, str]] = []   # name, float data, role (for the qtype)

    def add(name: str, data: np.ndarray, role: str | None = None) -> None:
        tensors.append((name, data, role))

    # logits = (normed x * output_norm) . (E or output) row: std ~3. Gemma scales the embedding by
    # sqrt(n_embd); its embedding is made smaller (x starts at rms 3/sqrt(n_embd) as llama's, so the
    # input token does not dominate the residual and the tied logits) and its output_norm larger
    # (sqrt(n_embd): 8 or 16; the real file's output_norm weights are ~26 on average).
    emb_std = 3.0 / n_embd if arch in GEMMAS else 3.0 / np.sqrt(n_embd)
    out_norm_scale = float(np.sqrt(n_embd)) if arch in GEMMAS else 1.0
    if arch == "granite":  # its embedding multiplier restores the input's scale, output_norm the logits'
        emb_std /= cfg["embedding_scale"]
        out_norm_scale = cfg["embedding_scale"] * cfg["logit_scale"]
    add("token_embd.weight", (rng.standard_normal((n_vocab, n_embd)) * emb_std).astype(np.float32), "token_embd")
    n_mtp = int(arch == "glm4moe" or bool(mtp))
    for il in range(n_layer + n_mtp):  # an MTP (NextN) block: a whole layer, then its own tensors
        p = f"blk.{il}."
        if arch in hybrid.ARCHS + lfm2.ARCHS:  # their own mixers; Qwen3.5's MTP layer is an attention one
            own = {**cfg, "full_attention_interval": il + 1} if il == n_layer else cfg
            _add_hybrid_layer(add, rng, mat, norm, il, own, moe_cfg, hybrid if arch in hybrid.ARCHS else lfm2)
            if il == n_layer:
                _add_nextn(add, mat, norm, p, n_embd)
            continue
        if arch != "olmo2":
            add(p + "attn_norm.weight", norm(n_embd))
        q, k, v = mat(n_head * hd, n_embd), mat(n_head_kv * hd, n_embd), mat(n_head_kv * hd, n_embd)
        if arch == "phi3":  # one fused tensor: q's rows, then k's, then v's
            add(p + "attn_qkv.weight", np.concatenate([q, k, v]), "attn_q")
        else:
            add(p + "attn_q.weight", q, "attn_q")
            add(p + "attn_k.weight", k, "attn_k")
            add(p + "attn_v.weight", v, "attn_v")
        if biases:
            add(p + "attn_q.bias", (0.5 * rng.standard_normal(n_head * hd)).astype(np.float32))
            add(p + "attn_k.bias", (0.5 * rng.standard_normal(n_head_kv * hd)).astype(np.float32))
            add(p + "attn_v.bias", (0.5 * rng.standard_normal(n_head_kv * hd)).astype(np.float32))
        if arch in ("gemma3", "qwen3", "qwen3moe"):
            add(p + "attn_q_norm.weight", norm(hd))
            add(p + "attn_k_norm.weight", norm(hd))
        if arch == "olmo2":  # over the whole projection
            add(p + "attn_q_norm.weight", norm(n_head * hd))
            add(p + "attn_k_norm.weight", norm(n_head_kv * hd))
        add(p + "attn_output.weight", mat(n_embd, n_head * hd), "attn_output")
        if arch == "gpt-oss":  # the output's bias and a sink logit per head
            add(p + "attn_output.bias", (0.3 * rng.standard_normal(n_embd)).astype(np.float32))
            add(p + "attn_sinks.weight", (1.0 + rng.standard_normal(n_head)).astype(np.float32))
        if arch in GEMMAS + ("olmo2",):
            add(p + "post_attention_norm.weight", norm(n_embd))
        if arch != "olmo2":
            ffn_norm = "post_attention_norm" if arch in ("glm4moe", "gpt-oss") else "ffn_norm"
            add(p + ffn_norm + ".weight", norm(n_embd))
        if moe_cfg and il >= moe_cfg["dense_lead"]:
            _add_experts(add, rng, p, n_embd, moe_cfg)
        else:
            gate, up = mat(n_ff, n_embd), mat(n_ff, n_embd)
            if arch == "phi3":  # SwiGLU's gate and up in one tensor, the gate first
                add(p + "ffn_up.weight", np.concatenate([gate, up]), "ffn_up")
            else:
                add(p + "ffn_gate.weight", gate, "ffn_gate")
                add(p + "ffn_up.weight", up, "ffn_up")
            add(p + "ffn_down.weight", mat(n_embd, n_ff), "ffn_down")
        if arch in GEMMAS + ("olmo2",):
            add(p + "post_ffw_norm.weight", norm(n_embd))
        if il == n_layer:
            _add_nextn(add, mat, norm, p, n_embd)
    add(("token_embd_norm" if arch in lfm2.ARCHS else "output_norm") + ".weight", out_norm_scale * norm(n_embd))
    if not tied:
        add("output.weight", (rng.standard_normal((n_vocab, n_embd)) * emb_std).astype(np.float32), "output")
    if rerank:  # drawn last: the other tensors stay those of the same seed without a head
        add("cls.output.weight", mat(rerank, n_embd, 4.0))
        if rerank_bias:
            add("cls.output.bias", rng.standard_normal(rerank).astype(np.float32))
    if rope_freqs:
        # llama3-style: factor 1 for the high frequencies, up to 8 for the low ones
        half = hd // 2
        add("rope_freqs.weight", np.geomspace(1.0, 8.0, half).astype(np.float32))
    if arch == "phi3":  # LongRoPE's two sets: mild for contexts within the original, strong past it
        half = _rope_dim(arch, hd) // 2
        add("rope_factors_short.weight", np.geomspace(1.0, 1.5, half).astype(np.float32))
        add("rope_factors_long.weight", np.geomspace(1.0, 16.0, half).astype(np.float32))

    if mtp == "echo":
        tensors = _echo_mtp(tensors, f"blk.{n_layer}.", n_embd)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(str(path), arch)
    w.add_name(name or f"pyserve test {arch} {qtype if isinstance(qtype, str) else 'custom'}")
    w.add_context_length(int(cfg["n_ctx"]))
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer + n_mtp)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(lfm2.kv_heads(cfg) if arch in lfm2.ARCHS else n_head_kv)
    w.add_layer_norm_rms_eps(float(cfg["eps"]))
    w.add_rope_freq_base(float(cfg["rope_base"]))
    if arch in GEMMAS or hd * n_head != n_embd:
        w.add_key_length(hd)
        w.add_value_length(hd)
    if arch in ("llama", "smollm3", "granite", "mistral3", "phi3") + lfm2.ARCHS:
        w.add_rope_dimension_count(_rope_dim(arch, hd))
        w.add_vocab_size(n_vocab)
    if arch == "glm4moe":
        w.add_rope_dimension_count(hd // 2)
    if n_mtp:
        w.add_nextn_predict_layers(n_mtp)
    if moe_cfg:
        _write_moe_keys(w, moe_cfg)
    if arch in hybrid.ARCHS:
        hybrid.write_keys(w, cfg)
    if arch in lfm2.ARCHS:
        lfm2.write_keys(w, cfg)
    if (arch in GEMMAS + ("gpt-oss",) + lfm2.ARCHS) and cfg.get("sliding_window"):
        w.add_sliding_window(int(cfg["sliding_window"]))
    _write_multipliers(w, arch, cfg)
    _write_rope_scaling(w, cfg)
    if isinstance(qtype, str) and qtype in FILE_TYPES:
        w.add_file_type(FILE_TYPES[qtype])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)

    _write_vocab(w, vocab or default_vocab())
    _write_keys(w, keys or {})
    if chat_template is not None:
        w.add_chat_template(chat_template)
    if rerank:
        _write_rerank_keys(w, rerank_template)

    for key in set(drop) & set(w.kv_data[0]):
        del w.kv_data[0][key]
    for tname, data, role in tensors:
        if tname in drop:
            continue
        t = "F32" if role is None else _qtype_for(role, qtype)
        if t == "F32":
            w.add_tensor(tname, data)
        elif t == "F16":
            w.add_tensor(tname, data.astype(np.float16))
        else:
            w.add_tensor(tname, quantize(data, t), raw_dtype=QT[t])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def default_vocab() -> dict:
    """The test models' own byte-level BPE vocabulary (tokenizer_vocab) as GGUF tokenizer metadata."""
    tokens, types, merges, bos, eos = tokenizer_vocab()
    return {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "gpt-2", "tokenizer.ggml.tokens": tokens,
            "tokenizer.ggml.token_type": types, "tokenizer.ggml.merges": merges, "tokenizer.ggml.bos_token_id": bos,
            "tokenizer.ggml.eos_token_id": eos, "tokenizer.ggml.add_bos_token": True,
            "tokenizer.ggml.add_eos_token": False}


def _write_vocab(w: GGUFWriter, vocab: Mapping[str, Any]) -> None:
    """The tokenizer.ggml.* keys, each with the GGUF type llama.cpp reads it as (ids uint32, types int32)."""
    _write_keys(w, {k: v for k, v in vocab.items() if k.startswith("tokenizer.ggml.")})


def _write_keys(w: GGUFWriter, keys: Mapping[str, Any]) -> None:
    """Metadata keys by their Python type: bool, uint32, string, or an array."""
    for key, v in keys.items():
        if isinstance(v, bool):
            w.add_bool(key, v)
        elif isinstance(v, int):
            w.add_uint32(key, v)
        elif isinstance(v, str):
            w.add_string(key, v)
        else:
            w.add_array(key, list(v))


__all__ = ["write_test_model", "default_dims", "moe_config", "MOE_ARCHS", "tokenizer_vocab", "bytes_to_unicode", "quantize",
           "ARCHS", "ALL_QTYPES", "K_QUANTS", "BLOCK_256", "BLOCK_32", "FLOAT_TYPES", "N_VOCAB", "MIXED"]


def patch_tensor_type(path: str | os.PathLike, name: str, type_id: int) -> None:
    """Rewrite the GGML type id of tensor ``name`` in a GGUF file's tensor table (in place), e.g. to a type
    the engine does not support."""
    data = bytearray(Path(path).read_bytes())
    key = struct.pack("<Q", len(name)) + name.encode()
    at = data.rindex(key) + len(key)
    n_dims = struct.unpack_from("<I", data, at)[0]
    struct.pack_into("<I", data, at + 4 + 8 * n_dims, type_id)
    Path(path).write_bytes(bytes(data))


def write_all_types_gguf(path) -> Path:
    """A small valid GGUF holding every metadata value type (nested arrays too) and three tensors: the
    seed of the GGUF loader's tests and of its fuzzer."""
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_uint8("t.u8", 200)
    w.add_int8("t.i8", -100)
    w.add_uint16("t.u16", 60000)
    w.add_int16("t.i16", -30000)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -2_000_000_000)
    w.add_float32("t.f32", 1.5)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo ▁ world")
    w.add_uint64("t.u64", 2**63 + 5)
    w.add_int64("t.i64", -(2**62))
    w.add_float64("t.f64", 0.1)
    w.add_array("t.arr_i", [1, 2, 3])
    w.add_array("t.arr_s", ["a", "bc", ""])
    w.add_array("t.arr_f", [0.5, -2.0])
    w.add_array("t.arr_nested", [[1, 2], [3]])
    w.add_tensor("blk.0.attn_q.weight", np.arange(64, dtype=np.float32).reshape(2, 32))
    w.add_tensor("second", np.ones((4,), dtype=np.float32))
    w.add_tensor("q8", np.zeros((2, 34), dtype=np.uint8), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)


def assert_decode_is_prefill_argmax(eng, prompts: list, n_new: int) -> None:
    """Greedy decoding (one token a step, K/V read back from the paged cache, the prompts batched) picks what
    one prefill of the whole text would: the argmax of its logits at each position, and the same tokens alone
    as batched. `eng`: an engine with nothing running."""
    def run(ids: list) -> dict:
        for i, p in enumerate(ids):
            eng.add(f"r{i}", prompts[p], {"temperature": 0.0}, n_new, True)
        out: dict = {}
        while eng.has_work():
            for o in eng.step():
                out.setdefault(ids[int(o.request_id[1:])], []).append(o.token)
        return out

    every = list(range(len(prompts)))
    batched, alone = run(every), {p: run([p])[p] for p in every}
    assert batched == alone
    for p, gen in batched.items():
        text = prompts[p] + gen
        assert eng.prompt_logits(text[:-1])[len(prompts[p]) - 1:].argmax(axis=1).tolist() == gen
