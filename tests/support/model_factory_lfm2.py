"""The LFM2 layers of model_factory's random test models (llama.cpp's tensor names and keys: src/models/lfm2.cpp
load_arch_tensors, lfm2moe.cpp; gguf-py constants: shortconv.l_cache, the per-layer attention.head_count_kv
whose 0 entries mark the conv layers, token_embd_norm for the final norm).

Shape: 4 layers, layer 2 attention (per-head q/k norms, NeoX RoPE, 4 heads of n_embd / 4, 2 KV heads) and the
others gated short convs of kernel 3 (LFM2's conv_L_cache); lfm2moe: layer 0 dense, layers 1-3 MoE (sigmoid
routing with an exp_probs_b choosing bias, renormalised). ``attn_layers`` (indices), ``l_cache`` and
``conv_flip`` (each conv's taps reversed: the control for the tap order) override them. shortconv.conv and the
norms stay F32.
"""
from __future__ import annotations

import numpy as np

from .model_factory_hybrid import add_attention

ARCHS = ("lfm2", "lfm2moe")


def lfm2_dims(kq: bool) -> dict:
    """default_dims' overrides for an LFM2 arch."""
    return dict(n_layer=4, head_dim=64 if kq else 16, eps=1e-5, rope_base=1000000.0, l_cache=3, attn_layers=(2,),
                conv_flip=False)


def kv_heads(cfg: dict) -> list[int]:
    """attention.head_count_kv per layer: 0 for a conv layer (llama.cpp's marker)."""
    return [cfg["n_head_kv"] if il in cfg["attn_layers"] else 0 for il in range(cfg["n_layer"])]


def add_layer(add, rng, mat, norm, il: int, cfg: dict) -> None:
    """Layer il's tensors, less its FFN (the caller's, after ffn_norm)."""
    p, E = f"blk.{il}.", cfg["n_embd"]
    add(p + "attn_norm.weight", norm(E))
    add(p + "ffn_norm.weight", norm(E))
    if il in cfg["attn_layers"]:
        add_attention(add, mat, norm, p, cfg, gated=False)
        return
    L = cfg["l_cache"]
    conv = (0.6 * rng.standard_normal((E, L))).astype(np.float32)  # [n_embd, L_cache]: tap 0 the oldest
    add(p + "shortconv.in_proj.weight", mat(3 * E, E), "attn_qkv")  # B, C, x
    add(p + "shortconv.conv.weight", conv[:, ::-1].copy() if cfg["conv_flip"] else conv)
    add(p + "shortconv.out_proj.weight", mat(E, E), "attn_output")


def write_keys(w, cfg: dict) -> None:
    w.add_shortconv_l_cache(cfg["l_cache"])
