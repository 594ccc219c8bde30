"""Every model family behind the real server, with what the server does for the default model: a random model
of each architecture model_factory writes (the MoE ones included) served by `pyserve serve` on a loopback port
and driven with the openai SDK. Greedy text is what the engine's own prefill argmax gives, streamed equals
not streamed, a repeated prompt is served from the prefix cache with the same text, n=2 forks two samples,
and speculative decoding (on by default) gives the same bits as a server without it. A hybrid (qwen35: recurrent
DeltaNet layers; lfm2: gated short convs) serves from its own state slots (speculation's draft slots among them),
its prefix cache resumes from state checkpoints, and a client that goes away frees its slot as it frees its blocks.
"""
from __future__ import annotations

import httpx
import openai
import pytest

from pyserve import _engine
from pyserve.bench.launch import ServerProcess
from pyserve.bench.prometheus import total
from support import model_factory as tm
from support.live_server import metrics, poll

PROMPT = "Hello world and the world of the " * 6  # 48 tokens: whole KV blocks for the prefix cache
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("families")
    return {arch: tm.write_test_model(d / f"{arch}.gguf", arch, qtype="Q8_0", name=f"family {arch}")
            for arch in tm.ARCHS}


def sdk(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def greedy(client: openai.OpenAI, model: str, stream: bool = False, **kw) -> tuple[str, list[float], object]:
    out = client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, temperature=0, logprobs=1,
                                    stream=stream, **kw)
    if not stream:
        ch = out.choices[0]
        return ch.text, ch.logprobs.token_logprobs, out.usage
    text, lps = "", []
    for chunk in out:
        for ch in chunk.choices:
            text += ch.text
            lps += ch.logprobs.token_logprobs if ch.logprobs else []
    return text, lps, None


def engine_greedy(path, prompt_ids: list[int], n: int) -> list[int]:
    """Greedy tokens from the engine's prefill argmax, one token at a time (no server, no KV cache reuse)."""
    eng = _engine.Engine(str(path), n_threads=1)
    ids = list(prompt_ids)
    for _ in range(n):
        tok = int(eng.prompt_logits(ids)[-1].argmax())
        ids.append(tok)
        if tok == tm.tokenizer_vocab()[4]:
            break
    return ids[len(prompt_ids):]


@pytest.mark.parametrize("arch", tm.ARCHS)
def test_a_family_serves_as_the_default_model_does(models, arch):
    with ServerProcess("--model", str(models[arch])).wait_ready() as srv:
        client = sdk(srv)
        text, lps, usage = greedy(client, srv.model)
        card = httpx.get(srv.url + "/v1/models", timeout=60).json()["data"][0]
        assert (card["architecture"], card["max_model_len"]) == (arch, 512)
        expected = engine_greedy(models[arch], post(srv, "/tokenize", prompt=PROMPT)["tokens"], MAX_TOKENS)
        assert text == post(srv, "/detokenize", tokens=expected)["prompt"] and len(lps) == len(expected)
        assert greedy(client, srv.model, stream=True)[:2] == (text, lps)
        again = greedy(client, srv.model)
        assert again[:2] == (text, lps) and again[2].prompt_tokens_details.cached_tokens > 0
        texts = [[c.text for c in sampled(client, srv.model).choices] for _ in range(2)]
        assert texts[0] == texts[1] and len(texts[0]) == 2  # n=2 with a seed: two samples, reproducible


def post(srv: ServerProcess, path: str, **body) -> dict:
    r = httpx.post(srv.url + path, json={"model": srv.model, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def sampled(client: openai.OpenAI, model: str):
    return client.completions.create(model=model, prompt=PROMPT, max_tokens=MAX_TOKENS, n=2, seed=7, temperature=1.0)


@pytest.mark.parametrize("arch", tm.MOE_ARCHS + ("qwen35",))
def test_speculative_decoding_changes_no_bit_on_a_moe_or_hybrid_model(models, arch):
    """The hybrids too: their drafted rows' state rolled back where rejected. Every match drafted (as served,
    drafts are priced on forward times measured at load, so whether a tiny model drafts depends on the machine)."""
    results, drafted = [], []
    for flags in (("--no-speculative-price-drafts",), ("--speculative-ngram", "0")):
        with ServerProcess("--model", str(models[arch]), *flags).wait_ready() as srv:
            client = sdk(srv)
            results.append([greedy(client, srv.model, stream)[:2] for stream in (False, True)])
            drafted.append(total(metrics(srv.url), "pyserve:spec_decode_num_draft_tokens_total"))
    assert results[0] == results[1]
    assert drafted[0] > 0 and drafted[1] == 0


@pytest.mark.parametrize("arch", tm.hybrid.ARCHS + tm.lfm2.ARCHS)
def test_a_hybrids_state_slots_are_reported_and_freed_on_disconnect(tmp_path, arch):
    long = tm.write_test_model(tmp_path / f"{arch}.gguf", arch, qtype="Q8_0", n_ctx=8192)  # a stream of seconds
    with ServerProcess("--model", str(long), "--max-num-seqs", "4").wait_ready() as srv:
        info = httpx.get(srv.url + "/server_info").json()["stats"]
        # a slot per seat, and one per row a step may draft (speculation is on by default)
        assert (info["state_slots_total"], info["state_slots_used"], info["blocks_used"]) == (4 + 7, 0, 0)
        body = {"model": srv.model, "prompt": PROMPT, "max_tokens": 8000, "temperature": 0, "ignore_eos": True,
                "stream": True}
        with httpx.Client(timeout=60) as c, c.stream("POST", srv.url + "/v1/completions", json=body) as r:
            lines = r.iter_lines()
            next(line for line in lines if line.startswith("data: {"))  # streaming: the sequence holds a slot
            assert httpx.get(srv.url + "/server_info").json()["stats"]["state_slots_used"] == 1
            def drafts() -> int:
                return httpx.get(srv.url + "/server_info").json()["stats"]["spec_drafts"]
            for i, _ in enumerate(lines):  # on until its steps have drafted (draft slots taken and given back)
                if i % 16 == 0 and drafts() > 0:
                    break
            assert drafts() > 0
        # the client went away: the slot is freed with the blocks
        poll(lambda: total(m := metrics(srv.url), "pyserve:recurrent_state_slots_used") == 0
             and total(m, "pyserve:kv_blocks_used") == 0 and total(m, "pyserve:num_requests_running") == 0,
             what="the slot freed")
        assert total(metrics(srv.url), "pyserve:recurrent_state_slots_total") == 4 + 7
