"""The NumPy reference of the hybrid Qwen3.5 layers (llama.cpp: src/models/qwen35.cpp, delta-net-base.cpp).

Three of every four layers (``(il + 1) % full_attention_interval != 0``, or the file's
``attention.recurrent_layers``) are Gated DeltaNet linear attention, computed here TOKEN BY TOKEN in the
activations' dtype (float64 by default), the exact recurrence an engine's chunked kernel must match:

* qkv = attn_qkv(h) [conv_dim = 2·key_dim + value_dim], z = attn_gate(h) [value_dim];
  beta = sigmoid(ssm_beta(h)) [H_v]; g = softplus(ssm_alpha(h) + ssm_dt.bias) · ssm_a [H_v] (ssm_a = -exp(A_log)).
* a causal depthwise conv of width d_conv over qkv (state: the previous d_conv - 1 inputs, zeros at the start),
  then SiLU; split into q [H_k, S], k [H_k, S], v [H_v, S]; q and k L2-normed per head (x / sqrt(Σx² + eps));
  value head h uses key head h % H_k (ggml's repeat, tile-wise).
* per value head a state M [S_v, S_k] (zero at the start): M ← M·exp(g); d = beta·(v - M k); M ← M + d kᵀ;
  o = M q / sqrt(S_k).
* o RMS-normed per head by ssm_norm, times SiLU(z); ssm_out(o).

The fourth is full attention: attn_q gives [H, 2·hd] per head (query, then a gate), q/k RMS-normed per head,
NeoX RoPE on the first rope.dimension_count dims (M-RoPE with text positions: every section sees the token's
position, which is plain RoPE), causal GQA, the output times sigmoid(gate), attn_output. Every layer's FFN
input norm is post_attention_norm. qwen35moe: the same with a MoE FFN (softmax routing, renormalised) and a
shared expert whose output is multiplied by sigmoid(ffn_gate_inp_shexp · h).
"""
from __future__ import annotations

import numpy as np

ARCHS = ("qwen35", "qwen35moe")


def read_hybrid(hp, key) -> None:
    """The DeltaNet sizes and the layer kinds into hp.extra; refuses M-RoPE sections text would not reduce."""
    e = hp.extra
    e["d_conv"] = int(key("ssm.conv_kernel", required=True))
    e["d_inner"] = int(key("ssm.inner_size", required=True))
    e["d_state"] = int(key("ssm.state_size", required=True))
    e["n_group"] = int(key("ssm.group_count", required=True))
    e["dt_rank"] = int(key("ssm.time_step_rank", required=True))
    rec = key("attention.recurrent_layers", None)
    if rec is not None:
        e["recurrent"] = [bool(v) for v in rec][:hp.n_layer]
    else:
        interval = int(key("full_attention_interval", 4))
        e["recurrent"] = [(il + 1) % interval != 0 for il in range(hp.n_layer)]
    sections = [int(v) for v in key("rope.dimension_sections", [0, 0, 0, 0])]
    if text_rope_pairs_unrotated(sections, hp.n_rot):
        raise NotImplementedError(f"rope.dimension_sections {sections} leave pairs at position 0 for text")


def text_rope_pairs_unrotated(sections: list, n_rot: int) -> list:
    """The rotated pairs that ggml's interleaved M-RoPE gives the 4th (always 0 for text) position."""
    sect = sum(sections[:4])
    if sect == 0:
        return []
    out = []
    for i in range(n_rot // 2):
        s = i % sect
        if not ((s % 3 == 0 and s < 3 * sections[0]) or (s % 3 == 1 and s < 3 * sections[1])
                or (s % 3 == 2 and s < 3 * sections[2])):
            out.append(i)
    return out


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _l2(x, eps):
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def delta_net(m, hp, p: str, h: np.ndarray, mm) -> np.ndarray:
    """The DeltaNet mixer of the normed rows h [T, n_embd] of one sequence from position 0 -> [T, n_embd]."""
    e = hp.extra
    T, S, Hk, Hv = h.shape[0], e["d_state"], e["n_group"], e["dt_rank"]
    Sv = e["d_inner"] // Hv
    qkv = mm(h, p + "attn_qkv")
    z = mm(h, p + "attn_gate").reshape(T, Hv, Sv)
    beta = 1.0 / (1.0 + np.exp(-mm(h, p + "ssm_beta")))
    a = mm(h, p + "ssm_alpha") + m.weight(p + "ssm_dt.bias")
    g = np.logaddexp(0.0, a) * m.weight(p + "ssm_a")          # softplus · (-exp(A_log))
    w = m.weight(p + "ssm_conv1d.weight").astype(h.dtype)    # [conv_dim, d_conv]
    K = w.shape[1]
    padded = np.concatenate([np.zeros((K - 1, qkv.shape[1]), dtype=h.dtype), qkv])
    conv = _silu(np.stack([(padded[t:t + K] * w.T).sum(axis=0) for t in range(T)]))
    q = _l2(conv[:, :Hk * S].reshape(T, Hk, S), hp.eps)
    k = _l2(conv[:, Hk * S:2 * Hk * S].reshape(T, Hk, S), hp.eps)
    v = conv[:, 2 * Hk * S:].reshape(T, Hv, Sv)
    M = np.zeros((Hv, Sv, S), dtype=h.dtype)
    o = np.empty((T, Hv, Sv), dtype=h.dtype)
    for t in range(T):
        for hv in range(Hv):
            kk, qq = k[t, hv % Hk], q[t, hv % Hk]
            M[hv] *= np.exp(g[t, hv])
            d = beta[t, hv] * (v[t, hv] - M[hv] @ kk)
            M[hv] += np.outer(d, kk)
            o[t, hv] = (M[hv] @ qq) / np.sqrt(S)
    o = _rms(o, m.weight(p + "ssm_norm.weight"), hp.eps) * _silu(z)
    return mm(o.reshape(T, Hv * Sv), p + "ssm_out")


def gated_attention(m, hp, p: str, h: np.ndarray, pos: np.ndarray, mm, rope, attention, mask) -> np.ndarray:
    """Qwen3.5's full-attention mixer of the normed rows h [T, n_embd] -> [T, n_embd]."""
    T, H, Hkv, hd = h.shape[0], hp.n_head, hp.n_head_kv, hp.head_dim_k
    qg = mm(h, p + "attn_q").reshape(T, H, 2 * hd)
    q, gate = qg[..., :hd], qg[..., hd:].reshape(T, H * hd)
    k = mm(h, p + "attn_k").reshape(T, Hkv, hd)
    v = mm(h, p + "attn_v").reshape(T, Hkv, hd)
    q = _rms(q, m.weight(p + "attn_q_norm.weight"), hp.eps)
    k = _rms(k, m.weight(p + "attn_k_norm.weight"), hp.eps)
    q = rope(q, pos, hp.n_rot, hp.rope_base, hp.rope_freq_scale, hp.rope_type)
    k = rope(k, pos, hp.n_rot, hp.rope_base, hp.rope_freq_scale, hp.rope_type)
    a = attention(q, k, v, mask, hp.attn_scale) * (1.0 / (1.0 + np.exp(-gate)))
    return mm(a, p + "attn_output")
