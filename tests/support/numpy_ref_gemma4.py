"""Gemma 4 in the NumPy reference (numpy_ref.py dispatches here): its hyper-parameters and its layer stack, as
llama.cpp's src/models/gemma4.cpp computes them (the embedding scale, the final norm, the output projection and
the soft-cap are numpy_ref's shared code).

Per layer il (local: the sliding_window_pattern array's entry): h = attn_norm(x); q = rope(q_norm(Wq h)) with the
local or global head width, RoPE base and rotated dims (the global layers' rope_freqs factors: proportional RoPE);
a layer below n_layer - shared_kv_layers makes k = rope(k_norm(Wk h)), v = rmsnorm(Wv h) (no weight; K's
projection where attn_v is absent), a later one reuses layer n_kv - 2 (local) or n_kv - 1 (global)'s;
attention with scale 1 over the window (local) or everything; x += post_attention_norm(Wo a);
x += post_ffw_norm(down(gelu(gate f) * up f)), f = ffn_norm(x); with per-layer embeddings
x += post_norm(proj(gelu(inp_gate x) * pl[il])); x *= layer_output_scale. A MoE file (26B-A4B) adds to the dense
FFN's post_ffw_norm_1'd output the experts' post_ffw_norm_2'd one (GELU experts on pre_ffw_norm_2(x), routed by a
softmax over ffn_gate_inp · (rmsnorm(x) / sqrt(n_embd) · ffn_gate_inp.scale), the chosen weights renormalised,
each expert's output × ffn_down_exps.scale[e]), then post_ffw_norm over the sum.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np


def _per_layer(v: Any, n_layer: int) -> list[int]:
    return [int(a) for a in v] if isinstance(v, (list, tuple)) else [int(v)] * n_layer


def read_gemma4(key, hparams_cls, moe_cls) -> Any:
    """numpy_ref.HParams of a gemma4 file (``key(name, default, required)`` reads ``gemma4.<name>``)."""
    n_embd, n_layer = int(key("embedding_length", required=True)), int(key("block_count", required=True))
    n_head = int(_per_layer(key("attention.head_count", required=True), n_layer)[0])
    n_kv = _per_layer(key("attention.head_count_kv", n_head), n_layer)
    hd, hd_swa = int(key("attention.key_length", required=True)), int(key("attention.key_length_swa", required=True))
    hp = hparams_cls(arch="gemma4", n_vocab=0, n_embd=n_embd, n_layer=n_layer,
                     n_ff=_per_layer(key("feed_forward_length", required=True), n_layer), n_head=n_head,
                     n_head_kv=max(n_kv), head_dim_k=hd, head_dim_v=hd,
                     eps=float(key("attention.layer_norm_rms_epsilon", 1e-6)), rope_type="neox",
                     n_rot=int(key("rope.dimension_count", hd)), rope_base=float(key("rope.freq_base", 10000.0)),
                     rope_freq_scale=1.0, attn_scale=1.0)
    hp.embd_mult, hp.gelu, hp.post_norms = math.sqrt(n_embd), True, True
    if int(key("expert_count", 0) or 0):  # llama.cpp's gemma4 graph: softmax, renormalised, unscaled
        hp.moe = moe_cls(n_expert=int(key("expert_count")), n_used=int(key("expert_used_count", required=True)))
    hp.final_logit_softcap = float(key("final_logit_softcapping", 0.0) or 0.0)
    swa = [bool(s) for s in key("attention.sliding_window_pattern", required=True)]
    hp.extra = dict(swa=swa, n_swa=int(key("attention.sliding_window", required=True)), n_head_kv=n_kv,
                    hd_swa=hd_swa, rot_swa=int(key("rope.dimension_count_swa", hd_swa)),
                    base_swa=float(key("rope.freq_base_swa", 10000.0)),
                    n_layer_kv=n_layer - int(key("attention.shared_kv_layers", 0)),
                    P=int(key("embedding_length_per_layer_input", required=True)))
    return hp


def _per_layer_inputs(m, x: np.ndarray, toks: np.ndarray, mm) -> np.ndarray:
    """[T, n_layer, P]: (rmsnorm(per_layer_model_proj x / sqrt(n_embd)) + per_layer_token_embd[tok] sqrt(P)) / sqrt(2)."""
    hp, T = m.hp, len(toks)
    P, L = hp.extra["P"], hp.n_layer
    tok = m.weight("per_layer_token_embd.weight")[toks].astype(x.dtype).reshape(T, L, P) * math.sqrt(P)
    proj = (mm(x, "per_layer_model_proj") / math.sqrt(hp.n_embd)).reshape(T, L, P)
    from .numpy_ref import rms_norm
    return (rms_norm(proj, m.weight("per_layer_proj_norm.weight"), hp.eps) + tok) / math.sqrt(2.0)


def _attention_layer(m, il: int, h: np.ndarray, kv: dict, mm, emu: set) -> np.ndarray:
    """Layer il's attention output (before Wo) [T, n_head * hd]; stores / reads its K, V in kv."""
    from . import numpy_ref as nr
    hp, g, T = m.hp, m.hp.extra, len(h)
    p, local = f"blk.{il}.", g["swa"][il]
    hd, n_kv = (g["hd_swa"] if local else hp.head_dim_k), g["n_head_kv"][il]
    rot, base = (g["rot_swa"], g["base_swa"]) if local else (hp.n_rot, hp.rope_base)
    ff = None if local else m.weight("rope_freqs.weight", optional=True)
    pos = np.arange(T)
    q = nr.rms_norm(mm(h, p + "attn_q").reshape(T, hp.n_head, hd), m.weight(p + "attn_q_norm.weight"), hp.eps)
    q = nr.rope(q, pos, rot, base, 1.0, nr.ROPE_NEOX, ff)
    if il < g["n_layer_kv"]:
        k = mm(h, p + "attn_k")
        v = mm(h, p + "attn_v") if m.has(p + "attn_v.weight") else k
        k = nr.rms_norm(k.reshape(T, n_kv, hd), m.weight(p + "attn_k_norm.weight"), hp.eps)
        v = nr.rms_norm(v.reshape(T, n_kv, hd), None, hp.eps)
        k = nr.rope(k, pos, rot, base, 1.0, nr.ROPE_NEOX, ff)
        if emu & {"kv", "kv16"}:  # the f16 KV cache
            k, v = nr._f16(k), nr._f16(v)
        kv[il] = (k, v)
    else:
        k, v = kv[g["n_layer_kv"] - (2 if local else 1)]
    if "kv" in emu:
        q = nr._f16(q)
    return nr.attention(q, k, v, nr.attention_mask(T, g["n_swa"] if local else None), 1.0)


def _experts(m, il: int, x: np.ndarray, qact, tr, act_fn) -> np.ndarray:
    """Layer il's MoE output (before post_ffw_norm_2) from the residual x [T, n_embd]."""
    from . import numpy_ref as nr
    hp, p = m.hp, f"blk.{il}."
    r = nr.rms_norm(x, None, hp.eps) / math.sqrt(hp.n_embd) * m.weight(p + "ffn_gate_inp.scale")
    logits = nr.linear(qact(r, p + "ffn_gate_inp.weight"), m.weight(p + "ffn_gate_inp.weight"))
    chosen, weights = nr.route(hp.moe, logits, None)
    tr(f"l{il}.route_margin", nr.route_margin(hp.moe, logits, None))
    h = nr.rms_norm(x, m.weight(p + "pre_ffw_norm_2.weight"), hp.eps)
    scale = m.weight(p + "ffn_down_exps.scale", optional=True)
    out = np.zeros_like(x)
    for e in np.unique(chosen):
        rows, slot = np.nonzero(chosen == e)
        if m.has(p + "ffn_gate_up_exps.weight"):
            gu = qact(h[rows], p + "ffn_gate_up_exps.weight") @ m.weight(p + "ffn_gate_up_exps.weight")[e].T
            g, u = np.split(gu, 2, axis=-1)
        else:
            g = qact(h[rows], p + "ffn_gate_exps.weight") @ m.weight(p + "ffn_gate_exps.weight")[e].T
            u = qact(h[rows], p + "ffn_up_exps.weight") @ m.weight(p + "ffn_up_exps.weight")[e].T
        y = qact(act_fn(g) * u, p + "ffn_down_exps.weight") @ m.weight(p + "ffn_down_exps.weight")[e].T
        out[rows] += (weights[rows, slot] * (1.0 if scale is None else scale[e]))[:, None] * y
    return out


def gemma4_layers(m, x: np.ndarray, toks: np.ndarray, mm, qact, tr, act_fn, emu: set) -> np.ndarray:
    """The residual stream after every layer, from the scaled embeddings x [T, n_embd]."""
    from . import numpy_ref as nr
    hp = m.hp
    pl = _per_layer_inputs(m, x, toks, mm) if hp.extra["P"] else None
    kv: dict = {}
    for il in range(hp.n_layer):
        p = f"blk.{il}."
        w = lambda n: m.weight(p + n)  # noqa: E731
        a = _attention_layer(m, il, nr.rms_norm(x, w("attn_norm.weight"), hp.eps), kv, mm, emu)
        tr(f"l{il}.attn_out", a)
        x = x + nr.rms_norm(mm(a, p + "attn_output"), w("post_attention_norm.weight"), hp.eps)
        f = nr.rms_norm(x, w("ffn_norm.weight"), hp.eps)
        f = mm(act_fn(mm(f, p + "ffn_gate")) * mm(f, p + "ffn_up"), p + "ffn_down")
        if m.has(p + "ffn_gate_inp.weight"):
            f = (nr.rms_norm(f, w("post_ffw_norm_1.weight"), hp.eps) +
                 nr.rms_norm(_experts(m, il, x, qact, tr, act_fn), w("post_ffw_norm_2.weight"), hp.eps))
        x = x + nr.rms_norm(f, w("post_ffw_norm.weight"), hp.eps)
        if pl is not None:
            y = mm(act_fn(mm(x, p + "inp_gate")) * pl[:, il], p + "proj")
            x = x + nr.rms_norm(y, w("post_norm.weight"), hp.eps)
        if m.has(p + "layer_output_scale.weight"):
            x = x * float(w("layer_output_scale.weight")[0])
        tr(f"l{il}.out", x)
    return x
