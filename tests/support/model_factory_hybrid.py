"""The hybrid Qwen3.5 layers of model_factory's random test models (llama.cpp's tensor names and keys:
src/models/qwen35.cpp load_arch_tensors, gguf-py constants: ssm.*, full_attention_interval,
rope.dimension_sections).

Shape (F32 / 32-element quants; K-quants in brackets): 4 layers, layers 0-2 Gated DeltaNet and layer 3 full
attention (full_attention_interval 4); DeltaNet with 2 key heads and 4 value heads (value head h reads key
head h % 2) of state size 16 [64], conv kernel 4; attention 4 heads of 32 [128], 2 KV heads, a quarter of each
head rotated with M-RoPE sections that text reduces to plain NeoX RoPE. The decay is slow (exp(g) ~ 0.6-0.95)
so a token's state carries far down the sequence. A token's key is correlated with its query (their
projection and conv rows 0.8 alike, as in trained models): with independent random q and k, q·k is often near
0, the per-head output norm then magnifies its sign, and 8-bit activation rounding alone moves the logits by
units. ssm_conv1d, ssm_alpha/ssm_beta and the norms stay F32.
"""
from __future__ import annotations

import numpy as np

ARCHS = ("qwen35", "qwen35moe")


def hybrid_dims(kq: bool) -> dict:
    """default_dims' overrides for a hybrid arch."""
    return dict(n_layer=4, head_dim=128 if kq else 32, eps=1e-6, rope_base=10000000.0, d_conv=4,
                ssm_state=64 if kq else 16, ssm_groups=2, ssm_v_heads=4, full_attention_interval=4)


def rope_dim(hd: int) -> int:
    return hd // 4


def rope_sections(hd: int) -> list[int]:
    """Qwen3.5's [11, 11, 10, 0] in small: three sections covering the rotated pairs (text: all one position)."""
    half = rope_dim(hd) // 2
    return [(half - j + 2) // 3 for j in range(3)] + [0]  # section j: the pairs i ≡ j (mod 3), interleaved


def recurrent(cfg: dict, il: int) -> bool:
    return (il + 1) % cfg["full_attention_interval"] != 0


def add_attention(add, mat, norm, p: str, cfg: dict, gated: bool) -> None:
    """A hybrid's attention layer: q (gated: per head the query, then its gate), k, v, per-head q/k norms, output."""
    E, H, Hkv, hd = cfg["n_embd"], cfg["n_head"], cfg["n_head_kv"], cfg["head_dim"]
    add(p + "attn_q.weight", mat((2 if gated else 1) * H * hd, E), "attn_q")
    add(p + "attn_k.weight", mat(Hkv * hd, E), "attn_k")
    add(p + "attn_v.weight", mat(Hkv * hd, E), "attn_v")
    add(p + "attn_q_norm.weight", norm(hd))
    add(p + "attn_k_norm.weight", norm(hd))
    add(p + "attn_output.weight", mat(E, H * hd), "attn_output")


def add_layer(add, rng, mat, norm, il: int, cfg: dict) -> None:
    """Layer il's tensors, less its FFN (the caller's, after post_attention_norm)."""
    p, E = f"blk.{il}.", cfg["n_embd"]
    add(p + "attn_norm.weight", norm(E))
    add(p + "post_attention_norm.weight", norm(E))
    if not recurrent(cfg, il):
        add_attention(add, mat, norm, p, cfg, gated=True)
        return
    S, Hk, Hv, K = cfg["ssm_state"], cfg["ssm_groups"], cfg["ssm_v_heads"], cfg["d_conv"]
    conv_dim, kd = 2 * Hk * S + Hv * S, Hk * S
    qkv = mat(conv_dim, E)
    qkv[kd:2 * kd] = 0.8 * qkv[:kd] + 0.6 * qkv[kd:2 * kd]  # k near q (see the module doc)
    conv = (0.5 * rng.standard_normal((conv_dim, K))).astype(np.float32)
    conv[kd:2 * kd] = 0.8 * conv[:kd] + 0.6 * conv[kd:2 * kd]
    add(p + "attn_qkv.weight", qkv, "attn_qkv")
    add(p + "attn_gate.weight", mat(Hv * S, E), "attn_gate")
    add(p + "ssm_conv1d.weight", conv)
    add(p + "ssm_dt.bias", (-1.0 + 0.5 * rng.standard_normal(Hv)).astype(np.float32))
    add(p + "ssm_a", (-np.exp(rng.uniform(-2.0, 0.5, Hv))).astype(np.float32))
    add(p + "ssm_beta.weight", mat(Hv, E))
    add(p + "ssm_alpha.weight", mat(Hv, E, 0.5))
    add(p + "ssm_norm.weight", norm(S))
    add(p + "ssm_out.weight", mat(E, Hv * S), "ssm_out")


def write_keys(w, cfg: dict) -> None:
    a, hd = w.arch, cfg["head_dim"]
    S, Hv = cfg["ssm_state"], cfg["ssm_v_heads"]
    w.add_uint32(f"{a}.ssm.conv_kernel", cfg["d_conv"])
    w.add_uint32(f"{a}.ssm.inner_size", Hv * S)
    w.add_uint32(f"{a}.ssm.state_size", S)
    w.add_uint32(f"{a}.ssm.time_step_rank", Hv)
    w.add_uint32(f"{a}.ssm.group_count", cfg["ssm_groups"])
    w.add_uint32(f"{a}.full_attention_interval", cfg["full_attention_interval"])
    w.add_uint32(f"{a}.rope.dimension_count", rope_dim(hd))
    w.add_array(f"{a}.rope.dimension_sections", rope_sections(hd))
