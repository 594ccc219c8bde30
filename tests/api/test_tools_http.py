"""Tool calling over HTTP with the default model (its built-in Gemma format knows no tools: the JSON
polyfill) and with a template that renders tools itself (Qwen2.5's): whatever the model emits is well-formed
and parsed into OpenAI's shapes — required and named calls validate against their `parameters`, one call
without parallel_tool_calls, text for `none`, a tool-result turn answers, streamed deltas accumulate (as
openai-python does) to the non-streamed result, the SDK and LangChain's bind_tools work, and bad tool
requests are 400s naming the field. Whether the 270M model picks tools well is not tested."""
from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState

from pyserve.bench.launch import ServerProcess
from support.paths import DATA

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                                    "unit": {"enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Adds two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"]}}}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "system", "content": "You are a helpful assistant."},
       {"role": "user", "content": "What is the weather in Paris, and what is 2 + 3?"}]
QWEN = next(json.loads(line)["template"] for line in
            (DATA / "chat_templates" / "cases.jsonl").read_text().splitlines()
            if json.loads(line)["family"] == "qwen2.5-instruct")


def _check_calls(message, allowed: set[str]) -> list:
    calls = message.tool_calls or []
    assert calls and len({c.id for c in calls}) == len(calls)
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_") and c.function.name in allowed
        jsonschema.validate(json.loads(c.function.arguments), SCHEMAS[c.function.name])
    return calls


@pytest.mark.parametrize("choice,allowed", [("required", {"get_weather", "add"}),
                                            ({"type": "function", "function": {"name": "add"}}, {"add"})])
def test_required_and_named_calls_validate_against_their_parameters(server, client, choice, allowed):
    for seed in (1, 2, 3):
        r = client.chat.completions.create(model=server.model, messages=ASK, tools=TOOLS, tool_choice=choice,
                                           n=3, temperature=1.0, seed=seed, max_tokens=200)
        for ch in r.choices:
            assert ch.finish_reason == "tool_calls", ch
            calls = _check_calls(ch.message, allowed)
            if isinstance(choice, dict):
                assert len(calls) == 1
        ids = [c.id for ch in r.choices for c in ch.message.tool_calls]
        assert len(set(ids)) == len(ids)  # unique within the response


def test_no_parallel_calls_gives_exactly_one(server, client):
    for seed in (4, 5):
        r = client.chat.completions.create(model=server.model, messages=ASK, tools=TOOLS, tool_choice="required",
                                           parallel_tool_calls=False, n=3, temperature=1.0, seed=seed,
                                           max_tokens=200)
        assert all(len(_check_calls(ch.message, set(SCHEMAS))) == 1 for ch in r.choices)


def test_none_gives_text_and_auto_gives_text_or_valid_calls(server, client):
    r = client.chat.completions.create(model=server.model, messages=ASK, tools=TOOLS, tool_choice="none",
                                       temperature=0, max_tokens=20)
    assert r.choices[0].message.tool_calls is None and r.choices[0].message.content
    r = client.chat.completions.create(model=server.model, messages=ASK, tools=TOOLS, n=3, temperature=1.0, seed=6,
                                       max_tokens=200)
    for ch in r.choices:
        if ch.message.tool_calls:
            assert ch.finish_reason == "tool_calls"
            _check_calls(ch.message, set(SCHEMAS))
        else:
            assert ch.finish_reason in ("stop", "length") and ch.message.content is not None


def test_a_tool_result_turn_renders_and_answers(server, client):
    first = client.chat.completions.create(model=server.model, messages=ASK, tools=[WEATHER],
                                           tool_choice="required", temperature=0, max_tokens=100)
    call = first.choices[0].message.tool_calls[0]
    turn = ASK + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                  {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"},
                  {"role": "developer", "content": "Answer in one sentence."}]
    for tool_choice in ("auto", "none"):
        r = client.chat.completions.create(model=server.model, messages=turn, tools=[WEATHER],
                                           tool_choice=tool_choice, temperature=0, max_tokens=60)
        msg = r.choices[0].message
        assert msg.content or msg.tool_calls
    r = client.chat.completions.create(model=server.model, messages=turn, temperature=0, max_tokens=20)
    assert r.choices[0].message.content is not None  # no tools in this turn: the history still renders


def _accumulated(client, model: str, **kw):
    state = ChatCompletionStreamState()
    for chunk in client.chat.completions.create(model=model, stream=True, **kw):
        for ch in chunk.choices:
            assert len({t.index for t in ch.delta.tool_calls or []}) == len(ch.delta.tool_calls or [])
        state.handle_chunk(chunk)
    return state.current_completion_snapshot  # what the SDK accumulated (get_final_completion refuses "length")


@pytest.mark.parametrize("tool_choice", ["required", "auto"])
def test_streamed_calls_accumulate_to_the_non_streamed_result(server, client, tool_choice):
    kw = dict(messages=ASK, tools=TOOLS, tool_choice=tool_choice, temperature=0, max_tokens=150)
    full = client.chat.completions.create(model=server.model, **kw).choices[0]
    streamed = _accumulated(client, server.model, **kw).choices[0]
    assert streamed.finish_reason == full.finish_reason
    assert (streamed.message.content or None) == (full.message.content or None)
    strip = lambda calls: [(c.function.name, c.function.arguments) for c in calls or []]
    assert strip(streamed.message.tool_calls) == strip(full.message.tool_calls)


def test_langchain_bind_tools(server):
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    llm = ChatOpenAI(model=server.model, base_url=server.url + "/v1", api_key="unused", temperature=0,
                     max_tokens=120, max_retries=0)
    msg = llm.bind_tools([multiply], tool_choice="multiply").invoke("What is 6 times 7?")
    assert msg.tool_calls and msg.tool_calls[0]["name"] == "multiply"
    assert set(msg.tool_calls[0]["args"]) == {"a", "b"} and all(isinstance(v, int)
                                                               for v in msg.tool_calls[0]["args"].values())


BAD = [  # (body fields, param)
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "strin"}}}]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "tools"),
    ({"messages": ASK + [{"role": "tool", "content": "x"}]}, "messages[2].tool_call_id"),
]


@pytest.mark.parametrize("fields,param", BAD)
def test_bad_tool_requests_are_400s_naming_the_field(server, fields, param):
    r = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                   json={"model": server.model, "messages": ASK, "max_tokens": 5, **fields})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


@pytest.fixture(scope="module")
def qwen_server(tmp_path_factory):
    path = tmp_path_factory.mktemp("tpl") / "qwen.jinja"
    path.write_text(QWEN)
    s = ServerProcess("--chat-template", str(path)).wait_ready()
    yield s
    assert s.stop() == 0, "".join(s.stderr)


def test_a_template_that_renders_tools_gets_them_and_its_calls_are_parsed(qwen_server):
    client = openai.OpenAI(base_url=qwen_server.url + "/v1", api_key="unused", max_retries=0)
    r = client.chat.completions.create(model=qwen_server.model, messages=ASK, tools=TOOLS, tool_choice="required",
                                       temperature=1.0, seed=2, n=2, max_tokens=200)
    for ch in r.choices:
        assert ch.finish_reason == "tool_calls"
        _check_calls(ch.message, set(SCHEMAS))
    r = client.chat.completions.create(model=qwen_server.model, messages=ASK, tools=TOOLS, temperature=0,
                                       max_tokens=60)  # auto: free text, read by the hermes parser
    ch = r.choices[0]
    assert ch.finish_reason in ("stop", "length", "tool_calls")
    if ch.message.tool_calls:
        _check_calls(ch.message, set(SCHEMAS))
