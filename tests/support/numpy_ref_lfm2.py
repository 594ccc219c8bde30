"""The NumPy reference of LFM2's layers (llama.cpp: src/models/lfm2.cpp, lfm2moe.cpp).

A layer whose ``attention.head_count_kv`` entry is 0 is a gated short convolution, computed here token by token
in the activations' dtype (float64 by default):

* [B | C | x] = shortconv.in_proj(h) [3·n_embd]: B the first n_embd rows, then C, then x;
* u = B ⊙ x; a causal depthwise conv of width ``shortconv.l_cache`` over u (its taps ``shortconv.conv``
  [n_embd, L], tap 0 the oldest input; zeros before the first token), no bias, no activation;
* y = C ⊙ conv(u); shortconv.out_proj(y).

The other layers are qwen3's attention (per-head q/k RMS norms, NeoX RoPE, GQA over the layer's KV heads; with
``attention.sliding_window`` each of them attends over that window, at the global RoPE); every
layer's FFN input norm is ffn_norm, the final norm token_embd_norm. lfm2moe: MoE FFNs after the
leading_dense_block_count dense layers, routed as its file says (sigmoid, with exp_probs_b), renormalised.
"""
from __future__ import annotations

import numpy as np

ARCHS = ("lfm2", "lfm2moe")


def read_lfm2(hp, key) -> None:
    """The conv width and the per-layer kinds (from the head_count_kv array) into hp.extra; with
    attention.sliding_window, every attention layer slides (at the global RoPE base and scaling)."""
    kv = key("attention.head_count_kv", required=True)
    kv = [int(v) for v in kv] if isinstance(kv, (list, tuple)) else [int(kv)] * hp.n_layer
    hp.extra.update(l_cache=int(key("shortconv.l_cache", required=True)), conv=[v == 0 for v in kv[:hp.n_layer]])
    n_swa = int(key("attention.sliding_window", 0) or 0)
    if n_swa > 0:
        hp.layer_swa = [None if conv else n_swa for conv in hp.extra["conv"]]
        hp.swa_rope_scaled = True
    if hp.moe is not None:  # lfm2moe's graph: always renormalised, never scaled (whatever the file says)
        hp.moe.norm, hp.moe.scale = True, 1.0


def n_head_kv(key) -> int:
    """The attention layers' KV heads: the head_count_kv array's nonzero entries, which must agree."""
    kv = key("attention.head_count_kv", required=True)
    heads = {int(v) for v in (kv if isinstance(kv, (list, tuple)) else [kv])} - {0}
    if len(heads) != 1:
        raise NotImplementedError(f"attention.head_count_kv {kv}: the attention layers must agree")
    return heads.pop()


def short_conv(m, hp, p: str, h: np.ndarray, mm) -> np.ndarray:
    """The short-conv mixer of the normed rows h [T, n_embd] of one sequence from position 0 -> [T, n_embd]."""
    T, E = h.shape
    bcx = mm(h, p + "shortconv.in_proj")
    b, c, x = bcx[:, :E], bcx[:, E:2 * E], bcx[:, 2 * E:]
    w = m.weight(p + "shortconv.conv.weight").astype(h.dtype)  # [n_embd, L]
    L = hp.extra["l_cache"]
    assert w.shape == (E, L), (w.shape, L)
    u = np.concatenate([np.zeros((L - 1, E), dtype=h.dtype), b * x])
    conv = np.stack([(u[t:t + L] * w.T).sum(axis=0) for t in range(T)])
    return mm(c * conv, p + "shortconv.out_proj")
