"""Structured output over HTTP, as clients send it: the openai SDK's `parse` with a pydantic model and
`response_format`, LangChain's `with_structured_output`, vLLM's `structured_outputs` / `guided_*` and
llama.cpp's `json_schema` / `grammar` on both endpoints; streamed equals non-streamed; each bad constraint is
a 400 naming its field."""
from __future__ import annotations

import json
import re
from typing import Literal, Optional

import httpx
import jsonschema
import pytest
from pydantic import BaseModel


class Person(BaseModel):
    name: str
    age: int


class Order(BaseModel):
    item: Literal["tea", "coffee", "water"]
    quantity: int
    note: Optional[str]


SCHEMA = {"type": "object", "additionalProperties": False, "required": ["city", "rank"],
          "properties": {"city": {"type": "string", "maxLength": 20}, "rank": {"type": "integer", "minimum": 1,
                                                                               "maximum": 10}}}
ASK = [{"role": "user", "content": "Name a city and its rank as JSON."}]


def post(server, path: str, **body) -> httpx.Response:
    return httpx.post(server.url + path, json={"model": server.model, **body}, timeout=120)


def test_sdk_parse_returns_the_pydantic_object(server, client):
    for model_cls in (Person, Order):
        r = client.chat.completions.parse(model=server.model, messages=ASK, response_format=model_cls,
                                          temperature=0, max_tokens=120)
        choice = r.choices[0]
        assert choice.finish_reason == "stop"
        assert isinstance(choice.message.parsed, model_cls)
        assert choice.message.parsed == model_cls.model_validate_json(choice.message.content)


def test_langchain_with_structured_output(server):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=server.model, base_url=server.url + "/v1", api_key="unused", temperature=0,
                     max_tokens=120, max_retries=0)
    out = llm.with_structured_output(Person).invoke("Tell me about a person.")
    assert isinstance(out, Person)
    raw = llm.with_structured_output(SCHEMA | {"title": "City"}).invoke("A city and its rank.")
    jsonschema.validate(raw, SCHEMA)


FORMS = [  # (endpoint, the body's constraint fields, how the text must look)
    ("/v1/chat/completions", {"response_format": {"type": "json_schema",
                                                  "json_schema": {"name": "c", "schema": SCHEMA, "strict": True}}},
     "schema"),
    ("/v1/chat/completions", {"response_format": {"type": "json_object"}}, "object"),
    ("/v1/chat/completions", {"structured_outputs": {"json": SCHEMA}}, "schema"),
    ("/v1/chat/completions", {"guided_json": json.dumps(SCHEMA)}, "schema"),
    ("/v1/chat/completions", {"json_schema": SCHEMA}, "schema"),
    ("/v1/chat/completions", {"guided_choice": ["Paris", "Rome"]}, "choice"),
    ("/v1/completions", {"structured_outputs": {"regex": "[0-9]{2}:[0-9]{2}"}}, "regex"),
    ("/v1/completions", {"guided_regex": "[0-9]{2}:[0-9]{2}"}, "regex"),
    ("/v1/completions", {"response_format": {"type": "json_schema", "json_schema": {"name": "c", "schema": SCHEMA}}},
     "schema"),
    ("/v1/completions", {"grammar": 'root ::= [0-9] [0-9] ":" [0-9] [0-9]'}, "regex"),
    ("/v1/completions", {"structured_outputs": {"grammar": 'start: /[0-9]{2}/ ":" /[0-9]{2}/'}}, "regex"),
    ("/v1/completions", {"structured_outputs": {"choice": ["Paris", "Rome"]}}, "choice"),
]


def _valid(kind: str, text: str) -> None:
    if kind == "schema":
        jsonschema.validate(json.loads(text), SCHEMA)
    elif kind == "object":
        assert isinstance(json.loads(text), dict)
    elif kind == "choice":
        assert text in ("Paris", "Rome")
    else:
        assert re.fullmatch(r"[0-9]{2}:[0-9]{2}", text), text


def _body(path: str, fields: dict, **more) -> dict:
    prompt = {"messages": ASK} if "chat" in path else {"prompt": "The time is "}
    return {**prompt, **fields, **more}


def _texts(r: httpx.Response, path: str) -> list[tuple[str, str]]:
    assert r.status_code == 200, r.text
    key = (lambda c: c["message"]["content"]) if "chat" in path else (lambda c: c["text"])
    return [(key(c), c["finish_reason"]) for c in r.json()["choices"]]


@pytest.mark.parametrize("path,fields,kind", FORMS)
def test_every_form_constrains_every_choice(server, path, fields, kind):
    r = post(server, path, **_body(path, fields, n=3, temperature=1.0, seed=7, max_tokens=200))
    for text, finish in _texts(r, path):
        if kind == "object" and finish == "length":
            continue  # any JSON object may be longer than max_tokens; the others are bounded
        assert finish == "stop", text
        _valid(kind, text)


def _streamed(server, path: str, body: dict) -> tuple[str, str]:
    text, finish = "", None
    with httpx.stream("POST", server.url + path, json={"model": server.model, **body, "stream": True},
                      timeout=120) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                for c in json.loads(line[6:])["choices"]:
                    text += (c.get("delta") or {}).get("content") or c.get("text") or ""
                    finish = c.get("finish_reason") or finish
    return text, finish


@pytest.mark.parametrize("path,fields,kind", [FORMS[0], FORMS[6]])
def test_streamed_text_equals_non_streamed(server, path, fields, kind):
    body = _body(path, fields, temperature=0, max_tokens=120)
    [(full, finish)] = _texts(post(server, path, **body), path)
    assert _streamed(server, path, body) == (full, finish) and finish == "stop"
    _valid(kind, full)


BAD = [  # (body fields, the param the 400 names, a word of its message)
    ({"response_format": {"type": "json_object"}, "guided_regex": "a+"}, "guided_regex", "at most one"),
    ({"structured_outputs": {"regex": "a"}, "grammar": 'root ::= "a"'}, "grammar", "at most one"),
    ({"guided_regex": "("}, "guided_regex", "regex"),
    ({"structured_outputs": {"json": {"type": "strin"}}}, "structured_outputs", "strin"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object",
      "properties": {"d": {"type": "string", "format": "no-such-format"}}}}}}, "response_format", "format"),
    ({"structured_outputs": {"choice": []}}, "structured_outputs", "choice"),
    ({"structured_outputs": {"choice": ["a"], "regex": "b"}}, "structured_outputs", "exactly one"),
    ({"grammar": 'root ::= "x" ('}, "grammar", "grammar"),
    ({"guided_json": "{not json"}, "guided_json", "JSON"),
    ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema"),
    ({"response_format": {"type": "xml"}}, "response_format", "json_schema"),
    ({"structured_outputs": {"structural_tag": {"structures": []}}}, "structured_outputs", "not supported"),
    ({"json_schema": False}, "json_schema", "admits no document"),
]


@pytest.mark.parametrize("fields,param,word", BAD)
def test_bad_constraints_are_400s_naming_the_field(server, fields, param, word):
    for path in ("/v1/chat/completions", "/v1/completions"):
        r = post(server, path, **_body(path, fields, max_tokens=5))
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == param and word in err["message"], err


def test_a_bad_constraint_queues_nothing(server):
    before = httpx.get(server.url + "/metrics").text
    assert post(server, "/v1/completions", prompt="x", guided_regex="(").status_code == 400
    after = httpx.get(server.url + "/metrics").text
    pick = lambda text: [ln for ln in text.splitlines() if ln.startswith("pyserve:num_requests_running")]
    assert pick(before) == pick(after)


def _gauges(server) -> dict[str, float]:
    out = {}
    for ln in httpx.get(server.url + "/metrics").text.splitlines():
        for name in ("pyserve:grammar_matchers", "pyserve:kv_blocks_used", "pyserve:num_requests_running"):
            if ln.startswith(name + "{"):
                out[name] = float(ln.rsplit(" ", 1)[1])
    return out


def test_a_dropped_constrained_stream_frees_its_matchers_and_blocks(server):
    schema = {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]}
    body = _body("/v1/chat/completions", {"structured_outputs": {"json": schema}}, n=2, max_tokens=400,
                 temperature=1.0, seed=3)
    assert post(server, "/v1/chat/completions", **body | {"max_tokens": 2}).status_code == 200  # compiled, cached
    base = _gauges(server)["pyserve:grammar_matchers"]
    with httpx.stream("POST", server.url + "/v1/chat/completions", json={"model": server.model, **body,
                                                                         "stream": True}, timeout=120) as r:
        chunks = 0
        for line in r.iter_lines():
            chunks += line.startswith("data: {")
            if chunks == 8:
                assert _gauges(server)["pyserve:grammar_matchers"] == base + 2  # one per sample
                break
    for _ in range(200):  # the abort lands at the engine's next step: a bounded poll of the server's gauges
        g = _gauges(server)
        if g["pyserve:num_requests_running"] == 0 and g["pyserve:kv_blocks_used"] == 0:
            break
    assert g["pyserve:kv_blocks_used"] == 0 and g["pyserve:grammar_matchers"] == base
