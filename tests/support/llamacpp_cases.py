"""The random-weight files compared against llama.cpp itself (tests/models/test_llamacpp_logits.py), and the control
that must fail beside each architecture's reference.

One list for both sides: scripts/llamacpp_reference.py writes each case's file with tests/support/model_factory.py,
runs llama.cpp on it and stores llama.cpp's logits in tests/data/llamacpp/; the test writes the same file again
(checked by its sha256), runs pyserve's engine on it and compares. A control is a copy of an architecture's
F32 file with one of its features switched off (a bias zeroed, a soft-cap lifted, a sink removed, the routing
changed) by editing the copy in place; pyserve on the control must miss llama.cpp's logits of the original.
"""
from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from . import model_factory as tm

PROMPTS = ((24, 1), (1, 2), (41, 3))  # (length, seed) of the token prompts each file is run on
TOP_K = 10  # llama.cpp's top tokens per position whose logprobs are compared


@dataclass(frozen=True)
class Case:
    arch: str
    qtype: str
    kw: dict = field(default_factory=dict)

    @property
    def id(self) -> str:
        opts = "-".join(f"{k}{v}" for k, v in sorted(self.kw.items()))
        return f"{self.arch}-{self.qtype}" + (f"-{opts}" if opts else "")

    @property
    def moe(self) -> bool:
        return tm.moe_config(self.arch, self.qtype, self.kw.get("moe")) is not None or bool(self.kw.get("experts"))

    def write(self, folder: Path) -> Path:
        name = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.id) + ".gguf"
        # general.name must not say "phi3": llama.cpp then expects Phi-3's own special tokens in the vocabulary
        return tm.write_test_model(folder / name, self.arch, qtype=self.qtype, name="pyserve reference case",
                                   **self.kw)


def tokens(n: int, seed: int) -> list[int]:
    """The prompt of `n` tokens: BOS, then ids drawn from the test vocabulary (tests/models/test_arch_logits.py's)."""
    bos = tm.tokenizer_vocab()[3]
    rng = np.random.default_rng(seed)
    return [bos] + [int(t) for t in rng.integers(0, bos, n - 1)]


# Every architecture at F32, Q8_0 and a Q4_K_M-like mix; every tensor type on llama; the features that only
# show with options (soft-caps that bite, per-layer embeddings, shared KV, routing kinds, RoPE scaling).
_FEATURES = [
    Case("gemma2", "F32", {"attn_softcap": 1.5, "final_softcap": 2.0}),
    Case("gemma4", "F32", {"per_layer": True}),
    Case("gemma4", "F32", {"shared_kv": True, "no_v": True}),
    Case("gemma4", "F32", {"final_softcap": 2.0, "tied": False}),
    Case("gemma4", "F32", {"experts": True}),
    Case("gemma4", "Q8_0", {"experts": True, "shared_kv": True}),
    Case("gemma4", "Q4_K", {"experts": True}),
    Case("gemma4", "mixed", {"experts": True, "per_layer": True}),
    Case("glm4moe", "F32", {"moe": {"n_expert": 16, "n_used": 4}, "n_layer": 4}),
    Case("qwen3moe", "F32", {"moe": {"n_used": 1}}),
    Case("llama", "F32", {"moe": {"n_expert": 4}}),
    Case("llama", "F32", {"rope_freqs": True}),
    Case("llama", "F32", {"rope_scaling": {"type": "linear", "factor": 4.0}}),
    Case("mistral3", "F32", {"rope_scaling": {"type": "yarn", "factor": 8.0, "original_context": 12,
                                              "log_mul": 0.5, "attn_factor": 0.9}}),
    Case("qwen3", "F32", {"rope_scaling": {"type": "yarn", "factor": 4.0, "original_context": 8}}),
    Case("granite", "Q8_0", {"tied": False, "residual_scale": 0.2, "logit_scale": 0.5}),
    Case("gpt-oss", "MXFP4"),
]
_LLAMA_TYPES = ("F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "IQ4_NL", "MXFP4", "Q2_K", "Q3_K", "Q4_K", "Q5_K",
                "Q6_K", "IQ4_XS", "IQ3_S")
CASES = ([Case(a, q) for a in tm.ARCHS for q in ("F32", "Q8_0", "mixed")]
         + [Case("llama", q) for q in _LLAMA_TYPES] + _FEATURES)
BY_ID = {c.id: c for c in CASES}


@dataclass(frozen=True)
class Control:
    """A copy of `case`'s file with one feature switched off: `keys` set (metadata name → value) and `fills`
    (tensor name suffix → the value every element of each matching tensor becomes)."""
    case: str
    what: str
    keys: dict = field(default_factory=dict)
    fills: dict = field(default_factory=dict)

    def write(self, src: Path, dst: Path) -> Path:
        from gguf import GGUFReader

        shutil.copyfile(src, dst)
        r = GGUFReader(dst, "r+")
        for name, value in self.keys.items():
            f = r.fields[name]
            f.parts[f.data[0]][0] = value
        hit = {s: 0 for s in self.fills}
        for t in r.tensors:
            for suffix, value in self.fills.items():
                if t.name.endswith(suffix):
                    t.data[...] = value
                    hit[suffix] += 1
        missing = [s for s, n in hit.items() if n == 0]
        assert not missing, f"{self.case}: no tensor named *{missing[0]}"
        r.data.flush()
        return dst


CONTROLS = [
    Control("llama-F32", "RoPE base 10000 → 2", keys={"llama.rope.freq_base": 2.0}),
    Control("qwen2-F32", "q/k/v biases off", fills={"attn_q.bias": 0.0, "attn_k.bias": 0.0, "attn_v.bias": 0.0}),
    Control("qwen3-F32", "q/k norm weights 1 → 4", fills={"attn_q_norm.weight": 4.0, "attn_k_norm.weight": 4.0}),
    Control("qwen3moe-F32", "one expert per token instead of two", keys={"qwen3moe.expert_used_count": 1}),
    Control("smollm3-F32", "RoPE base → 2", keys={"smollm3.rope.freq_base": 2.0}),
    Control("gemma2-F32-attn_softcap1.5-final_softcap2.0", "attention soft-cap lifted",
            keys={"gemma2.attn_logit_softcapping": 1e4}),
    Control("gemma3-F32", "sliding window lifted", keys={"gemma3.attention.sliding_window": 4096}),
    Control("glm4moe-F32", "routing's selection bias off", fills={"exp_probs_b.bias": 0.0}),
    Control("granite-F32", "attention multiplier → 1", keys={"granite.attention.scale": 1.0}),
    Control("olmo2-F32", "q/k norm weights → 4", fills={"attn_q_norm.weight": 4.0, "attn_k_norm.weight": 4.0}),
    Control("mistral3-F32", "attention temperature off", keys={"mistral3.attention.temperature_scale": 0.0}),
    Control("phi3-F32", "LongRoPE factors → 1", fills={"rope_factors_long.weight": 1.0,
                                                     "rope_factors_short.weight": 1.0}),
    Control("gpt-oss-F32", "attention sinks off", fills={"attn_sinks.weight": -1e4}),
    Control("gemma4-F32-final_softcap2.0-tiedFalse", "final soft-cap lifted",
            keys={"gemma4.final_logit_softcapping": 1e4}),
    Control("qwen35-F32", "DeltaNet decay off", fills={"ssm_a": 0.0}),
    Control("qwen35moe-F32", "shared expert's gate → 0", fills={"ffn_gate_inp_shexp.weight": 0.0}),
    Control("lfm2-F32", "short conv's taps all 1", fills={"shortconv.conv.weight": 1.0}),
    Control("lfm2moe-F32", "routing's selection bias off", fills={"exp_probs_b.bias": 0.0}),
]


def log_softmax(x) -> np.ndarray:
    """Logits [T, V] → log-probabilities, in float64."""
    x = np.asarray(x, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def top_deviation(logits, ids, ref) -> np.ndarray:
    """[T, k] |logprob − ref| of each position's reference top ids `ids` [T, k] (ref: their logprobs)."""
    return np.abs(np.take_along_axis(log_softmax(logits), np.asarray(ids), axis=1) - np.asarray(ref))


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
