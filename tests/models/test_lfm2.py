"""LFM2 (gated short-conv layers between attention ones; llama.cpp: src/models/lfm2.cpp, lfm2moe.cpp) beyond what
every hybrid gets (test_hybrid.py, test_arch_logits.py, test_families_http.py): the layer kinds come from the
per-layer attention.head_count_kv array (only the attention layers hold K/V), a prompt much longer than the conv
kernel matches the reference whether prefilled at once, in chunks or decoded a token at a time, and a file
missing an LFM2 key or tensor is refused with its name."""
from __future__ import annotations

import numpy as np
import pytest

from pyserve import _engine
from support import model_factory as tm
from support import numpy_ref as nr


def _tokens(n: int, seed: int) -> list[int]:
    _, _, _, bos, _ = tm.tokenizer_vocab()
    rng = np.random.default_rng(seed)
    return [bos] + [int(t) for t in rng.integers(0, bos, n - 1)]


@pytest.mark.parametrize("attn_layers", [(2,), (0, 3)])
def test_only_the_attention_layers_hold_kv(tmp_path, attn_layers):
    path = tm.write_test_model(tmp_path / "m.gguf", "lfm2", attn_layers=attn_layers)
    g = _engine.kv_geometry(str(path), block_size=16)
    assert g["bytes_per_block"] == 2 * 16 * len(attn_layers) * (2 * 16) * 2  # K and V, 2 KV heads of 16, fp16
    assert g["hparams"]["n_recurrent"] == 4 - len(attn_layers)


@pytest.mark.parametrize("arch", tm.lfm2.ARCHS)
def test_chunked_prefill_and_decode_carry_the_conv_state(tmp_path, arch):
    """A 60-token prompt in chunks of 5 (not a multiple of the kernel), then greedy decoding: each generated
    token is the reference's argmax over the whole text, and the chunked logits are one prefill's."""
    path = tm.write_test_model(tmp_path / f"{arch}.gguf", arch, qtype="F32", l_cache=4)
    eng = _engine.Engine(str(path), n_threads=2, max_num_batched_tokens=5, block_size=4)
    prompt = _tokens(60, 3)
    eng.add("a", prompt, {"temperature": 0.0}, 6, True)
    gen = []
    while eng.has_work():
        gen += [o.token for o in eng.step() if o.token >= 0]
    text = prompt + gen
    ref = nr.ref_logits(path, text[:-1])
    assert ref[len(prompt) - 1:].argmax(axis=1).tolist() == gen
    np.testing.assert_allclose(eng.prompt_logits(text[:-1]), ref, atol=0.01)


BAD = [
    pytest.param("lfm2", "lfm2.shortconv.l_cache", r"missing metadata key 'lfm2.shortconv.l_cache'", id="no-l_cache"),
    pytest.param("lfm2", "blk.1.shortconv.conv.weight", r"missing tensor 'blk.1.shortconv.conv.weight'", id="no-conv"),
    pytest.param("lfm2", "blk.0.shortconv.in_proj.weight", r"missing tensor 'blk.0.shortconv.in_proj.weight'",
                 id="no-in_proj"),
    pytest.param("lfm2", "token_embd_norm.weight", r"missing tensor 'token_embd_norm.weight'", id="no-final-norm"),
    pytest.param("lfm2", "blk.2.attn_k_norm.weight", r"missing tensor 'blk.2.attn_k_norm.weight'", id="no-k-norm"),
    pytest.param("lfm2moe", "lfm2moe.expert_gating_func", r"missing metadata key 'lfm2moe.expert_gating_func'",
                 id="no-gating"),
]


def test_a_bidirectional_file_is_refused(tmp_path):
    """LFM2-ColBERT-style encoders (attention.causal false: the conv centred, attention both ways) are not run."""
    path = tm.write_test_model(tmp_path / "enc.gguf", "lfm2", keys={"lfm2.attention.causal": False})
    with pytest.raises(_engine.GGUFError, match=r"'lfm2.attention.causal' is false: a bidirectional encoder"):
        _engine.Engine(str(path), n_threads=1)


@pytest.mark.parametrize("arch,drop,message", BAD)
def test_a_file_missing_a_key_or_tensor_names_it(tmp_path, arch, drop, message):
    path = tm.write_test_model(tmp_path / "bad.gguf", arch, drop=(drop,))
    with pytest.raises((_engine.ModelError, _engine.GGUFError), match=message):
        _engine.Engine(str(path), n_threads=1)


def test_a_conv_layer_of_the_wrong_width_names_the_tensor(tmp_path):
    """shortconv.conv holds n_embd × l_cache taps: a file whose l_cache says 4 over 3-tap convs is refused by name."""
    import gguf
    path = tm.write_test_model(tmp_path / "bad.gguf", "lfm2", l_cache=3)
    r = gguf.GGUFReader(str(path), "r+")
    field = r.fields["lfm2.shortconv.l_cache"]
    field.parts[field.data[0]][0] = 4  # the uint32 value, in place (a writable memory map)
    r.data.flush()
    del r, field
    with pytest.raises(_engine.GGUFError, match=r"tensor 'blk.0.shortconv.conv.weight' has 192 elements, expected 256"):
        _engine.Engine(str(path), n_threads=1)
