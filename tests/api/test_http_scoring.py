"""/v1/embeddings and prompt logprobs (echo + logprobs, vLLM's prompt_logprobs) over HTTP, with the openai SDK
and httpx against a real server: what evaluation harnesses and RAG pipelines send."""
from __future__ import annotations

import base64

import httpx
import numpy as np
import pytest

from support.live_server import MODEL, one_thread_client, one_thread_server  # noqa: F401 (the module's client and server)
from support.sse_client import streamed_logprobs


def _tokens(server, text: str) -> list[int]:
    return httpx.post(server.url + "/tokenize", json={"prompt": text}).json()["tokens"]


def test_embeddings_with_the_sdk(server, client):
    texts = ["The cat sat on the mat.", "A dog ran in the park.", "The cat sat on the mat."]
    default = client.embeddings.create(model=MODEL, input=texts)  # the SDK asks for base64 and decodes it
    floats = client.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    a = np.array([d.embedding for d in default.data])
    b = np.array([d.embedding for d in floats.data])
    assert a.shape == (3, 640) and [d.index for d in floats.data] == [0, 1, 2]
    assert np.array_equal(a, b)  # base64 is the same float32 bytes
    assert np.allclose(np.linalg.norm(b, axis=1), 1.0, atol=1e-5)  # L2-normalised by default
    assert np.array_equal(b[0], b[2]) and not np.allclose(b[0], b[1])
    assert floats.usage.prompt_tokens == floats.usage.total_tokens == sum(len(_tokens(server, t)) for t in texts)
    by_ids = client.embeddings.create(model=MODEL, input=[_tokens(server, texts[1])], encoding_format="float")
    assert np.array_equal(np.array(by_ids.data[0].embedding), b[1])  # token ids == text
    raw = httpx.post(server.url + "/v1/embeddings", json={"input": texts[0], "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    assert np.array_equal(decoded, b[0].astype(np.float32)) and raw["object"] == "list"


@pytest.mark.parametrize("body,param,code", [
    ({"input": ""}, "input", None), ({"input": []}, "input", None), ({"input": [""]}, "input", None),
    ({"input": "x", "dimensions": 64}, "dimensions", None), ({"input": "x", "encoding_format": "hex"}, "encoding_format", None),
    ({"input": [[5] * 9000]}, "input", "context_length_exceeded"), ({"input": [[300000]]}, "input", None),
])
def test_embeddings_refusals(server, body, param, code):
    r = httpx.post(server.url + "/v1/embeddings", json=body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and (code is None or err["code"] == code), err


def test_echo_logprobs_score_the_prompt_as_lm_eval_asks(server, client):
    prompt = "The capital of France is Paris. The capital of Italy is"
    ids = _tokens(server, prompt)
    gen = client.completions.create(model=MODEL, prompt=prompt, max_tokens=6, temperature=0, logprobs=1)
    g = gen.choices[0].logprobs
    # lm-eval's log-likelihood request, over prompt + what was generated
    body = {"prompt": [ids + _tokens(server, gen.choices[0].text)[1:]], "echo": True, "logprobs": 1,
            "max_tokens": 1, "temperature": 0}
    r = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
    lp = r["logprobs"]
    n = len(body["prompt"][0])
    assert len(lp["token_logprobs"]) == n + 1 and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    # the scored continuation's logprobs are the ones the engine gave those tokens when it generated them
    assert lp["token_logprobs"][len(ids):n] == pytest.approx(g.token_logprobs, abs=1e-5)
    assert lp["tokens"][len(ids):n] == g.tokens
    assert all(tok in top for tok, top in zip(lp["tokens"][1:], lp["top_logprobs"][1:]))
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(n + 1)]
    alone = httpx.post(server.url + "/v1/completions", json=dict(body, max_tokens=0)).json()["choices"][0]
    assert alone["logprobs"]["token_logprobs"] == lp["token_logprobs"][:n]
    assert alone["text"] == prompt + gen.choices[0].text  # the echo of token ids is their text
    assert r["text"].startswith(alone["text"]) and len(r["text"]) > len(alone["text"])


def test_streamed_echo_logprobs_equal_the_whole(server):
    body = {"prompt": "One, two, three,", "echo": True, "logprobs": 2, "max_tokens": 5, "temperature": 0}
    whole = httpx.post(server.url + "/v1/completions", json=body).json()["choices"][0]
    text, lp = streamed_logprobs(server, body)
    assert text == whole["text"] and lp == whole["logprobs"]


def test_vllm_prompt_logprobs_on_both_endpoints(server):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "Hello world", "max_tokens": 1,
                                                         "prompt_logprobs": 2, "temperature": 0}).json()
    plp = r["choices"][0]["prompt_logprobs"]
    ids = _tokens(server, "Hello world")
    assert len(plp) == len(ids) and plp[0] is None
    for tid, entry in zip(ids[1:], plp[1:]):
        assert str(tid) in entry and 2 <= len(entry) <= 3
        assert sorted(e["rank"] for e in entry.values() if e["rank"] is not None) == [1, 2]
    c = httpx.post(server.url + "/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                              "max_tokens": 1, "prompt_logprobs": 0}).json()
    assert c["prompt_logprobs"][0] is None and len(c["prompt_logprobs"]) == c["usage"]["prompt_tokens"]
    assert all(len(e) == 1 for e in c["prompt_logprobs"][1:])
    bad = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 0})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_tokens"
