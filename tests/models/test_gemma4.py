"""Gemma 4 (issue 25) beyond the per-arch logits of test_arch_logits.py: controls that must fail (the reference
with one of gemma4's features switched off is far from the engine, which matches the true reference), decoding
through the paged KV cache (alone and batched) equal to prefill on every variant, the KV cache's per-layer
widths in its memory accounting, and inconsistent files refused with the key or tensor named.

Files: tests/support/model_factory_gemma4.py (random weights, F32 unless said); reference: tests/support/numpy_ref_gemma4.py.
"""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader

from pyserve import _engine
from support import model_factory as tm
from support import numpy_ref as nr

TOKS = [256] + list(range(40, 80))  # BOS (the factory's vocabulary: 256 bytes, merges, then <s>) and 40 more
MATCH, MISS = 0.05, 0.5  # max |d logit|: the true reference within MATCH (F32), a switched-off feature past MISS


def _no_rope_freqs(m):  # proportional RoPE off: every global pair turns
    m._cache["rope_freqs.weight"] = np.ones_like(m.weight("rope_freqs.weight"))


def _one_rope_base(m):  # the local layers on the global base
    m.hp.extra["base_swa"] = m.hp.rope_base


def _no_output_scale(m):
    for il in range(m.hp.n_layer):
        m._cache[f"blk.{il}.layer_output_scale.weight"] = np.ones(1, np.float32)


def _no_per_layer(m):
    m.hp.extra["P"] = 0


def _no_softcap(m):
    m.hp.final_logit_softcap = 0.0


def _full_attention(m):  # no sliding window
    m.hp.extra["n_swa"] = 1 << 20


def _no_down_scale(m):  # every expert's output unscaled
    for il in range(m.hp.n_layer):
        m._cache[f"blk.{il}.ffn_down_exps.scale"] = np.ones(m.hp.moe.n_expert, np.float32)


CONTROLS = [
    pytest.param({}, _no_rope_freqs, id="proportional-rope"),
    pytest.param({}, _one_rope_base, id="local-rope-base"),
    pytest.param({}, _no_output_scale, id="layer-output-scale"),
    pytest.param({}, _full_attention, id="sliding-window"),
    pytest.param({"per_layer": True}, _no_per_layer, id="per-layer-embeddings"),
    pytest.param({"final_softcap": 2.0}, _no_softcap, id="final-softcap"),
    pytest.param({"experts": True}, _no_down_scale, id="expert-output-scale"),
]


@pytest.mark.parametrize("kw,switch_off", CONTROLS)
def test_a_feature_switched_off_in_the_reference_is_caught(tmp_path, kw, switch_off):
    path = tm.write_test_model(tmp_path / "g4.gguf", "gemma4", **kw)
    got = _engine.Engine(str(path), n_threads=1).prompt_logits(TOKS)
    exact = nr.RefModel(GGUFReader(str(path), "r"))
    moe = nr.PYSERVE_NUMERICS if kw.get("experts") else False  # the engine's own rounding: the same experts
    assert np.abs(got - exact.logits(TOKS, emulate_ggml=moe)).max() < MATCH
    control = nr.RefModel(GGUFReader(str(path), "r"))
    switch_off(control)
    assert np.abs(got - control.logits(TOKS, emulate_ggml=moe)).max() > MISS


VARIANTS = [
    pytest.param({}, id="dense"),
    pytest.param({"per_layer": True, "shared_kv": True, "no_v": True}, id="per_layer-shared_kv-no_v"),
    pytest.param({"experts": True, "shared_kv": 3, "n_layer": 9, "sliding_window": 3}, id="moe-9layers-shared_kv3-window3"),
]


@pytest.mark.parametrize("kw", VARIANTS)
def test_decoding_through_the_paged_cache_gives_the_prefills_tokens(tmp_path, kw):
    """Greedy decoding (K/V read back from blocks of 4, shared-KV layers reading an earlier layer's blocks) picks
    the argmax of one prefill of the whole text at each position, alone as batched with another sequence."""
    path = tm.write_test_model(tmp_path / "g4.gguf", "gemma4", qtype="Q8_0", **kw)
    eng = _engine.Engine(str(path), n_threads=1, block_size=4)
    prompts = [TOKS[:7], TOKS[3:15]]
    tm.assert_decode_is_prefill_argmax(eng, prompts, 12)


def test_the_kv_cache_holds_each_layers_own_width_and_nothing_for_shared_layers(tmp_path):
    """Local layers 2 heads x 16, global ones 4 x 32; with 3 shared-KV layers only layers 0-2 hold K/V."""
    own = tm.write_test_model(tmp_path / "own.gguf", "gemma4", kv_full=4)
    shared = tm.write_test_model(tmp_path / "shared.gguf", "gemma4", kv_full=4, shared_kv=3)
    per_token = {"own": 4 * 2 * 16 + 2 * 4 * 32, "shared": 2 * 2 * 16 + 1 * 4 * 32}  # K floats per token, all layers
    for name, path in (("own", own), ("shared", shared)):
        g = _engine.kv_geometry(str(path), block_size=16)
        assert g["bytes_per_block"] == 2 * 16 * per_token[name] * 2  # K and V, fp16
    eng = _engine.Engine(str(shared), n_threads=1)
    assert np.abs(eng.prompt_logits(TOKS) - nr.ref_logits(shared, TOKS)).max() < MATCH


BAD = [
    pytest.param({"drop_key": "gemma4.attention.key_length_swa"}, r"missing metadata key 'gemma4.attention.key_length_swa'",
                 id="no-key_length_swa"),
    pytest.param({"drop_key": "gemma4.attention.sliding_window_pattern"},
                 r"missing metadata key 'gemma4.attention.sliding_window_pattern'", id="no-pattern"),
    pytest.param({"drop_key": "gemma4.embedding_length_per_layer_input"},
                 r"missing metadata key 'gemma4.embedding_length_per_layer_input'", id="no-per-layer-width"),
    pytest.param({"bad_tensor": "blk.1.attn_q.weight"}, r"tensor 'blk.1.attn_q.weight' has shape \[64, 63\], expected \[64, 64\]",
                 id="q-shape"),
    pytest.param({"bad_tensor": "blk.2.attn_k_norm.weight"}, r"tensor 'blk.2.attn_k_norm.weight' has 31 elements, expected 32",
                 id="global-k-norm"),
    pytest.param({"per_layer": True, "bad_tensor": "per_layer_proj_norm.weight"},
                 r"tensor 'per_layer_proj_norm.weight' has 31 elements, expected 32", id="per-layer-norm"),
    pytest.param({"experts": True, "bad_tensor": "blk.0.ffn_gate_inp.scale"},
                 r"tensor 'blk.0.ffn_gate_inp.scale' has 63 elements, expected 64", id="router-scale"),
    pytest.param({"shared_kv": 4}, r"shared_kv_layers 4: no earlier layer of the same kind", id="shared-kv-no-source"),
]


@pytest.mark.parametrize("kw,message", BAD)
def test_an_inconsistent_file_names_the_key_or_tensor(tmp_path, kw, message):
    path = tm.write_test_model(tmp_path / "bad.gguf", "gemma4", **kw)
    with pytest.raises((_engine.ModelError, _engine.GGUFError), match=message):
        _engine.Engine(str(path), n_threads=1)


def test_the_real_26b_a4b_header_reads_as_llama_cpp_reads_it(tmp_path):
    """tests/data/vocab/ggml-vocab-gemma-4.gguf carries a real Gemma 4 26B-A4B file's gemma4.* keys (per-layer
    head_count_kv and sliding_window_pattern arrays, key_length 512 / key_length_swa 256, 128 experts): written
    again beside a stand-in token_embd of 8 rows (and tiny tensors standing in for the rest), its hyper-parameters and KV geometry come out as llama.cpp's."""
    import gguf

    from support.gguf_vocab import vocab_meta

    meta = {k: v for k, v in vocab_meta("gemma-4").items() if k.startswith("gemma4.")}
    w = gguf.GGUFWriter(str(tmp_path / "header.gguf"), "gemma4")
    for key, v in meta.items():
        if isinstance(v, list):
            w.add_array(key, v)
        elif isinstance(v, float):
            w.add_float32(key, v)
        else:
            w.add_uint32(key, int(v))
    w.add_tensor("token_embd.weight", np.zeros((8, meta["gemma4.embedding_length"]), np.float32))
    for i in range(5 * meta["gemma4.block_count"]):  # the loader bounds block_count by the tensor count
        w.add_tensor(f"pad.{i}", np.zeros(1, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    g = _engine.kv_geometry(str(tmp_path / "header.gguf"), block_size=16, n_ctx=4096)
    h = g["hparams"]
    assert (h["arch"], h["n_layer"], h["n_head"], h["head_dim"], h["n_swa"]) == ("gemma4", 30, 16, 512, 1024)
    assert (h["n_expert"], h["n_expert_used"], h["n_ff"]) == (128, 8, 2112)
    # K floats per token: 25 local layers of 8 heads x 256, 5 global ones of 2 heads x 512 (llama.cpp's iSWA widths)
    assert g["bytes_per_block"] == 2 * 16 * (25 * 8 * 256 + 5 * 2 * 512) * 2


def test_a_gemma4_model_with_the_real_vocabulary_and_template_serves_chats(tmp_path):
    """A random gemma4 file carrying the real Gemma 4 tokenizer (262144 tokens, its merges, special tokens) and
    chat template behind `pyserve serve`: /v1/models names the architecture, a raw completion is the engine's
    greedy continuation of /tokenize's ids (the real tokenizer both ways), a chat streams what it returns whole."""
    import httpx
    import openai

    from pyserve.bench.launch import ServerProcess
    from support.gguf_vocab import vocab_meta

    meta = vocab_meta("gemma-4")
    vocab = {k: v for k, v in meta.items() if k.startswith("tokenizer.ggml.")}
    path = tm.write_test_model(tmp_path / "g4v.gguf", "gemma4", qtype="Q8_0", vocab=vocab,
                               chat_template=meta["tokenizer.chat_template"])
    with ServerProcess("--model", str(path)).wait_ready() as srv:
        assert httpx.get(srv.url + "/v1/models", timeout=60).json()["data"][0]["architecture"] == "gemma4"
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        prompt = "The capital of France is"
        ids = httpx.post(srv.url + "/tokenize", json={"model": srv.model, "prompt": prompt}, timeout=60).json()["tokens"]
        out = client.completions.create(model=srv.model, prompt=prompt, max_tokens=6, temperature=0, logprobs=1)
        eng = _engine.Engine(str(path), n_threads=1)
        want = list(ids)
        for _ in range(len(out.choices[0].logprobs.tokens)):
            want.append(int(eng.prompt_logits(want)[-1].argmax()))
        got = httpx.post(srv.url + "/detokenize", json={"model": srv.model, "tokens": want[len(ids):]}, timeout=60)
        assert out.choices[0].text == got.json()["prompt"]
        msgs = [{"role": "user", "content": "Hello there"}]
        whole = client.chat.completions.create(model=srv.model, messages=msgs, max_tokens=8, temperature=0)
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model=srv.model, messages=msgs, max_tokens=8, temperature=0, stream=True) if c.choices)
        assert streamed == (whole.choices[0].message.content or "") and whole.usage.prompt_tokens > 4
