"""Speculative decoding with the model's own multi-token-prediction (MTP, llama.cpp's NextN) layer as the drafter:
Qwen3.5/3.6 files (qwen35, qwen35moe) and GLM-4.5 (glm4moe) carry one after their layers. `speculative_method
"mtp"` (vLLM: --speculative-config '{"method": "mtp"}', or its model-named "qwen3_next_mtp", …) runs it after
each step over the rows whose next token is known, and its guess at the token after the pending one is the
next step's draft, verified by the target as every draft is.

What holds it right: the MTP layer's logits are the NumPy reference's (numpy_ref_mtp.py); outputs with MTP drafts
are the bits without speculation — greedy and seeded, alone, batched in chunks, n > 1, preempted — on files
whose MTP block "echoes" (model_factory mtp="echo": its guess is that the token comes again) so that drafts are
both accepted and rejected; the MTP layer's K/V are counted in the cache's bytes; a file without MTP layers is
refused in words; and the server takes vLLM's spelling.
"""
from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from pyserve import _engine
from pyserve.bench.launch import ServerProcess
from pyserve.bench.prometheus import total
from pyserve.engine.options import EngineOptions
from pyserve.engine.speculative import speculation
from support import model_factory as tm
from support import numpy_ref_mtp as ref
from support.live_server import metrics
from support.spec_runs import GREEDY, SEEDED, batched_the_same, each, run, spec_counts

MTP = {"speculative_ngram": 1, "speculative_method": "mtp"}


def prompts() -> dict:
    """A token repeated (an echoing MTP block's guesses stand while the target repeats it) and random text."""
    _, _, _, bos, _ = tm.tokenizer_vocab()
    rng = np.random.default_rng(5)
    out = {f"c{i}": [bos] + [10 + 7 * i] * (12 + i) for i in range(3)}
    out.update({f"r{i}": [bos] + [int(t) for t in rng.integers(0, bos, 30 + 9 * i)] for i in range(2)})
    return out


PROMPTS = prompts()


@pytest.fixture(scope="module", params=tm.hybrid.ARCHS)
def echo(tmp_path_factory, request):
    return tm.write_test_model(tmp_path_factory.mktemp("mtp") / f"{request.param}.gguf", request.param, mtp="echo")


def engine(path, mtp: bool, **kw):
    """mtp: drafts by the MTP layer, every one taken (what is drafted depends on the tokens alone)."""
    return _engine.Engine(str(path), n_threads=2, **(MTP if mtp else {}), speculative_price_drafts=False, **kw)


def alone(path, sampling: dict, max_tokens: int = 40, n: int = 1) -> dict:
    return each(lambda: engine(path, False), PROMPTS, sampling, max_tokens, n)


@pytest.mark.parametrize("arch", tm.hybrid.ARCHS)
def test_the_mtp_layer_is_the_numpy_reference(tmp_path, arch):
    """F32: the layer's arithmetic (quantized files round activations; their drafts are checked by the bits)."""
    path = tm.write_test_model(tmp_path / f"{arch}.gguf", arch, mtp=True)
    toks = PROMPTS["r1"]
    eng = engine(path, True)
    got, want = eng.mtp_logits(toks), ref.ref_mtp_logits(path, toks)
    assert got.shape == want.shape == (len(toks) - 1, eng.hparams["n_vocab"])
    np.testing.assert_allclose(got, want, atol=0.01)
    assert (got.argmax(1) == want.argmax(1)).all()


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_alone_the_same_with_drafts_accepted_and_rejected(echo, sampling):
    on = engine(echo, True)
    assert each(lambda: on, PROMPTS, sampling) == alone(echo, sampling)
    drafts, drafted, accepted = spec_counts(on)
    assert drafted == drafts > accepted > 0  # one token a draft


def test_batched_in_chunks_n3_and_preempted_the_same(echo):
    on = engine(echo, True, max_num_batched_tokens=9, block_size=4)  # prompts in chunks beside drafted decodes
    batched_the_same(on, PROMPTS, lambda sampling: alone(echo, sampling))
    on = engine(echo, True)
    assert run(on, PROMPTS, SEEDED, n=3) == alone(echo, SEEDED, n=3)  # each sample drafts from its own guesses
    on = engine(echo, True, block_size=4, num_kv_blocks=36)
    assert run(on, PROMPTS, GREEDY, max_tokens=48) == alone(echo, GREEDY, max_tokens=48)
    assert on.stats()["preemptions"] > 0 and spec_counts(on)[2] > 0


def test_no_guess_where_no_draft_would_be_taken(echo):
    """Drafts priced (the default): where a second row costs so much that no draft would pay, the MTP layer
    makes no guesses (no pass through the output head); where it costs nothing it guesses on every decode.
    The tokens are the same either way."""
    guesses, outputs = [], []
    for second_row in (100.0, 1.0):
        eng = _engine.Engine(str(echo), n_threads=2, **MTP)
        eng.set_row_costs([0.0, 1.0, second_row])
        outputs.append(each(lambda: eng, PROMPTS, GREEDY))
        guesses.append(eng.stats()["mtp_guesses"])
        assert (spec_counts(eng)[0] > 0) == (second_row == 1.0)
    assert guesses[0] == 0 and guesses[1] >= len(PROMPTS) * 20
    assert outputs[0] == outputs[1] == alone(echo, GREEDY)


def test_glm_drafts_by_its_nextn_block_the_same(tmp_path):
    path = tm.write_test_model(tmp_path / "glm.gguf", "glm4moe", qtype="Q8_0")
    on = engine(path, True)
    assert run(on, PROMPTS, GREEDY) == alone(path, GREEDY)
    assert spec_counts(on)[1] > 0


def test_an_abort_mid_stream_frees_every_block(echo):
    on = engine(echo, True, max_num_seqs=2)
    on.add("a", PROMPTS["c0"], GREEDY, 300, True)
    on.add("b", PROMPTS["r0"], SEEDED, 300, True, n=2)
    while spec_counts(on)[0] < 10:
        assert on.step()
    on.abort("a"), on.abort("b")
    assert {o.finish_reason for o in on.step()} == {"abort"}
    s = on.stats()
    assert (s["blocks_used"], s["state_slots_used"], s["running"], s["waiting"]) == (0, 0, 0, 0)


def test_the_mtp_layers_kv_is_counted_in_the_cache(echo):
    """qwen35's 4 test layers have one attention layer; the MTP layer doubles each block's K/V bytes."""
    geo = {m: EngineOptions(speculative_ngram=1, speculative_method=m).kv_geometry(str(echo)) for m in ("ngram", "mtp")}
    assert geo["mtp"]["bytes_per_block"] == 2 * geo["ngram"]["bytes_per_block"]
    assert engine(echo, True).config["num_kv_blocks"] == geo["mtp"]["num_kv_blocks"]


def test_a_file_without_mtp_layers_is_refused_in_words(tmp_path):
    path = tm.write_test_model(tmp_path / "plain.gguf", "qwen35")
    with pytest.raises(ValueError, match=r"no MTP \(NextN\) layers"):
        EngineOptions(**MTP).kv_geometry(str(path))
    with pytest.raises(ValueError, match=r"no MTP \(NextN\) layers"):
        _engine.Engine(str(path), n_threads=1, **MTP)
    with pytest.raises(ValueError, match="speculative_method must be one of ngram, mtp"):
        EngineOptions(speculative_method="eagle")
    with pytest.raises(ValueError, match="the engine does not draft by MTP"):
        _engine.Engine(str(path), n_threads=1).mtp_logits([1, 2, 3])
    engine(path, False, speculative_method="mtp")  # speculation off: the method does not matter


@pytest.mark.parametrize("config,options", [
    ({"method": "mtp"}, {"speculative_ngram": 1, "speculative_method": "mtp"}),
    ({"method": "qwen3_next_mtp", "num_speculative_tokens": 2}, {"speculative_ngram": 2, "speculative_method": "mtp"}),
    ({"method": "ngram", "num_speculative_tokens": 4}, {"speculative_ngram": 4, "speculative_method": "ngram"}),
])
def test_vllms_speculative_config(config, options):
    assert speculation(config) == speculation(json.dumps(config)) == options


def test_vllms_speculative_config_refuses_draft_models():
    with pytest.raises(ValueError, match="method 'eagle' is not supported"):
        speculation({"method": "eagle"})


def test_served_with_vllms_spelling_the_same_as_without(echo):
    body = {"prompt": "Hello hello hello hello hello", "max_tokens": 32, "temperature": 0, "logprobs": 1}
    results, counts = [], []
    cfg = json.dumps({"method": "qwen3_next_mtp", "num_speculative_tokens": 2})
    for flags in (("--speculative-config", cfg, "--no-speculative-price-drafts"), ("--speculative-ngram", "0")):
        with ServerProcess("--model", str(echo), *flags).wait_ready() as srv:
            r = httpx.post(srv.url + "/v1/completions", json={"model": srv.model, **body}, timeout=60)
            assert r.status_code == 200, r.text
            ch = r.json()["choices"][0]
            results.append((ch["text"], ch["logprobs"]["token_logprobs"]))
            counts.append(total(metrics(srv.url), "pyserve:spec_decode_num_draft_tokens_total"))
    assert results[0] == results[1] and counts[0] > 0 and counts[1] == 0
