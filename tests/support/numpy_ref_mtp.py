"""The NumPy reference of a Qwen3.5/3.6 multi-token-prediction (MTP, llama.cpp's NextN) layer, as vLLM's MTP
proposer runs it: row t joins the target's final-norm state at position t with the token that followed it,

    u = eh_proj · [rms(embedding(x[t+1]), enorm) ; rms(h[t], hnorm)]      (embedding first, then the state)

then one gated full-attention layer of the model's own kind over those rows (positions 0 … T-2, its own
K/V), its FFN (dense or MoE), shared_head_norm and the model's output head: logits that guess x[t+2].
In float64; the weights dequantized as numpy_ref does.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from . import numpy_ref as nr
from . import numpy_ref_hybrid as hybrid


def ref_mtp_logits(path_or_reader: Any, token_ids: Sequence[int]) -> np.ndarray:
    """[len(token_ids) - 1, n_vocab] (float32): the MTP layer's logits of rows t = 0 … T-2 (a qwen35 /
    qwen35moe file with nextn_predict_layers 1)."""
    m = nr.load_model(path_or_reader)
    hp, toks = m.hp, np.asarray(list(token_ids), dtype=np.int64)
    if hp.arch not in hybrid.ARCHS:
        raise ValueError(f"ref_mtp_logits: a qwen35 / qwen35moe file, not {hp.arch}")
    p, T = f"blk.{hp.n_layer}.", len(toks) - 1

    def w(name: str) -> np.ndarray:
        return m.weight(p + name + ".weight")

    def mm(h: np.ndarray, name: str) -> np.ndarray:
        return nr.linear(h, m.weight(name + ".weight"), m.weight(name + ".bias", optional=True))

    state = m.hidden(toks, range(T), np.float64)
    e = m.embedding_rows(toks[1:]).astype(np.float64) * hp.embd_mult
    x = nr.linear(np.concatenate([nr.rms_norm(e, w("nextn.enorm"), hp.eps),
                                  nr.rms_norm(state, w("nextn.hnorm"), hp.eps)], axis=1), w("nextn.eh_proj"))
    h = nr.rms_norm(x, w("attn_norm"), hp.eps)
    x = x + hybrid.gated_attention(m, hp, p, h, np.arange(T), mm, nr.rope, nr.attention, nr.attention_mask(T, None))
    f = nr.rms_norm(x, w("post_attention_norm"), hp.eps)
    if hp.moe is not None and hp.moe.layer(hp.n_layer):
        f = nr.moe_ffn(m, hp.moe, p, f, lambda a, _name: a)
    else:
        f = mm(nr.silu(mm(f, p + "ffn_gate")) * mm(f, p + "ffn_up"), p + "ffn_down")
    x = nr.rms_norm(x + f, w("nextn.shared_head_norm"), hp.eps)
    return (x @ m.output_weight().T.astype(np.float64)).astype(np.float32)
