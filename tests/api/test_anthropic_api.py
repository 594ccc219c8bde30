"""Anthropic's Messages API with the anthropic SDK and LangChain's ChatAnthropic as the checks: text,
stop_sequences and max_tokens stop reasons, streaming equal to the non-streamed text, tools (a required call
then a tool_result round trip, streamed input_json_delta), count_tokens, thinking accepted, errors in
Anthropic's shape (the SDK's exception classes), x-api-key auth, and litellm's anthropic/ route."""
from __future__ import annotations

import json

import anthropic
import pytest

from pyserve.bench.launch import ServerProcess

WEATHER = {"name": "get_weather", "description": "Current weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
                            "required": ["city"]}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
T0 = {"temperature": 0}  # (the SDK has no temperature argument any more; the API still takes it)
HELLO = [{"role": "user", "content": "Write a short story about a cat."}]


@pytest.fixture(scope="module")
def ac(server):
    return anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)


def test_text_and_stop_reasons(server, ac):
    m = ac.messages.create(model=server.model, max_tokens=8, messages=HELLO, extra_body=T0)
    assert m.type == "message" and m.role == "assistant" and m.id.startswith("msg_")
    assert m.stop_reason == "max_tokens" and m.usage.output_tokens == 8 and m.content[0].type == "text"
    word = m.content[0].text.split()[1]
    s = ac.messages.create(model=server.model, max_tokens=8, messages=HELLO, extra_body=T0, stop_sequences=[word])
    assert s.stop_reason == "stop_sequence" and s.stop_sequence == word and word not in s.content[0].text
    n = ac.messages.count_tokens(model=server.model, messages=HELLO)
    assert n.input_tokens == m.usage.input_tokens + (m.usage.cache_read_input_tokens or 0)


def test_stream_equals_create(server, ac):
    kw = dict(model=server.model, max_tokens=20, messages=HELLO, system="You are terse.", extra_body=T0)
    m = ac.messages.create(**kw)
    with ac.messages.stream(**kw) as st:
        text = "".join(st.text_stream)
        final = st.get_final_message()
    assert text == m.content[0].text == final.content[0].text
    assert final.stop_reason == m.stop_reason and final.usage.output_tokens == m.usage.output_tokens


def test_tool_use_round_trip_and_stream(server, ac):
    for choice in ({"type": "any"}, {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}):
        m = ac.messages.create(model=server.model, max_tokens=100, messages=ASK, tools=[WEATHER],
                               tool_choice=choice, extra_body=T0)
        assert m.stop_reason == "tool_use"
        use = next(b for b in m.content if b.type == "tool_use")
        assert use.id.startswith("toolu_") and use.name == "get_weather" and isinstance(use.input["city"], str)
    follow = ASK + [{"role": "assistant", "content": m.content},
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "Sunny"}]}]
    r = ac.messages.create(model=server.model, max_tokens=10, messages=follow, tools=[WEATHER], extra_body=T0)
    assert r.content and r.stop_reason in ("end_turn", "max_tokens", "tool_use")
    with ac.messages.stream(model=server.model, max_tokens=100, messages=ASK, tools=[WEATHER],
                            tool_choice={"type": "any"}, extra_body=T0) as st:
        parts: dict[int, str] = {}
        for e in st:
            if e.type == "content_block_delta" and e.delta.type == "input_json_delta":
                parts[e.index] = parts.get(e.index, "") + e.delta.partial_json
        final = st.get_final_message()
    assert final.stop_reason == "tool_use" and parts
    assert all(json.loads(parts[i]) == final.content[i].input for i in parts)


def test_thinking_accepted_and_absent(server, ac):
    history = [HELLO[0], {"role": "assistant", "content": [{"type": "thinking", "thinking": "hmm", "signature": ""},
                                                           {"type": "text", "text": "Once"}]},
               {"role": "user", "content": "Go on."}]
    m = ac.messages.create(model=server.model, max_tokens=5, messages=history, thinking={"type": "disabled"})
    assert all(b.type != "thinking" for b in m.content)


@pytest.mark.parametrize("body", [
    {"messages": HELLO},  # no max_tokens
    {"max_tokens": 5, "messages": [{"role": "system", "content": "x"}]},
    {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "video", "text": "x"}]}]},
    {"max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]},
    {"max_tokens": 5, "messages": HELLO, "temperature": 1.5},
])
def test_bad_bodies_are_invalid_request_errors(server, ac, body):
    with pytest.raises(anthropic.BadRequestError) as e:  # the SDK's own request path, past its argument checks
        ac.post("/v1/messages", cast_to=object, body={"model": server.model, **body})
    assert e.value.body["type"] == "error" and e.value.body["error"]["type"] == "invalid_request_error"


def test_unknown_model_is_not_found(server, ac):
    with pytest.raises(anthropic.NotFoundError) as e:
        ac.messages.create(model="no-such-model", max_tokens=5, messages=HELLO)
    assert e.value.body["error"]["type"] == "not_found_error"


def test_x_api_key():
    with ServerProcess("--api-key", "sekrit").wait_ready() as srv:
        bad = anthropic.Anthropic(base_url=srv.url, api_key="wrong", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as e:
            bad.messages.create(model=srv.model, max_tokens=2, messages=HELLO)
        assert e.value.body["error"]["type"] == "authentication_error"
        good = anthropic.Anthropic(base_url=srv.url, api_key="sekrit", max_retries=0)
        assert good.messages.create(model=srv.model, max_tokens=2, messages=HELLO).usage.output_tokens == 2


def test_langchain_chat_anthropic(server):
    from langchain_anthropic import ChatAnthropic

    llm = ChatAnthropic(base_url=server.url, model=server.model, api_key="unused", max_tokens=10, temperature=0,
                        max_retries=0)
    text = llm.invoke("Write a short story about a cat.").content
    assert text and "".join(c.content for c in llm.stream("Write a short story about a cat.")) == text
    call = llm.bind_tools([WEATHER], tool_choice="get_weather", max_tokens=100).invoke("What is the weather in Paris?")
    assert call.tool_calls[0]["name"] == "get_weather" and isinstance(call.tool_calls[0]["args"]["city"], str)


def test_litellm_anthropic_route(server, ac):
    import litellm

    kw = dict(model="anthropic/" + server.model, api_base=server.url, api_key="unused", max_tokens=8, temperature=0,
              messages=HELLO)
    r = litellm.completion(**kw)
    m = ac.messages.create(model=server.model, max_tokens=8, messages=HELLO, extra_body=T0)
    assert r.choices[0].message.content == m.content[0].text and r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 8
    assert "".join(c.choices[0].delta.content or "" for c in litellm.completion(**kw, stream=True)) == m.content[0].text
