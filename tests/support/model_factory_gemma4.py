"""Small random Gemma 4 GGUF files (llama.cpp's `gemma4`: src/models/gemma4.cpp, src/llama-model.cpp), written by
``model_factory.write_test_model(path, "gemma4", ...)``; no test functions in here.

Shape (F32 and the 32-element quants; with 256-element blocks every width x4): n_embd 64, 4 heads, 6 layers with
llama.cpp's per-layer pattern array, local unless (il + 1) % 3 == 0 (layers 2 and 5 global), window 4; local
layers: head_dim 16, 2 KV heads, RoPE base 10000 over all 16 dims; global layers: head_dim 32, 1 KV head (per-layer
head_count_kv), base 1e6 with proportional RoPE (rope_freqs: a quarter of the pairs turn, the rest factor 1e30);
q/k norms, V RMS-normed, post-attention / post-FFN norms, a layer_output_scale per layer, attention scale 1
(llama.cpp's constant), final_logit_softcapping ``final_softcap`` (default 30, as the real files).

Options: ``per_layer`` (per-layer token embeddings of width 32 / 256: per_layer_token_embd, per_layer_model_proj,
per_layer_proj_norm, blk.N.inp_gate / proj / post_norm), ``shared_kv`` (attention.shared_kv_layers: the last
``shared_kv`` layers have no K/V of their own and FFNs twice as wide, as E2B's double-wide MLP: a per-layer
feed_forward_length; 3 by default when on), ``no_v`` (no attn_v tensors: K serves as V), ``final_softcap``,
``sliding_window``, ``n_layer``; ``experts`` (the 26B-A4B's MoE in every layer: 8 experts of width 64 / 256, 2
used, GELU, routed by a softmax over ffn_gate_inp · (rmsnorm(x) / sqrt(n_embd) · ffn_gate_inp.scale), each expert's
output scaled by ffn_down_exps.scale, beside the dense FFN with pre_ffw_norm_2 / post_ffw_norm_1 / post_ffw_norm_2;
``fused_experts``: one ffn_gate_up_exps, the gate's rows first); ``kv_full`` / ``kv_swa``: the KV heads of each
kind. Inconsistent files, for the loader's errors: ``drop_key`` (a metadata key left out, e.g.
"gemma4.attention.key_length_swa"), ``bad_tensor`` (that tensor written one row short).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import gguf
import numpy as np
from gguf import GGMLQuantizationType as QT
from gguf import GGUFWriter

OPTIONS = ("per_layer", "shared_kv", "no_v", "final_softcap", "sliding_window", "n_layer", "eps", "rope_base", "experts",
           "fused_experts", "kv_full", "kv_swa", "drop_key", "bad_tensor")


def gemma4_dims(kq: bool, opts: Mapping[str, Any]) -> dict:
    unknown = set(opts) - set(OPTIONS)
    if unknown:
        raise TypeError(f"unknown gemma4 options {unknown}")
    x = 4 if kq else 1
    d = dict(n_embd=64 * x, n_head=4, hd_swa=16 * x, hd_full=32 * x, kv_swa=2, kv_full=1, n_ff=128 * x,
             n_layer=6, sliding_window=4, eps=1e-6, rope_base=1e6, final_softcap=30.0, per_layer=False,
             P=256 if kq else 32, shared_kv=0, no_v=False, experts=False, fused_experts=False,
             n_expert=8, n_used=2, n_ff_exp=256 if kq else 64, drop_key=None, bad_tensor=None)
    d.update(opts)
    if d["shared_kv"] is True:
        d["shared_kv"] = 3
    return d


def _tensors(d: dict, rng: np.random.Generator, n_vocab: int) -> list[tuple[str, np.ndarray, str | None]]:
    """The model's tensors (name, float data, role for the qtype; None: stays F32)."""
    E, L, H = d["n_embd"], d["n_layer"], d["n_head"]
    out: list = []

    def mat(n_out, n_in, scale=1.0):
        return (rng.standard_normal((n_out, n_in)) * scale / np.sqrt(n_in)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    out.append(("token_embd.weight", (rng.standard_normal((n_vocab, E)) * 3.0 / E).astype(np.float32), "token_embd"))
    n_kv_layers = L - d["shared_kv"]
    for il in range(L):
        p, local = f"blk.{il}.", (il + 1) % 3 != 0
        hd, kvh = (d["hd_swa"], d["kv_swa"]) if local else (d["hd_full"], d["kv_full"])
        ff = d["n_ff"] * (2 if il >= n_kv_layers else 1)
        out.append((p + "attn_norm.weight", norm(E), None))
        out.append((p + "attn_q.weight", mat(H * hd, E), "attn_q"))
        # q_norm small: with attention scale 1 on unit-RMS q and k, the scores would spread by ~sqrt(hd)
        out.append((p + "attn_q_norm.weight", 0.25 * norm(hd), None))
        if il < n_kv_layers:
            out.append((p + "attn_k.weight", mat(kvh * hd, E), "attn_k"))
            out.append((p + "attn_k_norm.weight", norm(hd), None))
            if not d["no_v"]:
                out.append((p + "attn_v.weight", mat(kvh * hd, E), "attn_v"))
        out.append((p + "attn_output.weight", mat(E, H * hd), "attn_output"))
        out.append((p + "post_attention_norm.weight", norm(E), None))
        out.append((p + "ffn_norm.weight", norm(E), None))
        out.append((p + "ffn_gate.weight", mat(ff, E), "ffn_gate"))
        out.append((p + "ffn_up.weight", mat(ff, E), "ffn_up"))
        out.append((p + "ffn_down.weight", mat(E, ff), "ffn_down"))
        out.append((p + "post_ffw_norm.weight", norm(E), None))
        if d["experts"]:
            out += _experts(d, rng, p, norm)
        out.append((p + "layer_output_scale.weight", rng.uniform(0.6, 1.0, 1).astype(np.float32), None))
        if d["per_layer"]:
            out.append((p + "inp_gate.weight", mat(d["P"], E), "ffn_gate"))
            out.append((p + "proj.weight", mat(E, d["P"]), "ffn_down"))
            out.append((p + "post_norm.weight", norm(E), None))
    if d["per_layer"]:
        P = d["P"]
        out.append(("per_layer_token_embd.weight", (rng.standard_normal((n_vocab, L * P)) / np.sqrt(P)).astype(np.float32),
                    "token_embd"))
        out.append(("per_layer_model_proj.weight", mat(L * P, E), "attn_q"))
        out.append(("per_layer_proj_norm.weight", norm(P), None))
    out.append(("output_norm.weight", float(np.sqrt(E)) * norm(E), None))
    half, turning = d["hd_full"] // 2, d["hd_full"] // 8  # proportional RoPE: a quarter of the pairs turn
    out.append(("rope_freqs.weight", np.array([1.0] * turning + [1e30] * (half - turning), np.float32), None))
    return out


def _experts(d: dict, rng: np.random.Generator, p: str, norm) -> list:
    """One MoE layer's tensors; the router spread so that a token's best experts seldom nearly tie."""
    E, n, F = d["n_embd"], d["n_expert"], d["n_ff_exp"]

    def experts(n_out, n_in):
        return (rng.standard_normal((n, n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    out = [(p + "ffn_gate_inp.weight", (4.0 * rng.standard_normal((n, E))).astype(np.float32), None),
           (p + "ffn_gate_inp.scale", norm(E), None),
           (p + "pre_ffw_norm_2.weight", norm(E), None), (p + "post_ffw_norm_1.weight", norm(E), None),
           (p + "post_ffw_norm_2.weight", norm(E), None)]
    if d["fused_experts"]:
        out.append((p + "ffn_gate_up_exps.weight", experts(2 * F, E), "ffn_gate_exps"))
    else:
        out += [(p + "ffn_gate_exps.weight", experts(F, E), "ffn_gate_exps"),
                (p + "ffn_up_exps.weight", experts(F, E), "ffn_up_exps")]
    out.append((p + "ffn_down_exps.weight", experts(E, F), "ffn_down_exps"))
    out.append((p + "ffn_down_exps.scale", rng.uniform(0.5, 1.5, n).astype(np.float32), None))
    return out


def _write_keys(w: GGUFWriter, d: dict, n_ctx: int) -> None:
    a, L = "gemma4", d["n_layer"]
    swa = [(il + 1) % 3 != 0 for il in range(L)]
    n_kv_layers = L - d["shared_kv"]
    w.add_context_length(n_ctx)
    w.add_embedding_length(d["n_embd"])
    w.add_block_count(L)
    if d["shared_kv"]:
        w.add_feed_forward_length([d["n_ff"] * (2 if il >= n_kv_layers else 1) for il in range(L)])
    else:
        w.add_feed_forward_length(d["n_ff"])
    w.add_head_count(d["n_head"])
    w.add_head_count_kv([d["kv_swa"] if s else d["kv_full"] for s in swa])
    w.add_layer_norm_rms_eps(float(d["eps"]))
    w.add_rope_freq_base(float(d["rope_base"]))
    w.add_rope_freq_base_swa(10000.0)
    w.add_key_length(d["hd_full"])
    w.add_value_length(d["hd_full"])
    w.add_key_length_swa(d["hd_swa"])
    w.add_value_length_swa(d["hd_swa"])
    w.add_rope_dimension_count(d["hd_full"])
    w.add_rope_dimension_count_swa(d["hd_swa"])
    w.add_sliding_window(int(d["sliding_window"]))
    w.add_sliding_window_pattern(swa)
    w.add_shared_kv_layers(int(d["shared_kv"]))
    w.add_embedding_length_per_layer_input(d["P"] if d["per_layer"] else 0)
    if d["experts"]:
        w.add_expert_count(d["n_expert"])
        w.add_expert_used_count(d["n_used"])
        w.add_expert_feed_forward_length(d["n_ff_exp"])
    if d["final_softcap"]:
        w.add_float32(f"{a}.final_logit_softcapping", float(d["final_softcap"]))


def write_gemma4(path: str | os.PathLike, *, qtype: Any, seed: int, tied: bool, name: str | None,
                 chat_template: str | None, vocab: Mapping[str, Any] | None, **opts: Any) -> Path:
    from . import model_factory as mf  # the shared helpers (vocabulary, quantizers)

    kq = bool(mf._all_qtypes(qtype) & set(mf.BLOCK_256))
    d = gemma4_dims(kq, opts)
    n_vocab = len((vocab or mf.default_vocab())["tokenizer.ggml.tokens"])
    rng = np.random.default_rng(seed)
    tensors = [(n, t[:-1] if n == d["bad_tensor"] else t, r) for n, t, r in _tensors(d, rng, n_vocab)]
    if not tied:
        tensors.append(("output.weight", (rng.standard_normal((n_vocab, d["n_embd"])) * 3.0 / d["n_embd"]).astype(np.float32),
                        "output"))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    w = GGUFWriter(str(path), "gemma4")
    w.add_name(name or f"pyserve test gemma4 {qtype if isinstance(qtype, str) else 'custom'}")
    _write_keys(w, d, 512)
    if d["drop_key"]:
        del w.kv_data[0][d["drop_key"]]
    if isinstance(qtype, str) and qtype in mf.FILE_TYPES:
        w.add_file_type(mf.FILE_TYPES[qtype])
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    mf._write_vocab(w, vocab or mf.default_vocab())
    if chat_template is not None:
        w.add_chat_template(chat_template)
    for tname, data, role in tensors:
        t = "F32" if role is None else mf._qtype_for(role, qtype)
        if t == "F32":
            w.add_tensor(tname, data)
        elif t == "F16":
            w.add_tensor(tname, data.astype(np.float16))
        else:
            w.add_tensor(tname, mf.quantize(data, t), raw_dtype=QT[t])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
