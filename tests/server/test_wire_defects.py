"""Defects real clients found (issue 15, section 3), each held by a test against a real server."""
from __future__ import annotations

import httpx
import openai
import pytest

from support.live_server import MODEL, one_thread_client, one_thread_server  # noqa: F401 (the module's client and server)
from support.sse_client import streamed_logprobs


@pytest.mark.parametrize("body", [
    {"prompt": "𓀀𓀀𓀀𓀀", "max_tokens": 12, "ignore_eos": True},  # tokens that end inside a UTF-8 character
    {"prompt": "1, 2, 3, 4,", "max_tokens": 16, "stop": [", 7, 8, X"]},  # a held-back possible stop string
])
def test_streamed_completion_logprobs_deliver_every_entry_once(server, body):
    body = dict(body, temperature=0, logprobs=2)
    whole = httpx.post(server.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]
    text, lp = streamed_logprobs(server, body)
    assert text == whole["text"]
    assert lp == whole["logprobs"]
    assert len(lp["tokens"]) == len(lp["text_offset"]) >= 12
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(lp["tokens"]))]


def test_unknown_paths_answer_openai_errors(server):
    for method, path in [("POST", "/v1/images/generations"), ("GET", "/v1/nowhere"), ("POST", "/v1/audio/speech")]:
        r = httpx.request(method, server.url + path, json={})
        assert r.status_code == 404 and r.headers["content-type"].startswith("application/json")
        err = r.json()["error"]
        assert err["code"] == "not_found" and path in err["message"] and "not supported" in err["message"]


def test_add_special_tokens_false_sends_no_bos(server, client):
    with_bos = client.completions.create(model=MODEL, prompt="Hello there", max_tokens=1, temperature=0)
    without = client.completions.create(model=MODEL, prompt="Hello there", max_tokens=1, temperature=0,
                                        extra_body={"add_special_tokens": False})
    assert without.usage.prompt_tokens == with_bos.usage.prompt_tokens - 1
    msgs = [{"role": "user", "content": "Hi"}]
    auto = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=1)
    none = client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=1,
                                          extra_body={"add_special_tokens": False})
    assert none.usage.prompt_tokens == auto.usage.prompt_tokens  # the template writes its own <bos>
    plain = "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n"  # a template without one
    ids = httpx.post(server.url + "/tokenize", json={"prompt": plain, "add_special_tokens": False}).json()["tokens"]
    assert ids[0] != 2


def test_request_ids(server, client):
    raw = client.completions.with_raw_response.create(model=MODEL, prompt="Hi", max_tokens=1)
    assert raw.request_id and raw.parse().id == f"cmpl-{raw.request_id}"
    r = httpx.post(server.url + "/v1/chat/completions", headers={"X-Request-Id": "trace-42.a"},
                   json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})
    assert r.headers["x-request-id"] == "trace-42.a" and r.json()["id"] == "chatcmpl-trace-42.a"
    twice = [httpx.post(server.url + "/v1/completions", headers={"X-Request-Id": "same"},
                        json={"prompt": "Hi", "max_tokens": 1}) for _ in range(2)]
    assert [t.status_code for t in twice] == [200, 200]
    for bad in ("x" * 129, "has space", "semi;colon"):
        r = httpx.post(server.url + "/v1/completions", headers={"X-Request-Id": bad}, json={"prompt": "Hi"})
        assert r.status_code == 400 and "X-Request-Id" in r.json()["error"]["message"]


def test_completion_top_logprobs_hold_the_sampled_token(client):
    r = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=6, temperature=0, logprobs=0)
    lp = r.choices[0].logprobs
    assert all(list(top) == [tok] for tok, top in zip(lp.tokens, lp.top_logprobs))
    r = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=12, temperature=2, seed=3,
                                  logprobs=1)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 12
    for tok, tok_lp, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert tok in top and top[tok] == tok_lp and 1 <= len(top) <= 2


@pytest.mark.parametrize("seed,ok", [(2**63, False), (-2**63 - 1, False), (2**63 - 1, True), (-2**63, True)])
def test_seed_must_be_an_int64(server, seed, ok):
    r = httpx.post(server.url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1, "seed": seed})
    assert r.status_code == (200 if ok else 400), r.text
    if not ok:
        assert r.json()["error"]["param"] == "seed"


def test_continue_final_message(server):
    msgs = [{"role": "user", "content": "Say something"}, {"role": "assistant", "content": "The river keeps"}]
    both = httpx.post(server.url + "/v1/chat/completions", json={"messages": msgs, "continue_final_message": True,
                                                                 "add_generation_prompt": True})
    assert both.status_code == 400 and both.json()["error"]["param"] == "continue_final_message"
    closed = httpx.post(server.url + "/apply-template", json={"messages": msgs}).json()["prompt"]
    assert closed.endswith("The river keeps<end_of_turn>\n<start_of_turn>model\n")
    for path in ("/apply-template", "/tokenize"):
        r = httpx.post(server.url + path, json={"messages": msgs, "continue_final_message": True})
        assert r.status_code == 200, r.text
    prompt = httpx.post(server.url + "/apply-template", json={"messages": msgs, "continue_final_message": True})
    assert prompt.json()["prompt"] == closed[:closed.index("The river keeps") + len("The river keeps")]
    ids = httpx.post(server.url + "/tokenize", json={"messages": msgs, "continue_final_message": True}).json()
    expect = httpx.post(server.url + "/tokenize", json={"prompt": prompt.json()["prompt"],
                                                         "add_special_tokens": False}).json()
    assert ids["tokens"] == expect["tokens"]
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": msgs, "continue_final_message": True,
                                                              "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(ids["tokens"])


def test_paths_without_v1(server):
    base = openai.OpenAI(base_url=server.url, api_key="none", max_retries=0)  # no /v1 in the base URL
    assert [m.id for m in base.models.list().data] == [MODEL]
    assert base.models.retrieve(MODEL).id == MODEL
    assert base.completions.create(model=MODEL, prompt="Hi", max_tokens=2).usage.completion_tokens == 2
    c = base.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=2)
    assert c.usage.completion_tokens == 2


def test_tokenizer_info_for_remote_tokenizers(server):
    """What lm-eval's RemoteTokenizer reads: special tokens (their ids through /tokenize without special
    tokens added), the chat template, the length."""
    info = httpx.get(server.url + "/tokenizer_info").json()
    assert (info["bos_token"], info["eos_token"], info["add_bos_token"]) == ("<bos>", "<eos>", True)
    assert info["model_max_length"] == 8192 and "<start_of_turn>" in info["chat_template"]
    ids = [httpx.post(server.url + "/tokenize", json={"prompt": info[k], "add_special_tokens": False}).json()["tokens"]
           for k in ("bos_token", "eos_token")]
    assert ids == [[2], [1]]
    assert httpx.post(server.url + "/detokenize", json={"tokens": [2, 1]}).json()["prompt"] == "<bos><eos>"


def test_min_tokens_holds_off_every_end(client, server):
    eos_first = {"1": 100}  # <eos> (id 1) made the certain next token: the sample ends at once
    free = client.completions.create(model=MODEL, prompt="Hello", max_tokens=20, logit_bias=eos_first)
    assert (free.choices[0].finish_reason, free.usage.completion_tokens) == ("stop", 1)
    held = client.completions.create(model=MODEL, prompt="Hello", max_tokens=20, logit_bias=eos_first,
                                     extra_body={"min_tokens": 6})
    assert (held.choices[0].finish_reason, held.usage.completion_tokens) == ("stop", 7)  # 6 others, then <eos>
    r = client.completions.create(model=MODEL, prompt="1, 2, 3,", max_tokens=30, temperature=0, stop=[","],
                                  extra_body={"min_tokens": 5})
    assert r.usage.completion_tokens >= 5 and r.choices[0].finish_reason == "stop"
    bad = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2, "min_tokens": 3})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "min_tokens"
    bad = httpx.post(server.url + "/v1/completions", json={"prompt": "x", "min_tokens": -1})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "min_tokens"
