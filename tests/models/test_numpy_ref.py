"""Self-checks of the NumPy reference (tests/support/numpy_ref.py) and the random test models
(tests/support/model_factory.py). They need neither the C++ engine nor the real model and take a few seconds.
The check against llama.cpp on the real Gemma 3 model is scripts/numpy_ref_check.py."""
from __future__ import annotations

import math

import gguf
import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize

from support import model_factory as tm
from support import numpy_ref as nr

T = 20


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("ref_models")


_paths: dict = {}


def model(model_dir, arch, qtype="F32", **kw):
    key = (arch, qtype, tuple(sorted(kw.items())))
    if key not in _paths:
        name = f"{arch}_{qtype}_" + "_".join(f"{k}{v}" for k, v in sorted(kw.items())) + ".gguf"
        _paths[key] = tm.write_test_model(model_dir / name, arch, qtype=qtype, **kw)
    return _paths[key]


def tokens(n=T, seed=1):
    _, _, _, bos, _ = tm.tokenizer_vocab()
    rng = np.random.default_rng(seed)
    return [bos] + [int(t) for t in rng.integers(0, bos, n - 1)]


# ---------------------------------------------------------------------------------------------
# models load, logits are sane
# ---------------------------------------------------------------------------------------------

CASES = [(a, q) for a in tm.ARCHS for q in ("F32", "F16", "Q8_0", "Q4_0", "Q4_K", "Q6_K", "mixed")]


@pytest.mark.parametrize("arch,qtype", CASES)
def test_model_loads_and_gives_finite_logits(model_dir, arch, qtype):
    p = model(model_dir, arch, qtype)
    r = GGUFReader(str(p))
    names = {t.name for t in r.tensors}
    lfm2 = arch in tm.lfm2.ARCHS
    assert {"token_embd.weight", "token_embd_norm.weight" if lfm2 else "output_norm.weight"} <= names
    assert {"blk.0.shortconv.in_proj.weight" if lfm2 else "blk.0.attn_qkv.weight" if arch in ("phi3", *tm.hybrid.ARCHS)
            else "blk.0.attn_q.weight"} <= names
    if arch in tm.hybrid.ARCHS:  # layers 0-2 Gated DeltaNet, layer 3 full attention
        assert {"blk.0.ssm_conv1d.weight", "blk.0.ssm_a", "blk.3.attn_q.weight", "blk.3.attn_q_norm.weight"} <= names
    if lfm2:  # layers 0, 1, 3 short convs, layer 2 attention
        assert {"blk.0.shortconv.conv.weight", "blk.3.shortconv.out_proj.weight", "blk.2.attn_q_norm.weight"} <= names
    assert {"blk.1.ffn_down_exps.weight" if arch in tm.MOE_ARCHS else "blk.1.ffn_down.weight"} <= names
    assert ("blk.0.attn_q.bias" in names) == (arch in ("qwen2", "glm4moe", "gpt-oss"))
    assert ("blk.0.attn_q_norm.weight" in names) == (arch in ("gemma3", "gemma4", "qwen3", "qwen3moe", "olmo2"))
    assert r.fields["general.architecture"].contents() == arch
    L = nr.ref_logits(p, tokens())
    assert L.shape == (T, tm.N_VOCAB) and L.dtype == np.float32
    assert np.isfinite(L).all()
    assert 1.0 < L.std() < 10.0


def test_reader_and_path_give_the_same_logits(model_dir):
    p = model(model_dir, "llama", "Q8_0")
    a = nr.ref_logits(p, tokens())
    b = nr.ref_logits(GGUFReader(str(p)), tokens())
    np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("arch", tm.ARCHS)
def test_causal_prefix(model_dir, arch):
    p = model(model_dir, arch, "F32")
    toks = tokens()
    full = nr.ref_logits(p, toks)
    for k in (1, 7, 13):
        np.testing.assert_allclose(nr.ref_logits(p, toks[:k]), full[:k], rtol=0, atol=1e-5)
    # and the future matters nowhere, the past everywhere after it
    other = list(toks)
    other[10] = (other[10] + 1) % 256
    changed = nr.ref_logits(p, other)
    np.testing.assert_allclose(changed[:10], full[:10], rtol=0, atol=1e-5)
    assert np.abs(changed[10:] - full[10:]).max(axis=1).min() > 1e-3


def test_rows_select_positions(model_dir):
    p = model(model_dir, "qwen2", "F32")
    full = nr.ref_logits(p, tokens())
    np.testing.assert_allclose(nr.ref_logits(p, tokens(), rows=[19, 0, 5]), full[[19, 0, 5]], atol=1e-6)


def test_float32_activations_agree(model_dir):
    p = model(model_dir, "gemma3", "Q4_K")
    a = nr.ref_logits(p, tokens())
    b = nr.ref_logits(p, tokens(), dtype=np.float32)
    assert np.abs(a - b).max() < 1e-3


def test_trace_records_intermediates(model_dir):
    p = model(model_dir, "gemma3", "F32")
    tr: dict = {}
    nr.ref_logits(p, tokens(), trace=tr)
    hp = nr.load_model(p).hp
    assert tr["inp"].shape == (T, hp.n_embd)
    assert tr["l0.q"].shape == (T, hp.n_head, hp.head_dim_k)
    assert tr["l0.attn_out"].shape == (T, hp.n_head * hp.head_dim_v)
    assert f"l{hp.n_layer - 1}.out" in tr and tr["result_norm"].shape == (T, hp.n_embd)


# ---------------------------------------------------------------------------------------------
# hyper-parameters and the architecture-specific parts
# ---------------------------------------------------------------------------------------------

def test_gemma3_hparams(model_dir):
    hp = nr.load_model(model(model_dir, "gemma3", "F32")).hp
    assert hp.n_layer == 6 and hp.n_head == 4 and hp.n_head_kv == 2
    assert hp.head_dim_k == 32 != hp.n_embd // hp.n_head
    assert hp.layer_swa == [8, 8, 8, 8, 8, None]
    assert hp.layer_rope_base == [10000.0] * 5 + [1e6]
    assert hp.rope_type == nr.ROPE_NEOX and hp.n_rot == 32
    assert math.isclose(hp.attn_scale, 1 / math.sqrt(32))
    assert hp.final_logit_softcap == 0.0


def test_llama_qwen2_hparams(model_dir):
    hl = nr.load_model(model(model_dir, "llama", "F32")).hp
    hq = nr.load_model(model(model_dir, "qwen2", "F32")).hp
    assert hl.rope_type == nr.ROPE_NORM and hq.rope_type == nr.ROPE_NEOX
    assert hl.layer_swa == [None, None] and hq.rope_base == 1e6
    assert hl.head_dim_k == 16 and hl.n_vocab == tm.N_VOCAB


def test_gemma3_sliding_window_matters(model_dir):
    """Same weights (same seed), window 8 vs a window longer than the prompt: positions < 8 see the
    same keys in both, later positions do not."""
    toks = tokens()
    a = nr.ref_logits(model(model_dir, "gemma3", "F32"), toks)
    b = nr.ref_logits(model(model_dir, "gemma3", "F32", sliding_window=10**6), toks)
    np.testing.assert_allclose(a[:8], b[:8], rtol=0, atol=1e-5)
    assert np.abs(a[8:] - b[8:]).max(axis=1).min() > 1e-2


def test_gemma3_window_mask():
    m = nr.attention_mask(6, 2)
    assert m.tolist() == [[p - 2 < q <= p for q in range(6)] for p in range(6)]
    assert nr.attention_mask(4, None).tolist() == np.tril(np.ones((4, 4), bool)).tolist()


def test_llama_rope_freqs_matter(model_dir):
    toks = tokens()
    a = nr.ref_logits(model(model_dir, "llama", "F32"), toks)
    b = nr.ref_logits(model(model_dir, "llama", "F32", rope_freqs=True), toks)
    np.testing.assert_allclose(a[0], b[0], rtol=0, atol=1e-5)    # RoPE is the identity at position 0
    assert np.abs(a[1:] - b[1:]).max() > 1e-2


def test_untied_output(model_dir):
    p = model(model_dir, "llama", "F32", tied=False)
    r = GGUFReader(str(p))
    assert "output.weight" in {t.name for t in r.tensors}
    a = nr.ref_logits(p, tokens())
    b = nr.ref_logits(model(model_dir, "llama", "F32"), tokens())
    assert np.abs(a - b).max() > 0.5


def test_rope_modes_match_their_definitions():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 3, 8))
    pos = np.arange(5) * 3
    base = 100.0
    theta = pos[:, None] * base ** (-np.arange(4) * 2 / 8)                # [T, 4]
    rot = np.exp(1j * theta)[:, None, :]
    # norm: adjacent pairs as complex numbers
    z = x[..., 0::2] + 1j * x[..., 1::2]
    y = nr.rope(x, pos, 8, base, 1.0, nr.ROPE_NORM)
    np.testing.assert_allclose(y[..., 0::2] + 1j * y[..., 1::2], z * rot, atol=1e-12)
    # neox: first half real, second half imaginary
    z = x[..., :4] + 1j * x[..., 4:]
    y = nr.rope(x, pos, 8, base, 1.0, nr.ROPE_NEOX)
    np.testing.assert_allclose(y[..., :4] + 1j * y[..., 4:], z * rot, atol=1e-12)
    # partial rotation leaves the tail alone; freq factors divide the frequencies; scale multiplies pos
    y = nr.rope(x, pos, 4, base, 1.0, nr.ROPE_NEOX)
    np.testing.assert_array_equal(y[..., 4:], x[..., 4:])
    f = np.array([1.0, 2.0, 4.0, 8.0])
    y1 = nr.rope(x, pos, 8, base, 1.0, nr.ROPE_NORM, freq_factors=f)
    theta_f = theta / f
    z = x[..., 0::2] + 1j * x[..., 1::2]
    np.testing.assert_allclose(y1[..., 0::2] + 1j * y1[..., 1::2], z * np.exp(1j * theta_f)[:, None, :], atol=1e-12)
    np.testing.assert_allclose(nr.rope(x, pos, 8, base, 0.5, nr.ROPE_NORM), nr.rope(x, pos * 0.5, 8, base, 1.0, nr.ROPE_NORM))


def test_attention_gqa_matches_repeated_heads():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((6, 4, 8))
    k = rng.standard_normal((6, 2, 8))
    v = rng.standard_normal((6, 2, 5))
    mask = nr.attention_mask(6, 3)
    out = nr.attention(q, k, v, mask, 0.3).reshape(6, 4, 5)
    for h in range(4):
        kk, vv = k[:, h // 2], v[:, h // 2]
        for p in range(6):
            s = np.array([q[p, h] @ kk[j] * 0.3 if mask[p, j] else -np.inf for j in range(6)])
            w = np.exp(s - s.max())
            w /= w.sum()
            np.testing.assert_allclose(out[p, h], w @ vv, atol=1e-12)


def test_rope_freqs_only_for_llama(model_dir):
    with pytest.raises(ValueError):
        tm.write_test_model(model_dir / "bad.gguf", "qwen2", rope_freqs=True)


# ---------------------------------------------------------------------------------------------
# quantization of the test models, emulation
# ---------------------------------------------------------------------------------------------

# relative rms error bounds of quantize -> gguf dequantize on Gaussian data
QERR = {"F32": 1e-7, "F16": 1e-3, "BF16": 5e-3, "Q8_0": 0.01, "Q5_0": 0.06, "Q5_1": 0.05, "Q4_0": 0.12,
        "Q4_1": 0.1, "Q6_K": 0.03, "Q5_K": 0.05, "Q4_K": 0.1, "Q3_K": 0.2, "Q2_K": 0.4, "IQ4_NL": 0.12,
        "IQ4_XS": 0.12, "MXFP4": 0.15, "IQ3_S": 0.2}


@pytest.mark.parametrize("qtype", tm.ALL_QTYPES)
def test_quantize_roundtrip(qtype):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 512)).astype(np.float32)
    x[1, 7] = 25.0                       # an outlier
    x[2] = 0.0                           # an all-zero row
    q = tm.quantize(x, qtype)
    y = np.asarray(dequantize(q, gguf.GGMLQuantizationType[qtype]), dtype=np.float32).reshape(x.shape)
    assert np.isfinite(y).all()
    assert (y[2] == 0).all()
    rel = np.sqrt(((y - x) ** 2).mean()) / np.sqrt((x ** 2).mean())
    assert rel < QERR[qtype]


def test_emulation(model_dir):
    toks = tokens()
    p = model(model_dir, "llama", "Q8_0")
    exact = nr.ref_logits(p, toks)
    emu = nr.ref_logits(p, toks, emulate_ggml=True)
    assert 1e-4 < np.abs(emu - exact).max() < 1.5
    p32 = model(model_dir, "llama", "F32")
    np.testing.assert_array_equal(nr.ref_logits(p32, toks, emulate_ggml="act"), nr.ref_logits(p32, toks))
    with pytest.raises(ValueError):
        nr.ref_logits(p32, toks, emulate_ggml="nope")


# ---------------------------------------------------------------------------------------------
# tokenizer metadata
# ---------------------------------------------------------------------------------------------

def test_tokenizer_metadata(model_dir):
    r = GGUFReader(str(model(model_dir, "gemma3", "Q8_0")))
    f = lambda k: r.fields[k].contents()  # noqa: E731
    toks, types, merges = f("tokenizer.ggml.tokens"), f("tokenizer.ggml.token_type"), f("tokenizer.ggml.merges")
    assert f("tokenizer.ggml.model") == "gpt2" and f("tokenizer.ggml.pre") == "gpt-2"
    emb = next(t for t in r.tensors if t.name == "token_embd.weight")
    assert len(toks) == len(types) == int(emb.shape[1]) == tm.N_VOCAB
    assert toks[:256] == list(tm.bytes_to_unicode().values())
    bos, eos = f("tokenizer.ggml.bos_token_id"), f("tokenizer.ggml.eos_token_id")
    assert (toks[bos], toks[eos]) == ("<s>", "</s>")
    assert types[bos] == types[eos] == int(gguf.TokenType.CONTROL)
    assert all(t == int(gguf.TokenType.NORMAL) for t in types[:bos])
    vocab = set(toks)
    for m in merges:
        a, b = m.split(" ")
        assert a in vocab and b in vocab and a + b in vocab
    assert f("tokenizer.ggml.add_bos_token") is True


def test_tokenizer_works_with_hf_tokenizers():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    toks, _, merges, bos, eos = tm.tokenizer_vocab()
    bpe = models.BPE(vocab={t: i for i, t in enumerate(toks)}, merges=[tuple(m.split(" ")) for m in merges])
    tok = Tokenizer(bpe)
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    enc = tok.encode("Hello world and the café 12")
    assert enc.tokens[:4] == ["Hello", "Ġworld", "Ġand", "Ġthe"]
    assert tok.decode(enc.ids) == "Hello world and the café 12"
    assert max(enc.ids) < bos
