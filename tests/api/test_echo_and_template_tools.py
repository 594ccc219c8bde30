"""Two defects llama.cpp's and vLLM's server suites found, held against real servers:

- /v1/completions with echo + logprobs: `text`, `tokens` and `text_offset` follow one rule (a special token
  adds "" to the text while skip_special_tokens is on, and shows as ""; its text in both when off), so each
  offset is where its token starts in the text, for the echoed prompt, the generated part and the stream;
- /apply-template and /tokenize with messages render tools and chat_template_kwargs exactly as a chat
  request does: the same prompt text, the same ids, the same prompt_tokens.
"""
from __future__ import annotations

import json

import httpx
import pytest

from pyserve.bench.launch import ServerProcess
from support.paths import DATA
from support.sse_client import streamed_logprobs

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city, in degrees",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Weather in Paris?"}]
LLAMA32 = next(json.loads(line)["template"] for line in
               (DATA / "chat_templates" / "cases.jsonl").read_text().splitlines()
               if json.loads(line)["family"] == "llama-3.2-instruct")


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory):
    """A template that renders tools itself and reads kwargs (date_string, tools_in_user_message)."""
    path = tmp_path_factory.mktemp("tpl") / "llama32.jinja"
    path.write_text(LLAMA32)
    s = ServerProcess("--chat-template", str(path), threads=1).wait_ready()
    yield s
    assert s.stop() == 0, "".join(s.stderr)[-3000:]


def _post(server, path: str, body: dict) -> dict:
    r = httpx.post(server.url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _check_consistent(text: str, lp: dict, n_prompt: int) -> None:
    """OpenAI's legacy contract: one entry per token (the echoed prompt's first logprob null), each offset
    where its token starts in `text`, the entries spelling the text."""
    tokens, offsets = lp["tokens"], lp["text_offset"]
    assert len(tokens) == len(lp["token_logprobs"]) == len(offsets) == len(lp["top_logprobs"]) > n_prompt
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(v is not None for v in lp["token_logprobs"][1:])
    assert offsets == sorted(offsets) and offsets[0] == 0
    for tok, off in zip(tokens, offsets):
        if tok:
            assert text[off:].startswith(tok), (tok, off, text)
    assert "".join(tokens) == text
    assert all(tok in top for tok, top in zip(tokens[1:], lp["top_logprobs"][1:]))  # lm-eval's greedy check


PROMPT = "Hello, my name is"


def _ids(server, text: str) -> list[int]:
    return _post(server, "/tokenize", {"prompt": text})["tokens"]


@pytest.mark.parametrize("as_ids", [False, True])
def test_echoed_special_tokens_add_nothing_to_text_or_tokens(server, as_ids):
    ids = _ids(server, PROMPT)
    assert ids[0] == 2  # <bos>, added by the tokenizer
    body = {"prompt": ids if as_ids else PROMPT, "echo": True, "logprobs": 2, "max_tokens": 6, "temperature": 0}
    r = _post(server, "/v1/completions", body)
    c = r["choices"][0]
    assert r["usage"]["prompt_tokens"] == len(ids)
    assert c["text"].startswith(PROMPT) and len(c["text"]) > len(PROMPT)
    lp = c["logprobs"]
    assert lp["tokens"][:2] == ["", "Hello"] and lp["text_offset"][:3] == [0, 0, 5]
    assert "".join(lp["tokens"][:len(ids)]) == PROMPT and lp["text_offset"][len(ids)] == len(PROMPT)
    _check_consistent(c["text"], lp, len(ids))
    text, streamed = streamed_logprobs(server, body)
    assert text == c["text"] and streamed == lp


def test_with_skip_special_tokens_false_they_add_their_text_to_both(server):
    body = {"prompt": PROMPT, "echo": True, "logprobs": 1, "max_tokens": 4, "temperature": 0,
            "skip_special_tokens": False}
    c = _post(server, "/v1/completions", body)["choices"][0]
    assert c["text"].startswith("<bos>" + PROMPT)
    assert c["logprobs"]["tokens"][:2] == ["<bos>", "Hello"] and c["logprobs"]["text_offset"][:2] == [0, 5]
    _check_consistent(c["text"], c["logprobs"], len(_ids(server, PROMPT)))


def test_written_control_tokens_and_the_stop_token_follow_the_rule(server):
    prompt = "<start_of_turn>user\nSay hi<end_of_turn>\n<start_of_turn>model\n"
    n = len(_ids(server, prompt))
    base = {"prompt": prompt, "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0}
    first = _post(server, "/v1/completions", dict(base, echo=False, logprobs=None))["choices"][0]["text"]
    stop_id = _post(server, "/tokenize", {"prompt": first, "add_special_tokens": False})["tokens"][0]
    for skip in (True, False):
        body = dict(base, skip_special_tokens=skip, stop_token_ids=[stop_id], max_tokens=3)
        c = _post(server, "/v1/completions", body)["choices"][0]
        echo = prompt if not skip else "user\nSay hi\nmodel\n"
        assert c["text"] == "<bos>" * (not skip) + echo  # the stop token ends it and writes nothing
        assert c["finish_reason"] == "stop" and c["logprobs"]["tokens"][-1] == ""
        _check_consistent(c["text"], c["logprobs"], n)
        text, streamed = streamed_logprobs(server, body)
        assert text == c["text"] and streamed == c["logprobs"]


def _chat_prompt_tokens(server, body: dict) -> int:
    r = _post(server, "/v1/chat/completions", dict(body, max_tokens=1, temperature=0))
    return r["usage"]["prompt_tokens"]


def _rendered(server, body: dict) -> tuple[str, list[int]]:
    """/apply-template's prompt and /tokenize's ids for one chat body, checked against each other."""
    prompt = _post(server, "/apply-template", body)["prompt"]
    ids = _post(server, "/tokenize", body)["tokens"]
    assert ids == _ids(server, prompt)  # the ids are the prompt's
    return prompt, ids


def test_template_endpoints_render_tools_as_chat_does_polyfill(server):
    """The built-in Gemma format knows no tools: they go into the system turn (the JSON polyfill)."""
    body = {"messages": ASK, "tools": [WEATHER]}
    prompt, ids = _rendered(server, body)
    assert "get_weather" in prompt and "Current weather in a city, in degrees" in prompt
    assert len(ids) == _chat_prompt_tokens(server, body)
    plain, _ = _rendered(server, {"messages": ASK})
    assert "get_weather" not in plain
    assert _rendered(server, dict(body, tool_choice="none"))[0] == plain  # none leaves the tools out


def test_template_endpoints_render_tools_and_kwargs_as_chat_does_native(llama_server):
    body = {"messages": ASK, "tools": [WEATHER]}
    prompt, ids = _rendered(llama_server, body)
    assert "Environment: ipython" in prompt and '"name": "get_weather"' in prompt
    assert '"description": "Current weather in a city, in degrees"' in prompt
    assert len(ids) == _chat_prompt_tokens(llama_server, body)
    kw = dict(body, chat_template_kwargs={"date_string": "01 Jan 2000", "tools_in_user_message": False})
    moved, moved_ids = _rendered(llama_server, kw)
    assert "Today Date: 01 Jan 2000" in moved and "Today Date: 01 Jan 2000" not in prompt
    system = moved[:moved.index("<|eot_id|>")]
    assert "get_weather" in system and "get_weather" not in prompt[:prompt.index("<|eot_id|>")]
    assert len(moved_ids) == _chat_prompt_tokens(llama_server, kw)
    closed, _ = _rendered(llama_server, dict(body, add_generation_prompt=False))
    assert prompt == closed + "<|start_header_id|>assistant<|end_header_id|>\n\n"


def test_template_endpoints_refuse_what_chat_refuses(server):
    for path in ("/apply-template", "/tokenize"):
        r = httpx.post(server.url + path, json={"messages": ASK, "tool_choice": "required"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice", r.text
        r = httpx.post(server.url + path, json={"messages": ASK, "tools": [WEATHER, WEATHER]})
        assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text


def test_byte_fallback_tokens_keep_the_offsets_on_the_text(server):
    """Characters outside the vocabulary are spelled by byte tokens: a token whose bytes leave a character
    incomplete adds "", the one completing it the character, so no offset drifts past what precedes it."""
    prompt = "Signs 𓀀 and 🜁 mean"
    ids = _ids(server, prompt)
    body = {"prompt": prompt, "echo": True, "logprobs": 2, "max_tokens": 5, "temperature": 0}
    c = _post(server, "/v1/completions", body)["choices"][0]
    lp = c["logprobs"]
    assert c["text"].startswith(prompt) and "".join(lp["tokens"][:len(ids)]) == prompt
    assert lp["tokens"][:len(ids)].count("") >= 1 + 3 + 3  # <bos>, and three bytes of each 4-byte character
    assert lp["text_offset"][len(ids)] == len(prompt)
    _check_consistent(c["text"], lp, len(ids))
    text, streamed = streamed_logprobs(server, body)
    assert text == c["text"] and streamed == lp


def test_a_stop_string_inside_a_token_cuts_its_entry_with_the_text(server):
    """The text ends where the stop string starts, inside a token: that token's entry keeps what is left of
    it, the ones after it "", so every entry and offset stays inside the text."""
    body = {"prompt": PROMPT, "logprobs": 1, "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    free = _post(server, "/v1/completions", body)["choices"][0]
    pieces = free["logprobs"]["tokens"]
    k = next(i for i, p in enumerate(pieces) if i > 0 and len(p.strip()) >= 3)  # a word of 3+ letters
    stop = pieces[k][2:] + "".join(pieces[k + 1:k + 3])
    c = _post(server, "/v1/completions", dict(body, stop=[stop]))["choices"][0]
    expect = "".join(pieces[:k]) + pieces[k][:2]
    assert c["text"] == expect and c["finish_reason"] == "stop"
    lp = c["logprobs"]
    assert "".join(lp["tokens"]) == c["text"] and lp["tokens"][k] == pieces[k][:2]
    assert all(off <= len(c["text"]) for off in lp["text_offset"])
    assert lp["text_offset"] == [sum(map(len, lp["tokens"][:i])) for i in range(len(lp["tokens"]))]
    text, streamed = streamed_logprobs(server, dict(body, stop=[stop]))
    assert text == c["text"] and streamed == lp  # a token's entry waited while the stop string held its text
