"""A readable NumPy reference forward pass for the GGUF architectures pyserve supports.

``ref_logits(path_or_reader, token_ids, rows=None)`` runs one sequence, starting at position 0, through
the whole model with full causal attention (no KV cache) and returns the logits of every position (or
of the positions in ``rows``) as float32 ``[len(rows), n_vocab]``. ``ref_hidden`` stops before the output
projection: the final-norm hidden states ``[len(rows), n_embd]`` (what an embedding pools), in ``dtype``.

Weights are dequantized with ``gguf.quants.dequantize`` (the exact values stored in the file) and kept
as float32; the activations are computed in float64 by default, so this is the exact result of the
stored weights. llama.cpp rounds every matmul input to 8 bits (Q8_0 / Q8_K) for quantized weights and
keeps the KV cache in f16. On the real Gemma 3 270M Q4_K_M that alone moves the top-5 logprobs by ~0.1
on average and up to ~1 (its activations have large outliers), so compare with llama.cpp
statistically (scripts/numpy_ref_check.py). ``emulate_ggml=True`` reproduces that rounding, to size
the tolerances of an implementation that rounds like ggml.

Supported architectures (the graph follows llama.cpp's src/models/*.cpp):

* ``llama``  - x = embd[tok]; per layer: rmsnorm -> q,k,v (optional biases) -> RoPE "normal" mode
  (adjacent pairs (2i, 2i+1)), with ``rope_freqs.weight`` frequency factors when present -> GQA
  attention, scale 1/sqrt(head_dim) -> Wo (optional bias) -> residual; rmsnorm -> SiLU-gated FFN ->
  residual; final rmsnorm; ``output.weight`` or the tied ``token_embd.weight``.
* ``qwen2``  - as llama, with q/k/v biases and RoPE NeoX mode (pairs (i, i + n_rot/2)).
* ``qwen3``  - as qwen2 without biases, with a per-head rmsnorm of q and k before RoPE (src/models/qwen3.cpp).
* ``smollm3`` - as llama, with no RoPE on every 4th layer ((il + 1) % 4 == 0; src/models/smollm3.cpp).
* ``qwen3moe`` - as qwen3, with a mixture-of-experts FFN (src/models/qwen3moe.cpp).
* ``glm4moe`` - as qwen2 (q/k/v biases, NeoX RoPE, here on the first rope.dimension_count of each head),
  q/k norms where the file has them, the FFN's norm named ``post_attention_norm``, a MoE FFN after
  ``leading_dense_block_count`` dense layers; the last ``nextn_predict_layers`` blocks (multi-token
  prediction) are not part of the forward (src/models/glm4-moe.cpp).
* Mixture of experts, in any of them whose file has ``<arch>.expert_count`` (llama.cpp's build_moe_ffn):
  router logits = ffn_norm(x) @ ffn_gate_inp; probabilities by softmax (gating 1), sigmoid (2) or the
  raw logits (3); the n_used best of probabilities + ``exp_probs_b`` chosen (ties to the lower id); their
  weights = the chosen probabilities (gating 3: a softmax over the chosen logits), renormalised to sum 1
  when ``expert_weights_norm`` (default: true), times ``expert_weights_scale``; out = Σ weight · down_e(
  SiLU(gate_e h) · up_e h) + the shared experts' SiLU FFN (``ffn_*_shexp``); the first
  ``leading_dense_block_count`` layers keep a dense FFN.
* ``gemma3`` - x = embd[tok] * sqrt(n_embd); sliding-window layers unless (il + 1) % 6 == 0 (local
  layers use rope base 10000, global ones ``rope.freq_base`` and the rope scaling); per-head rmsnorm of
  q and k; RoPE NeoX; q *= 1/sqrt(key_length); post-attention and post-FFN rmsnorms; GELU(tanh)-gated
  FFN. The norm weights in a GGUF already include Gemma's "+1" (the converter adds it), so they are used
  as they are, like llama.cpp does.
* ``gemma4`` - its per-layer shapes, shared-KV layers and per-layer embeddings: numpy_ref_gemma4.py.
* ``qwen35``, ``qwen35moe`` - Gated DeltaNet layers between gated attention ones: numpy_ref_hybrid.py.
* ``lfm2``, ``lfm2moe`` - gated short-conv layers between qwen3-style attention ones: numpy_ref_lfm2.py.
"""
from __future__ import annotations

import math
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from . import numpy_ref_hybrid as hybrid
from . import numpy_ref_lfm2 as lfm2

ROPE_NORM = "norm"   # GGML_ROPE_TYPE_NORM: rotate adjacent pairs (2i, 2i+1)
ROPE_NEOX = "neox"   # GGML_ROPE_TYPE_NEOX: rotate pairs (i, i + n_rot/2)

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "qwen3moe", "smollm3", "gemma2", "gemma3", "glm4moe", "granite", "olmo2",
                   "mistral3", "phi3", "gpt-oss", "gemma4") + hybrid.ARCHS + lfm2.ARCHS
ROPE_NORM_ARCHS = ("llama", "smollm3", "granite", "mistral3")  # llama.cpp's LLAMA_ROPE_TYPE_NORM; the others NeoX
SMOLLM3_NO_ROPE_STEP = 4  # llama.cpp hard-codes it (no GGUF key): layers 3, 7, 11, … are position-free

GEMMA3_SWA_PATTERN = 6          # llama.cpp: hparams.set_swa_pattern(6)
GEMMA2_SWA_PATTERN = 2          # llama.cpp: load_swa_pattern(ml, 2): layers 0, 2, 4, ... local
GEMMA2_SWA_WINDOW = 4096
GEMMA3_SWA_ROPE_BASE = 10000.0  # llama.cpp: rope_freq_base_train_swa


# --------------------------------------------------------------------------------------------------
# metadata
# --------------------------------------------------------------------------------------------------

def _field(reader: GGUFReader, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    if f is None:
        return default
    return f.contents()


@dataclass
class HParams:
    arch: str
    n_vocab: int
    n_embd: int
    n_layer: int
    n_ff: list[int]
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    eps: float
    rope_type: str
    n_rot: int
    rope_base: float
    rope_freq_scale: float          # 1/factor for linear scaling, else 1
    attn_scale: float               # multiplies q (or q.k)
    # per layer: sliding window size (None: full causal attention), rope base and rope scale
    layer_swa: list[int | None] = field(default_factory=list)
    layer_rope_base: list[float] = field(default_factory=list)
    layer_rope_scale: list[float] = field(default_factory=list)
    layer_roped: list[bool] = field(default_factory=list)  # False: a position-free (NoPE) layer
    final_logit_softcap: float = 0.0
    attn_softcap: float = 0.0       # attention scores -> c * tanh(s / c) (gemma2)
    embd_mult: float = 1.0          # embeddings x this (gemma: sqrt(n_embd); granite: embedding_scale)
    residual_mult: float = 1.0      # each block's output x this before the residual add (granite)
    logit_mult: float = 1.0         # logits x this (granite: 1 / logit_scale)
    gelu: bool = False              # GELU(tanh)-gated FFN (gemma) instead of SiLU
    pre_norms: bool = True          # rmsnorm before attention and the FFN (olmo2: none)
    post_norms: bool = False        # rmsnorm after attention and the FFN (gemma, olmo2)
    rope_freqs: bool = True         # rope_freqs.weight factors apply (not gemma's)
    yarn: "np.ndarray | None" = None  # YaRN: per rotated pair, the blend of unscaled (1) and interpolated (0)
    rope_mscale: float = 1.0        # cos and sin x this on the global layers (YaRN's magnitude, attn_factor)
    attn_temp_scale: float = 0.0    # q x 1 + s * ln(floor(pos / attn_temp_floor) + 1) (mistral3)
    attn_temp_floor: int = 1
    swa_rope_scaled: bool = False   # local layers' RoPE stretched as the global ones (gemma2, gpt-oss)
    moe: "MoeHParams | None" = None
    extra: dict = field(default_factory=dict)


@dataclass
class MoeHParams:
    n_expert: int
    n_used: int
    dense_lead: int = 0     # leading layers with a dense FFN
    gating: int = 1         # 1 softmax, 2 sigmoid, 3 softmax over the chosen logits
    norm: bool = True       # renormalise the chosen weights
    scale: float = 1.0
    oai_glu: bool = False   # gpt-oss's clamped SwiGLU in the experts

    def layer(self, il: int) -> bool:
        return il >= self.dense_lead


def _read_moe(key, arch: str) -> MoeHParams | None:
    """gpt-oss's graph routes by logit with a softmax over the chosen, unnormalised (no GGUF key says it)."""
    n_expert = int(key("expert_count", 0) or 0)
    if not n_expert:
        return None
    scale = float(key("expert_weights_scale", 0.0) or 0.0)
    oss = arch == "gpt-oss"
    return MoeHParams(n_expert=n_expert, n_used=int(key("expert_used_count", required=True)),
                      dense_lead=int(key("leading_dense_block_count", 0)),
                      gating=int(key("expert_gating_func", 3 if oss else 1)),
                      norm=bool(key("expert_weights_norm", not oss)), scale=scale or 1.0, oai_glu=oss)


def read_hparams(reader: GGUFReader) -> HParams:
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise NotImplementedError(f"architecture {arch!r} is not supported (only {SUPPORTED_ARCHS})")

    def key(name: str, default: Any = None, required: bool = False) -> Any:
        v = _field(reader, f"{arch}.{name}", None)
        if v is None:
            if required:
                raise KeyError(f"missing GGUF key {arch}.{name}")
            return default
        return v

    if arch == "gemma4":  # per-layer shapes: numpy_ref_gemma4.py
        from .numpy_ref_gemma4 import read_gemma4
        return read_gemma4(key, HParams, MoeHParams)
    n_embd = int(key("embedding_length", required=True))
    n_layer = int(key("block_count", required=True)) - int(key("nextn_predict_layers", 0))
    n_ff_raw = key("feed_forward_length", 0, required=not key("expert_count", 0))
    n_ff = [int(v) for v in n_ff_raw] if isinstance(n_ff_raw, (list, tuple)) else [int(n_ff_raw)] * n_layer
    n_head_raw = key("attention.head_count", required=True)
    n_head_kv_raw = key("attention.head_count_kv", n_head_raw) if arch not in lfm2.ARCHS else lfm2.n_head_kv(key)
    for v in (n_head_raw, n_head_kv_raw):
        if isinstance(v, (list, tuple)) and len(set(v)) != 1:
            raise NotImplementedError("per-layer head counts are not supported")
    n_head = int(n_head_raw[0] if isinstance(n_head_raw, (list, tuple)) else n_head_raw)
    n_head_kv = int(n_head_kv_raw[0] if isinstance(n_head_kv_raw, (list, tuple)) else n_head_kv_raw)
    head_dim_k = int(key("attention.key_length", n_embd // n_head))
    head_dim_v = int(key("attention.value_length", n_embd // n_head))
    eps = float(key("attention.layer_norm_rms_epsilon", 1e-5 if arch not in ("gemma2", "gemma3") else 1e-6))
    n_rot = int(key("rope.dimension_count", head_dim_k))
    rope_base = float(key("rope.freq_base", 10000.0))

    # rope scaling (as llama.cpp reads it: rope.scaling.type / rope.scaling.factor, or the older
    # rope.scale_linear)
    rope_freq_scale = 1.0
    scaling_type = key("rope.scaling.type", None)
    factor = key("rope.scaling.factor", None)
    if factor is None:
        factor = key("rope.scale_linear", None)
        if factor is not None and scaling_type is None:
            scaling_type = "linear"
    if scaling_type in (None, "none", "longrope") or not factor:  # LongRoPE: factors from tensors
        rope_freq_scale = 1.0
    elif scaling_type in ("linear", "yarn"):
        rope_freq_scale = 1.0 / float(factor)
    else:
        raise NotImplementedError(f"rope scaling {scaling_type!r} is not supported by the reference")
    yarn, rope_mscale = _read_yarn(key, scaling_type, float(factor or 1.0), n_rot, rope_base)

    hp = HParams(
        arch=arch, n_vocab=0, n_embd=n_embd, n_layer=n_layer, n_ff=n_ff, n_head=n_head,
        n_head_kv=n_head_kv, head_dim_k=head_dim_k, head_dim_v=head_dim_v, eps=eps,
        rope_type=ROPE_NORM if arch in ROPE_NORM_ARCHS else ROPE_NEOX, n_rot=n_rot, rope_base=rope_base,
        rope_freq_scale=rope_freq_scale, attn_scale=1.0 / math.sqrt(head_dim_k), moe=_read_moe(key, arch),
    )
    f_attn_scale = key("attention.scale", None)
    if f_attn_scale:
        hp.attn_scale = float(f_attn_scale)

    hp.layer_swa = [None] * n_layer
    hp.layer_rope_base = [rope_base] * n_layer
    hp.layer_rope_scale = [rope_freq_scale] * n_layer
    hp.layer_roped = [arch != "smollm3" or (il + 1) % SMOLLM3_NO_ROPE_STEP != 0 for il in range(n_layer)]
    if arch in lfm2.ARCHS:
        lfm2.read_lfm2(hp, key)

    _read_multipliers(hp, key)
    hp.yarn, hp.rope_mscale = yarn, rope_mscale
    hp.attn_temp_scale = float(key("attention.temperature_scale", 0.0))
    hp.attn_temp_floor = int(key("rope.scaling.original_context_length", key("context_length", 4096)))
    if arch == "gemma2":
        _read_gemma2(hp, key)
    if arch == "gpt-oss":
        _read_gpt_oss(hp, key)
    if arch == "olmo2":
        hp.pre_norms, hp.post_norms = False, True
    if arch in hybrid.ARCHS:
        hybrid.read_hybrid(hp, key)
    if arch == "gemma3":
        hp.embd_mult, hp.gelu, hp.post_norms, hp.rope_freqs = math.sqrt(n_embd), True, True, False
        n_swa = key("attention.sliding_window", None)
        if n_swa is not None and int(n_swa) > 0:
            pattern = int(key("attention.sliding_window_pattern", GEMMA3_SWA_PATTERN) or GEMMA3_SWA_PATTERN)
            for il in range(n_layer):
                if (il + 1) % pattern != 0:          # local (sliding-window) layer
                    hp.layer_swa[il] = int(n_swa)
                    hp.layer_rope_base[il] = GEMMA3_SWA_ROPE_BASE
                    hp.layer_rope_scale[il] = 1.0
        else:
            # llama.cpp's non-iSWA gemma3 graph (no sliding window) soft-caps the final logits
            hp.final_logit_softcap = float(key("final_logit_softcapping", 0.0) or 0.0)
        # llama.cpp: 1/sqrt(n_embd/n_head) for the 27B model (62 layers), 1/sqrt(key_length) otherwise
        if n_layer == 62:
            hp.attn_scale = 1.0 / math.sqrt(n_embd / n_head)
    return hp


def _read_yarn(key, scaling_type, factor: float, n_rot: int, base: float) -> tuple[np.ndarray | None, float]:
    """(YaRN's ramp per rotated pair or None, the rotation's magnitude), as llama.cpp's context computes
    rope_ext's ext_factor / attn_factor and ggml's rope_yarn applies them (ggml/src/ggml-cpu/ops.cpp)."""
    attn_factor = float(key("rope.scaling.attn_factor", 1.0))
    if scaling_type != "yarn":
        return None, attn_factor
    n_orig = int(key("rope.scaling.original_context_length", key("context_length", 4096)))
    beta_fast, beta_slow = float(key("rope.scaling.yarn_beta_fast", 32.0)), float(key("rope.scaling.yarn_beta_slow", 1.0))

    def corr(turns: float) -> float:  # the pair that turns `turns` times over the original context
        return n_rot * math.log(n_orig / (turns * 2 * math.pi)) / (2 * math.log(base))

    lo, hi = max(0, math.floor(corr(beta_fast))), min(n_rot - 1, math.ceil(corr(beta_slow)))
    ramp = 1.0 - np.clip((np.arange(n_rot // 2) - lo) / max(0.001, hi - lo), 0.0, 1.0)

    def mscale(m: float) -> float:
        return 1.0 if factor <= 1.0 else 0.1 * m * math.log(factor) + 1.0

    log_mul = float(key("rope.scaling.yarn_log_multiplier", 0.0))
    a = (mscale(1.0) / mscale(log_mul) if log_mul else mscale(1.0)) / (1.0 + 0.1 * math.log(factor)) * attn_factor
    return ramp, a * (1.0 + 0.1 * math.log(factor))


def _read_multipliers(hp: HParams, key) -> None:
    """Granite's embedding / residual / logit scales, read for any arch (llama.cpp applies a file's
    embedding_scale whatever the arch)."""
    hp.embd_mult = float(key("embedding_scale", 1.0))
    hp.residual_mult = float(key("residual_scale", 1.0))
    hp.logit_mult = 1.0 / float(key("logit_scale", 1.0))


def _read_gpt_oss(hp: HParams, key) -> None:
    """gpt-oss (src/models/openai-moe.cpp): even layers local over attention.sliding_window, the global RoPE (and
    its YaRN) on every layer; attention sinks, biases and the MoE come from the tensors."""
    n_swa = int(key("attention.sliding_window", required=True))
    local_base = float(key("rope.freq_base_swa", hp.rope_base))
    for il in range(hp.n_layer):
        if il % 2 == 0:
            hp.layer_swa[il] = n_swa
            hp.layer_rope_base[il] = local_base
    hp.swa_rope_scaled = True


def _read_gemma2(hp: HParams, key) -> None:
    """Gemma 2 (src/models/gemma2.cpp): embeddings x sqrt(n_embd), GELU, post-norms, even layers local
    (window 4096 unless given, the global RoPE base unless rope.freq_base_swa), attention scores soft-capped
    at 50 and logits at 30 unless the file says."""
    hp.embd_mult, hp.gelu, hp.post_norms, hp.rope_freqs = math.sqrt(hp.n_embd), True, True, False
    n_swa = int(key("attention.sliding_window", GEMMA2_SWA_WINDOW))
    pattern = int(key("attention.sliding_window_pattern", GEMMA2_SWA_PATTERN))
    local_base = float(key("rope.freq_base_swa", hp.rope_base))
    for il in range(hp.n_layer):
        if n_swa > 0 and pattern > 0 and (il + 1) % pattern != 0:
            hp.layer_swa[il] = n_swa
            hp.layer_rope_base[il] = local_base
    hp.swa_rope_scaled = True
    hp.attn_softcap = float(key("attn_logit_softcapping", 50.0))
    hp.final_logit_softcap = float(key("final_logit_softcapping", 30.0))


# --------------------------------------------------------------------------------------------------
# the model: reader + dequantized-weight cache
# --------------------------------------------------------------------------------------------------

class RefModel:
    """A GGUF model with lazily dequantized (float32) weights."""

    def __init__(self, reader: GGUFReader):
        self.reader = reader
        self.hp = read_hparams(reader)
        self.tensors = {t.name: t for t in reader.tensors}
        self._cache: dict[str, np.ndarray] = {}
        embd = self.tensors["token_embd.weight"]
        self.hp.n_vocab = int(embd.shape[1])  # gguf-py shape: [ne0 = n_embd, ne1 = n_vocab]

    def has(self, name: str) -> bool:
        return name in self.tensors

    def weight(self, name: str, optional: bool = False) -> np.ndarray | None:
        """The dequantized tensor in row-major numpy order (a 2-D weight is [n_out, n_in])."""
        w = self._cache.get(name)
        if w is not None:
            return w
        t = self.tensors.get(name)
        if t is None:
            if optional:
                return None
            raise KeyError(f"missing tensor {name}")
        qtype = GGMLQuantizationType(t.tensor_type)
        w = np.asarray(dequantize(t.data, qtype), dtype=np.float32)
        shape = tuple(int(n) for n in reversed([int(x) for x in t.shape]))
        w = np.ascontiguousarray(w.reshape(shape))
        self._cache[name] = w
        return w

    def embedding_rows(self, toks: np.ndarray) -> np.ndarray:
        """Rows ``toks`` of token_embd [len(toks), n_embd], dequantized alone unless the whole matrix already
        is (the file's rows are whole quant blocks: gguf-py's data is [n_vocab, row bytes])."""
        w = self._cache.get("token_embd.weight")
        if w is not None:
            return w[toks]
        t = self.tensors["token_embd.weight"]
        rows = np.asarray(dequantize(t.data[toks], GGMLQuantizationType(t.tensor_type)), dtype=np.float32)
        return rows.reshape(len(toks), self.hp.n_embd)

    def output_weight(self) -> np.ndarray:
        w = self.weight("output.weight", optional=True)
        return w if w is not None else self.weight("token_embd.weight")

    def logits(self, token_ids: Sequence[int], rows: Iterable[int] | None = None,
               dtype=np.float64, trace: dict | None = None, emulate_ggml: Any = False,
               emulate_seed: int | None = None) -> np.ndarray:
        """See ref_logits."""
        return _forward(self, token_ids, rows, dtype, trace, emulate_ggml, emulate_seed)

    def hidden(self, token_ids: Sequence[int], rows: Iterable[int] | None = None, dtype=np.float64,
               emulate_ggml: Any = False, emulate_seed: int | None = None) -> np.ndarray:
        """See ref_hidden."""
        return _forward(self, token_ids, rows, dtype, None, emulate_ggml, emulate_seed, hidden_only=True)


_MODEL_CACHE: "OrderedDict[Any, RefModel]" = OrderedDict()
_MODEL_CACHE_SIZE = 3


def load_model(path_or_reader: Any) -> RefModel:
    """A cached RefModel for a path (keyed by path, size and mtime) or a GGUFReader (keyed by id)."""
    if isinstance(path_or_reader, RefModel):
        return path_or_reader
    if isinstance(path_or_reader, GGUFReader):
        key = ("reader", id(path_or_reader))
        reader = path_or_reader
    else:
        p = os.path.realpath(os.fspath(path_or_reader))
        st = os.stat(p)
        key = (p, st.st_size, st.st_mtime_ns)
        reader = None
    m = _MODEL_CACHE.get(key)
    if m is not None and (reader is None or m.reader is reader):
        _MODEL_CACHE.move_to_end(key)
        return m
    if reader is None:
        reader = GGUFReader(key[0], "r")
    m = RefModel(reader)
    _MODEL_CACHE[key] = m
    while len(_MODEL_CACHE) > _MODEL_CACHE_SIZE:
        _MODEL_CACHE.popitem(last=False)
    return m


def ref_logits(path_or_reader: Any, token_ids: Sequence[int], rows: Iterable[int] | None = None,
               dtype=np.float64, trace: dict | None = None, emulate_ggml: Any = False,
               emulate_seed: int | None = None) -> np.ndarray:
    """Logits [len(rows), n_vocab] (float32) of one sequence starting at position 0.

    rows: the positions whose logits are wanted (default: all). dtype: the activations' type.
    trace: if a dict is given, intermediate activations are stored in it (float64/dtype arrays of all
    positions), e.g. ``trace["inp"]``, ``trace["l0.attn_norm"]``, ``trace["l0.q"]`` (after RoPE),
    ``trace["l0.attn_out"]`` (before Wo), ``trace["l0.out"]``, ``trace["result_norm"]``; in a MoE layer
    ``trace["l1.route_margin"]`` (per token: see route_margin).

    emulate_ggml: False (default: the exact computation), True, or some of "act" (round each matmul's
    input as ggml's CPU kernels do: Q8_0 / Q8_K / f16 by the weight's type), "kv" (f16 q/k/v, as the
    f16 KV cache and CPU flash attention), "gelu" (ggml's f16 GELU table); or pyserve's own rounding,
    PYSERVE_NUMERICS: "act32" (8-bit activations in blocks of 32 / 256 with a float32 scale amax/127, for
    every quantized weight type), "kv16" (f16 K and V: the KV cache; q stays float). emulate_seed: with "act",
    "act32",
    jitter the matmul inputs by 1e-6 (relative) first, drawing another equally plausible set of
    rounding decisions; the spread over seeds estimates the noise of an 8-bit-activation
    implementation.
    """
    return load_model(path_or_reader).logits(token_ids, rows, dtype, trace, emulate_ggml, emulate_seed)


def ref_hidden(path_or_reader: Any, token_ids: Sequence[int], rows: Iterable[int] | None = None,
               dtype=np.float64, emulate_ggml: Any = False, emulate_seed: int | None = None) -> np.ndarray:
    """The final-norm hidden states [len(rows), n_embd] (in ``dtype``) of one sequence starting at position 0:
    the output projection's input, which an embedding pools. rows: default all; emulate_*: as ref_logits."""
    return load_model(path_or_reader).hidden(token_ids, rows, dtype, emulate_ggml, emulate_seed)


def ref_rank(path_or_reader: Any, token_ids: Sequence[int]) -> float:
    """A reranker's relevance score (llama.cpp's RANK pooling): the last final-norm state through the
    classifier head cls.output.weight (+ cls.output.bias); with two or more rows the softmax's first entry
    (Qwen3-Reranker's P(yes)), with one row the raw logit."""
    m = load_model(path_or_reader)
    h = m.hidden(token_ids, [len(token_ids) - 1], np.float64)[0]
    z = m.weight("cls.output.weight").astype(np.float64) @ h
    b = m.weight("cls.output.bias", optional=True)
    z = z + b if b is not None else z
    return float(z[0]) if len(z) == 1 else float(softmax(z)[0])


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


# --------------------------------------------------------------------------------------------------
# building blocks
# --------------------------------------------------------------------------------------------------

def rms_norm(x: np.ndarray, w: np.ndarray | None, eps: float) -> np.ndarray:
    """x / sqrt(mean(x^2) + eps) over the last axis, times w (broadcast over the last axis)."""
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y * w if w is not None else y


def linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """x [T, n_in] @ w[n_out, n_in]^T (+ b)."""
    y = x @ w.T.astype(x.dtype, copy=False)
    if b is not None:
        y = y + b.astype(x.dtype, copy=False)
    return y


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def rope(x: np.ndarray, pos: np.ndarray, n_rot: int, base: float, freq_scale: float, mode: str,
         freq_factors: np.ndarray | None = None, yarn: np.ndarray | None = None, mscale: float = 1.0) -> np.ndarray:
    """RoPE of x [T, n_heads, head_dim] at positions pos [T] on the first n_rot dims of each head.

    theta_i = pos * freq_scale * base^(-2i/n_rot) / freq_factors[i], i < n_rot/2.
    mode "norm" rotates (x[2i], x[2i+1]); mode "neox" rotates (x[i], x[i + n_rot/2]).
    """
    half = n_rot // 2
    inv_freq = base ** (-np.arange(half, dtype=np.float64) * 2.0 / n_rot)
    if freq_factors is not None:
        inv_freq = inv_freq / np.asarray(freq_factors, dtype=np.float64)[:half]
    # YaRN: pair i's frequency blends the unscaled (yarn[i] = 1) and the interpolated one
    inv_freq = inv_freq * (freq_scale if yarn is None else freq_scale * (1 - yarn) + yarn)
    theta = np.asarray(pos, dtype=np.float64)[:, None] * inv_freq[None, :]  # [T, half]
    cos = (mscale * np.cos(theta))[:, None, :].astype(x.dtype)
    sin = (mscale * np.sin(theta))[:, None, :].astype(x.dtype)
    out = x.copy()
    if mode == ROPE_NEOX:
        x0, x1 = x[..., :half], x[..., half:n_rot]
        out[..., :half] = x0 * cos - x1 * sin
        out[..., half:n_rot] = x0 * sin + x1 * cos
    elif mode == ROPE_NORM:
        x0, x1 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = x0 * cos - x1 * sin
        out[..., 1:n_rot:2] = x0 * sin + x1 * cos
    else:
        raise ValueError(mode)
    return out


def attention_mask(n_tokens: int, n_swa: int | None) -> np.ndarray:
    """[T, T] bool, True where query position p may attend to key position q: q <= p and, with a
    sliding window, p - q < n_swa (llama.cpp's LLAMA_SWA_TYPE_STANDARD)."""
    p = np.arange(n_tokens)[:, None]
    q = np.arange(n_tokens)[None, :]
    m = q <= p
    if n_swa is not None:
        m &= (p - q) < n_swa
    return m


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float,
              softcap: float = 0.0, sinks: np.ndarray | None = None) -> np.ndarray:
    """q [T, H, Dk], k [T, Hkv, Dk], v [T, Hkv, Dv] -> [T, H*Dv]; query head h uses kv head
    h // (H / Hkv) (GQA, as ggml's broadcast); scores soft-capped at +-softcap when given; sinks [H]: a logit
    per head that joins each softmax's denominator and takes no value (gpt-oss)."""
    T, H, _ = q.shape
    Hkv, Dv = k.shape[1], v.shape[2]
    group = H // Hkv
    out = np.empty((T, H, Dv), dtype=q.dtype)
    for h in range(H):
        g = h // group
        s = (q[:, h, :] @ k[:, g, :].T) * scale       # [T, T]
        if softcap:
            s = softcap * np.tanh(s / softcap)
        s = np.where(mask, s, -np.inf)
        mx = s.max(axis=-1, keepdims=True) if sinks is None else np.maximum(s.max(axis=-1, keepdims=True), sinks[h])
        p = np.exp(s - mx)
        p /= p.sum(axis=-1, keepdims=True) + (0.0 if sinks is None else np.exp(sinks[h] - mx))
        out[:, h, :] = p @ v[:, g, :]
    return out.reshape(T, H * Dv)



# --------------------------------------------------------------------------------------------------
# optional emulation of ggml's CPU numerics. The reference itself is the exact computation; this only
# serves to estimate how far an implementation that rounds like ggml (llama.cpp, or an engine that
# quantizes activations to 8 bits) may legitimately land from it.
# --------------------------------------------------------------------------------------------------

_Q8_0_DOT = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "MXFP4"}  # vec_dot_type Q8_0 (Q4_1/Q5_1: Q8_1)
_Q8_K_DOT = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ3_S"}  # vec_dot_type Q8_K

GGML_NUMERICS = ("act", "kv", "gelu")
PYSERVE_NUMERICS = ("act32", "kv16")
EMULATION_FLAGS = GGML_NUMERICS + PYSERVE_NUMERICS


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(x.dtype)


def _bf16(x: np.ndarray) -> np.ndarray:
    u = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    u = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16) << 16          # round to nearest even
    return u.astype(np.uint32).view(np.float32).astype(x.dtype)


def quantize_activations(x: np.ndarray, weight_type: str) -> np.ndarray:
    """x [..., n_in] rounded as ggml's CPU matmul rounds its activations for a weight of this type:
    Q8_0 (blocks of 32, f16 scale amax/127) for the 32-element quants, Q8_K (blocks of 256, f32 scale
    max/-127) for the K-quants, f16 / bf16 for F16 / BF16 weights, unchanged for F32."""
    if weight_type in _Q8_0_DOT:
        b = x.reshape(-1, 32)
        amax = np.abs(b).max(axis=1, keepdims=True)
        idd = np.where(amax == 0, 0.0, 127.0 / np.where(amax == 0, 1.0, amax))
        q = np.round(b * idd)              # round half to even, as the AVX code (_MM_ROUND_NEAREST)
        return (q * _f16(amax / 127.0)).reshape(x.shape)
    if weight_type in _Q8_K_DOT:
        b = x.reshape(-1, 256)
        mx = np.take_along_axis(b, np.abs(b).argmax(axis=1)[:, None], axis=1)
        iscale = np.where(mx == 0, 0.0, -127.0 / np.where(mx == 0, 1.0, mx))
        q = np.minimum(127, np.round(iscale * b))
        d = np.where(iscale == 0, 0.0, 1.0 / np.where(iscale == 0, 1.0, iscale))
        return (q * d.astype(np.float32)).reshape(x.shape)
    if weight_type == "F16":
        return _f16(x)
    if weight_type == "BF16":
        return _bf16(x)
    return x


def quantize_activations_pyserve(x: np.ndarray, weight_type: str) -> np.ndarray:
    """x [..., n_in] rounded as pyserve's engine rounds a matmul's input for a weight of this type (csrc/kernels/quant.cpp
    quantize_act_row): blocks of 32 (the legacy types) or 256 (K-quants), d = amax / 127 in float32, q = round
    half to even of x · (1/d); float weights take the input unchanged."""
    block = 32 if weight_type in _Q8_0_DOT else 256 if weight_type in _Q8_K_DOT else 0
    if not block:
        return x
    b = x.astype(np.float32).reshape(-1, block)
    d = np.abs(b).max(axis=1, keepdims=True) / np.float32(127)
    inv = np.where(d == 0, np.float32(0), np.float32(1) / np.where(d == 0, np.float32(1), d))
    return (np.round(b * inv) * d).astype(x.dtype).reshape(x.shape)


def _emulation_flags(e) -> set:
    if not e:
        return set()
    if e is True:
        return set(GGML_NUMERICS)
    flags = {e} if isinstance(e, str) else set(e)
    unknown = flags - set(EMULATION_FLAGS)
    if unknown:
        raise ValueError(f"unknown emulation flags {unknown}")
    return flags


def swiglu_oai(g: np.ndarray, u: np.ndarray, alpha: float = 1.702, limit: float = 7.0) -> np.ndarray:
    """gpt-oss's expert activation (ggml_swiglu_oai): min(g, limit) * sigmoid(alpha * min(g, limit)) *
    (clip(u, -limit, limit) + 1)."""
    x = np.minimum(g, limit)
    return x / (1.0 + np.exp(-alpha * x)) * (np.clip(u, -limit, limit) + 1.0)


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _gate_probs(moe: MoeHParams, logits: np.ndarray) -> np.ndarray:
    """The router's scores by gating kind: softmax (1), sigmoid (2), the raw logits (3)."""
    return softmax(logits) if moe.gating == 1 else 1.0 / (1.0 + np.exp(-logits)) if moe.gating == 2 else logits


def route(moe: MoeHParams, logits: np.ndarray, select_bias: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """(chosen experts [T, n_used] best first, their weights [T, n_used]) from router logits [T, n_expert]."""
    probs = _gate_probs(moe, logits)
    score = probs + (select_bias if select_bias is not None else 0.0)
    chosen = np.argsort(-score, axis=-1, kind="stable")[:, :moe.n_used]
    w = np.take_along_axis(probs, chosen, axis=-1)
    if moe.gating == 3:
        w = softmax(w)
    if moe.norm:
        w = w / w.sum(axis=-1, keepdims=True)
    return chosen, w * moe.scale


def route_margin(moe: MoeHParams, logits: np.ndarray, select_bias: np.ndarray | None) -> np.ndarray:
    """Per token [T], how far the last chosen expert is ahead of the best one left out, in router-logit units (the
    score gap over the score's slope; inf: all chosen): where it is tiny, a rounding of the router's input may
    choose the other."""
    if moe.n_used >= moe.n_expert:
        return np.full(len(logits), np.inf)
    probs = _gate_probs(moe, logits)
    score = probs + (select_bias if select_bias is not None else 0.0)
    order = np.argsort(-score, axis=-1, kind="stable")
    last, out = order[:, moe.n_used - 1:moe.n_used], order[:, moe.n_used:moe.n_used + 1]
    gap = (np.take_along_axis(score, last, -1) - np.take_along_axis(score, out, -1))[:, 0]
    if moe.gating == 1:  # the order of the probabilities is the logits' order
        return (np.take_along_axis(logits, last, -1) - np.take_along_axis(logits, out, -1))[:, 0]
    if moe.gating == 2:
        p = np.take_along_axis(probs, np.concatenate([last, out], -1), -1)
        return gap / np.maximum(p * (1 - p), 1e-12).max(axis=-1)
    return gap


def moe_ffn(m: "RefModel", moe: MoeHParams, p: str, f: np.ndarray, qact, margins: list | None = None) -> np.ndarray:
    """The MoE block of the FFN-normed rows f [T, n_embd] in layer prefix p (margins: gets route_margin)."""
    def expert_mm(h, name, e):
        b = m.weight(p + name + ".bias", optional=True)
        return h @ m.weight(p + name + ".weight")[e].T.astype(h.dtype) + (0.0 if b is None else b[e])

    glu = swiglu_oai if moe.oai_glu else (lambda g, u: silu(g) * u)
    logits = linear(qact(f, p + "ffn_gate_inp.weight"), m.weight(p + "ffn_gate_inp.weight"),
                    m.weight(p + "ffn_gate_inp.bias", optional=True))
    chosen, weights = route(moe, logits, m.weight(p + "exp_probs_b.bias", optional=True))
    if margins is not None:
        margins.append(route_margin(moe, logits, m.weight(p + "exp_probs_b.bias", optional=True)))
    out = np.zeros_like(f)
    for e in np.unique(chosen):
        rows, slot = np.nonzero(chosen == e)
        h = f[rows]
        g = glu(expert_mm(qact(h, p + "ffn_gate_exps.weight"), "ffn_gate_exps", e),
                expert_mm(qact(h, p + "ffn_up_exps.weight"), "ffn_up_exps", e))
        out[rows] += weights[rows, slot][:, None] * expert_mm(qact(g, p + "ffn_down_exps.weight"), "ffn_down_exps", e)
    if m.has(p + "ffn_gate_shexp.weight"):
        def sh(h, name):
            return linear(qact(h, p + name + ".weight"), m.weight(p + name + ".weight"))
        shared = sh(silu(sh(f, "ffn_gate_shexp")) * sh(f, "ffn_up_shexp"), "ffn_down_shexp")
        gate = m.weight(p + "ffn_gate_inp_shexp.weight", optional=True)  # qwen35moe: sigmoid-gated
        out = out + (shared if gate is None else shared / (1.0 + np.exp(-(f @ gate.astype(f.dtype))))[:, None])
    return out


def _qkv(m: "RefModel", hp: HParams, p: str, h: np.ndarray, mm) -> tuple:
    """q, k, v [T, width] from their own weights or a fused attn_qkv (phi3: q rows, then k's, then v's)."""
    if not m.has(p + "attn_qkv.weight"):
        return mm(h, p + "attn_q"), mm(h, p + "attn_k"), mm(h, p + "attn_v")
    qkv = mm(h, p + "attn_qkv")
    qd, kvd = hp.n_head * hp.head_dim_k, hp.n_head_kv * hp.head_dim_k
    return qkv[:, :qd], qkv[:, qd:qd + kvd], qkv[:, qd + kvd:]


def _gated(m: "RefModel", hp: HParams, p: str, f: np.ndarray, mm, act_fn) -> np.ndarray:
    """act(gate) * up, from their own weights or phi3's ffn_up of twice the width (SwiGLU: the gate first)."""
    if m.has(p + "ffn_gate.weight"):
        return act_fn(mm(f, p + "ffn_gate")) * mm(f, p + "ffn_up")
    gu = mm(f, p + "ffn_up")
    n = gu.shape[-1] // 2
    return act_fn(gu[:, :n]) * gu[:, n:]


def _rope_factors(m: "RefModel", hp: HParams) -> np.ndarray | None:
    """llama.cpp's get_rope_factors: rope_freqs, else LongRoPE's long factors when the context passes the
    original one, its short factors otherwise. The context is the engine's default, min(context_length, 8192)."""
    if m.has("rope_freqs.weight"):
        return m.weight("rope_freqs.weight")
    n_ctx = min(int(_field(m.reader, f"{hp.arch}.context_length", 4096)), 8192)
    n_orig = int(_field(m.reader, f"{hp.arch}.rope.scaling.original_context_length", n_ctx))
    long = n_ctx > n_orig and m.has("rope_factors_long.weight")
    return m.weight("rope_factors_long.weight" if long else "rope_factors_short.weight", optional=True)


# --------------------------------------------------------------------------------------------------
# the forward pass
# --------------------------------------------------------------------------------------------------

def _attention(m: RefModel, hp: HParams, il: int, x: np.ndarray, h: np.ndarray, pos: np.ndarray, mm, emu: set,
               rope_factors, tr) -> np.ndarray:
    """Layer il's attention block over the normed rows h: x plus its output (the residual added)."""
    T, p = len(x), f"blk.{il}."

    def norm(v: np.ndarray, name: str) -> np.ndarray:
        return rms_norm(v, m.weight(name), hp.eps) if m.has(name) else v

    q, k, v = _qkv(m, hp, p, h, mm)
    if hp.arch == "olmo2":  # q and k normed over the whole projection, before the heads split
        q, k = norm(q, p + "attn_q_norm.weight"), norm(k, p + "attn_k_norm.weight")
    q = q.reshape(T, hp.n_head, hp.head_dim_k)
    k = k.reshape(T, hp.n_head_kv, hp.head_dim_k)
    v = v.reshape(T, hp.n_head_kv, hp.head_dim_v)
    if hp.arch != "olmo2":
        q, k = norm(q, p + "attn_q_norm.weight"), norm(k, p + "attn_k_norm.weight")
    ff = rope_factors if hp.rope_freqs else None
    if hp.layer_roped[il]:
        scaled = hp.layer_swa[il] is None or hp.swa_rope_scaled
        yarn, ms = (hp.yarn, hp.rope_mscale) if scaled else (None, 1.0)
        q = rope(q, pos, hp.n_rot, hp.layer_rope_base[il], hp.layer_rope_scale[il], hp.rope_type, ff, yarn, ms)
        k = rope(k, pos, hp.n_rot, hp.layer_rope_base[il], hp.layer_rope_scale[il], hp.rope_type, ff, yarn, ms)
    if hp.attn_temp_scale:  # mistral3 / llama4 temperature: q x 1 + s * ln(floor(pos / L) + 1)
        q = q * (1.0 + hp.attn_temp_scale * np.log(np.floor(pos / hp.attn_temp_floor) + 1.0))[:, None, None]
    tr(f"l{il}.q", q)
    tr(f"l{il}.k", k)
    tr(f"l{il}.v", v)
    if "kv" in emu:   # f16 KV cache; the CPU flash-attention converts q to f16 as well
        q, k, v = _f16(q * hp.attn_scale) / hp.attn_scale, _f16(k), _f16(v)
    elif "kv16" in emu:
        k, v = _f16(k), _f16(v)
    a = attention(q, k, v, attention_mask(T, hp.layer_swa[il]), hp.attn_scale, hp.attn_softcap,
                  m.weight(p + "attn_sinks.weight", optional=True))
    tr(f"l{il}.attn_out", a)
    o = mm(a, p + "attn_output")
    if hp.post_norms:
        o = rms_norm(o, m.weight(p + "post_attention_norm.weight"), hp.eps)
    x = x + hp.residual_mult * o
    return x


def _forward(m: RefModel, token_ids: Sequence[int], rows: Iterable[int] | None, dtype,
             trace: dict | None, emulate_ggml: Any = False, emulate_seed: int | None = None,
             hidden_only: bool = False) -> np.ndarray:
    hp = m.hp
    toks = np.asarray(list(token_ids), dtype=np.int64)
    T = len(toks)
    if T == 0:
        raise ValueError("empty token list")
    if toks.min() < 0 or toks.max() >= hp.n_vocab:
        raise ValueError("token id out of range")
    rows_idx = np.arange(T) if rows is None else np.asarray(list(rows), dtype=np.int64)
    if len(rows_idx) and (rows_idx.min() < 0 or rows_idx.max() >= T):
        raise ValueError("row out of range")
    pos = np.arange(T)

    def tr(name: str, val: np.ndarray) -> None:
        if trace is not None:
            trace[name] = val.copy()

    emu = _emulation_flags(emulate_ggml)
    jitter = np.random.default_rng(emulate_seed) if emulate_seed is not None else None

    def qact(h: np.ndarray, weight_name: str) -> np.ndarray:
        if not emu & {"act", "act32"}:
            return h
        if jitter is not None:  # another, equally valid, set of rounding decisions
            h = h * (1.0 + 1e-6 * jitter.standard_normal(h.shape))
        rounding = quantize_activations if "act" in emu else quantize_activations_pyserve
        return rounding(h, m.tensors[weight_name].tensor_type.name)

    def mm(h: np.ndarray, name: str) -> np.ndarray:
        """h @ W^T (+ bias) for the weight ``name + ".weight"``."""
        h = qact(h, name + ".weight")
        return linear(h, m.weight(name + ".weight"), m.weight(name + ".bias", optional=True))

    x = m.embedding_rows(toks).astype(dtype) * hp.embd_mult
    tr("inp", x)

    def norm(h: np.ndarray, name: str) -> np.ndarray:
        return rms_norm(h, m.weight(name), hp.eps) if m.has(name) else h

    act_fn = gelu_tanh if hp.gelu else silu
    if "gelu" in emu and hp.gelu:
        act_fn = lambda z: _f16(gelu_tanh(_f16(z)))  # noqa: E731  (ggml's f16 GELU table)

    rope_factors = _rope_factors(m, hp)
    if hp.arch == "gemma4":  # its own layer stack (numpy_ref_gemma4.py); the output head below is shared
        from .numpy_ref_gemma4 import gemma4_layers
        x = gemma4_layers(m, x, toks, mm, qact, tr, act_fn, emu)
    for il in range(hp.n_layer if hp.arch != "gemma4" else 0):
        p = f"blk.{il}."
        w = lambda n: m.weight(p + n)                      # noqa: E731

        # ---- attention ----
        h = norm(x, p + "attn_norm.weight") if hp.pre_norms else x
        tr(f"l{il}.attn_norm", h)
        if hp.arch in hybrid.ARCHS:  # Qwen3.5: a DeltaNet or a gated attention mixer (numpy_ref_hybrid.py)
            o = (hybrid.delta_net(m, hp, p, h, mm) if hp.extra["recurrent"][il] else
                 hybrid.gated_attention(m, hp, p, h, pos, mm, rope, attention, attention_mask(T, None)))
            x = x + o
        elif hp.arch in lfm2.ARCHS and hp.extra["conv"][il]:  # LFM2: a gated short conv (numpy_ref_lfm2.py)
            x = x + lfm2.short_conv(m, hp, p, h, mm)
        else:
            x = _attention(m, hp, il, x, h, pos, mm, emu, rope_factors, tr)
        tr(f"l{il}.attn_resid", x)

        # ---- feed-forward ----
        ffn_norm = "post_attention_norm" if hp.arch in ("glm4moe", "gpt-oss") + hybrid.ARCHS else "ffn_norm"
        f = norm(x, p + ffn_norm + ".weight") if hp.pre_norms else x
        if hp.moe is not None and hp.moe.layer(il):
            margins = [] if trace is not None else None
            f = moe_ffn(m, hp.moe, p, f, qact, margins)
            if margins:
                tr(f"l{il}.route_margin", margins[0])
        else:
            f = mm(_gated(m, hp, p, f, mm, act_fn), p + "ffn_down")
        if hp.post_norms:
            f = rms_norm(f, w("post_ffw_norm.weight"), hp.eps)
        x = x + hp.residual_mult * f
        tr(f"l{il}.out", x)

    x = rms_norm(x[rows_idx], m.weight("token_embd_norm.weight" if hp.arch in lfm2.ARCHS else "output_norm.weight"), hp.eps)
    tr("result_norm", x)
    if hidden_only:
        return x

    # logits = x @ W_out^T, in chunks of the vocabulary (the embedding can be 262144 x 640)
    W = m.output_weight()
    x = qact(x, "output.weight" if m.has("output.weight") else "token_embd.weight")
    out = np.empty((len(rows_idx), hp.n_vocab), dtype=np.float64)
    chunk = 32768
    for s in range(0, hp.n_vocab, chunk):
        out[:, s:s + chunk] = x @ W[s:s + chunk].T.astype(x.dtype)
    out *= hp.logit_mult
    if hp.final_logit_softcap:
        c = hp.final_logit_softcap
        out = np.tanh(out / c) * c
    return out.astype(np.float32)


__all__ = [
    "HParams", "MoeHParams", "RefModel", "read_hparams", "load_model", "ref_logits", "ref_hidden", "log_softmax", "rms_norm",
    "rope", "attention", "attention_mask", "gelu_tanh", "silu", "ROPE_NORM", "ROPE_NEOX",
]
