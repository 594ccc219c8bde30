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
* ``gemma3`` - x = embd[tok] * sqrt(n_embd); sliding-window layers unless (il + 1) % 6 == 0 (local
  layers use rope base 10000, global ones ``rope.freq_base`` and the rope scaling); per-head rmsnorm of
  q and k; RoPE NeoX; q *= 1/sqrt(key_length); post-attention and post-FFN rmsnorms; GELU(tanh)-gated
  FFN. The norm weights in a GGUF already include Gemma's "+1" (the converter adds it), so they are used
  as they are, like llama.cpp does.
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

ROPE_NORM = "norm"   # GGML_ROPE_TYPE_NORM: rotate adjacent pairs (2i, 2i+1)
ROPE_NEOX = "neox"   # GGML_ROPE_TYPE_NEOX: rotate pairs (i, i + n_rot/2)

SUPPORTED_ARCHS = ("llama", "qwen2", "qwen3", "smollm3", "gemma3")
SMOLLM3_NO_ROPE_STEP = 4  # llama.cpp hard-codes it (no GGUF key): layers 3, 7, 11, … are position-free

GEMMA3_SWA_PATTERN = 6          # llama.cpp: hparams.set_swa_pattern(6)
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
    extra: dict = field(default_factory=dict)


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

    if key("expert_count", 0):
        raise NotImplementedError("mixture-of-experts models are not supported by the reference")

    n_embd = int(key("embedding_length", required=True))
    n_layer = int(key("block_count", required=True))
    n_ff_raw = key("feed_forward_length", required=True)
    n_ff = [int(v) for v in n_ff_raw] if isinstance(n_ff_raw, (list, tuple)) else [int(n_ff_raw)] * n_layer
    n_head_raw = key("attention.head_count", required=True)
    n_head_kv_raw = key("attention.head_count_kv", n_head_raw)
    for v in (n_head_raw, n_head_kv_raw):
        if isinstance(v, (list, tuple)) and len(set(v)) != 1:
            raise NotImplementedError("per-layer head counts are not supported")
    n_head = int(n_head_raw[0] if isinstance(n_head_raw, (list, tuple)) else n_head_raw)
    n_head_kv = int(n_head_kv_raw[0] if isinstance(n_head_kv_raw, (list, tuple)) else n_head_kv_raw)
    head_dim_k = int(key("attention.key_length", n_embd // n_head))
    head_dim_v = int(key("attention.value_length", n_embd // n_head))
    eps = float(key("attention.layer_norm_rms_epsilon", 1e-5 if arch != "gemma3" else 1e-6))
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
    if scaling_type in (None, "none") or not factor:
        rope_freq_scale = 1.0
    elif scaling_type == "linear":
        rope_freq_scale = 1.0 / float(factor)
    else:
        raise NotImplementedError(f"rope scaling {scaling_type!r} is not supported by the reference")

    hp = HParams(
        arch=arch, n_vocab=0, n_embd=n_embd, n_layer=n_layer, n_ff=n_ff, n_head=n_head,
        n_head_kv=n_head_kv, head_dim_k=head_dim_k, head_dim_v=head_dim_v, eps=eps,
        rope_type=ROPE_NORM if arch in ("llama", "smollm3") else ROPE_NEOX, n_rot=n_rot, rope_base=rope_base,
        rope_freq_scale=rope_freq_scale, attn_scale=1.0 / math.sqrt(head_dim_k),
    )
    f_attn_scale = key("attention.scale", None)
    if f_attn_scale:
        hp.attn_scale = float(f_attn_scale)

    hp.layer_swa = [None] * n_layer
    hp.layer_rope_base = [rope_base] * n_layer
    hp.layer_rope_scale = [rope_freq_scale] * n_layer
    hp.layer_roped = [arch != "smollm3" or (il + 1) % SMOLLM3_NO_ROPE_STEP != 0 for il in range(n_layer)]

    if arch == "gemma3":
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
    ``trace["l0.attn_out"]`` (before Wo), ``trace["l0.out"]``, ``trace["result_norm"]``.

    emulate_ggml: False (default: the exact computation), True, or some of "act" (round each matmul's
    input as ggml's CPU kernels do: Q8_0 / Q8_K / f16 by the weight's type), "kv" (f16 q/k/v, as the
    f16 KV cache and CPU flash attention), "gelu" (ggml's f16 GELU table). emulate_seed: with "act",
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
         freq_factors: np.ndarray | None = None) -> np.ndarray:
    """RoPE of x [T, n_heads, head_dim] at positions pos [T] on the first n_rot dims of each head.

    theta_i = pos * freq_scale * base^(-2i/n_rot) / freq_factors[i], i < n_rot/2.
    mode "norm" rotates (x[2i], x[2i+1]); mode "neox" rotates (x[i], x[i + n_rot/2]).
    """
    half = n_rot // 2
    inv_freq = base ** (-np.arange(half, dtype=np.float64) * 2.0 / n_rot)
    if freq_factors is not None:
        inv_freq = inv_freq / np.asarray(freq_factors, dtype=np.float64)[:half]
    theta = (np.asarray(pos, dtype=np.float64) * freq_scale)[:, None] * inv_freq[None, :]  # [T, half]
    cos = np.cos(theta)[:, None, :].astype(x.dtype)
    sin = np.sin(theta)[:, None, :].astype(x.dtype)
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


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray, scale: float) -> np.ndarray:
    """q [T, H, Dk], k [T, Hkv, Dk], v [T, Hkv, Dv] -> [T, H*Dv]; query head h uses kv head
    h // (H / Hkv) (GQA, as ggml's broadcast)."""
    T, H, _ = q.shape
    Hkv, Dv = k.shape[1], v.shape[2]
    group = H // Hkv
    out = np.empty((T, H, Dv), dtype=q.dtype)
    for h in range(H):
        g = h // group
        s = (q[:, h, :] @ k[:, g, :].T) * scale       # [T, T]
        s = np.where(mask, s, -np.inf)
        s = s - s.max(axis=-1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=-1, keepdims=True)
        out[:, h, :] = p @ v[:, g, :]
    return out.reshape(T, H * Dv)



# --------------------------------------------------------------------------------------------------
# optional emulation of ggml's CPU numerics. The reference itself is the exact computation; this only
# serves to estimate how far an implementation that rounds like ggml (llama.cpp, or an engine that
# quantizes activations to 8 bits) may legitimately land from it.
# --------------------------------------------------------------------------------------------------

_Q8_0_DOT = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "MXFP4"}  # vec_dot_type Q8_0 (Q4_1/Q5_1: Q8_1)
_Q8_K_DOT = {"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ3_S"}  # vec_dot_type Q8_K

EMULATION_FLAGS = ("act", "kv", "gelu")


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


def _emulation_flags(e) -> set:
    if not e:
        return set()
    if e is True:
        return set(EMULATION_FLAGS)
    flags = {e} if isinstance(e, str) else set(e)
    unknown = flags - set(EMULATION_FLAGS)
    if unknown:
        raise ValueError(f"unknown emulation flags {unknown}")
    return flags


# --------------------------------------------------------------------------------------------------
# the forward pass
# --------------------------------------------------------------------------------------------------

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
    is_gemma = hp.arch == "gemma3"

    def tr(name: str, val: np.ndarray) -> None:
        if trace is not None:
            trace[name] = val.copy()

    emu = _emulation_flags(emulate_ggml)
    jitter = np.random.default_rng(emulate_seed) if emulate_seed is not None else None

    def qact(h: np.ndarray, weight_name: str) -> np.ndarray:
        if "act" not in emu:
            return h
        if jitter is not None:  # another, equally valid, set of rounding decisions
            h = h * (1.0 + 1e-6 * jitter.standard_normal(h.shape))
        return quantize_activations(h, m.tensors[weight_name].tensor_type.name)

    def mm(h: np.ndarray, name: str) -> np.ndarray:
        """h @ W^T (+ bias) for the weight ``name + ".weight"``."""
        h = qact(h, name + ".weight")
        return linear(h, m.weight(name + ".weight"), m.weight(name + ".bias", optional=True))

    x = m.embedding_rows(toks).astype(dtype)
    if is_gemma:
        x = x * math.sqrt(hp.n_embd)
    tr("inp", x)

    act_fn = gelu_tanh if is_gemma else silu
    if "gelu" in emu and is_gemma:
        act_fn = lambda z: _f16(gelu_tanh(_f16(z)))  # noqa: E731  (ggml's f16 GELU table)

    rope_factors = m.weight("rope_freqs.weight", optional=True)
    for il in range(hp.n_layer):
        p = f"blk.{il}."
        w = lambda n: m.weight(p + n)                      # noqa: E731

        # ---- attention ----
        h = rms_norm(x, w("attn_norm.weight"), hp.eps)
        tr(f"l{il}.attn_norm", h)
        q = mm(h, p + "attn_q").reshape(T, hp.n_head, hp.head_dim_k)
        k = mm(h, p + "attn_k").reshape(T, hp.n_head_kv, hp.head_dim_k)
        v = mm(h, p + "attn_v").reshape(T, hp.n_head_kv, hp.head_dim_v)
        if m.has(p + "attn_q_norm.weight"):
            q = rms_norm(q, w("attn_q_norm.weight"), hp.eps)
        if m.has(p + "attn_k_norm.weight"):
            k = rms_norm(k, w("attn_k_norm.weight"), hp.eps)
        ff = rope_factors if not is_gemma else None
        if hp.layer_roped[il]:
            q = rope(q, pos, hp.n_rot, hp.layer_rope_base[il], hp.layer_rope_scale[il], hp.rope_type, ff)
            k = rope(k, pos, hp.n_rot, hp.layer_rope_base[il], hp.layer_rope_scale[il], hp.rope_type, ff)
        tr(f"l{il}.q", q)
        tr(f"l{il}.k", k)
        tr(f"l{il}.v", v)
        if "kv" in emu:   # f16 KV cache; the CPU flash-attention converts q to f16 as well
            q, k, v = _f16(q * hp.attn_scale) / hp.attn_scale, _f16(k), _f16(v)
        a = attention(q, k, v, attention_mask(T, hp.layer_swa[il]), hp.attn_scale)
        tr(f"l{il}.attn_out", a)
        o = mm(a, p + "attn_output")
        if is_gemma:
            o = rms_norm(o, w("post_attention_norm.weight"), hp.eps)
        x = x + o
        tr(f"l{il}.attn_resid", x)

        # ---- feed-forward ----
        f = rms_norm(x, w("ffn_norm.weight"), hp.eps)
        f = mm(act_fn(mm(f, p + "ffn_gate")) * mm(f, p + "ffn_up"), p + "ffn_down")
        if is_gemma:
            f = rms_norm(f, w("post_ffw_norm.weight"), hp.eps)
        x = x + f
        tr(f"l{il}.out", x)

    x = rms_norm(x[rows_idx], m.weight("output_norm.weight"), hp.eps)
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
    if hp.final_logit_softcap:
        c = hp.final_logit_softcap
        out = np.tanh(out / c) * c
    return out.astype(np.float32)


__all__ = [
    "HParams", "RefModel", "read_hparams", "load_model", "ref_logits", "ref_hidden", "log_softmax", "rms_norm",
    "rope", "attention", "attention_mask", "gelu_tanh", "silu", "ROPE_NORM", "ROPE_NEOX",
]
