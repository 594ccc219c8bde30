"""/v1/responses through the openai SDK's client.responses on the default model (one server per module)."""
import time

import httpx
import openai
import pytest

from pyserve.bench.prometheus import parse_metrics, total

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


def test_plain_text(client, server):
    r = client.responses.create(model=server.model, input="Say hello.", max_output_tokens=8, temperature=0)
    assert r.status == "completed" and r.output_text
    assert r.usage.input_tokens > 0 and 0 < r.usage.output_tokens <= 8
    assert r.usage.total_tokens == r.usage.input_tokens + r.usage.output_tokens


def test_instructions_reach_the_prompt(client, server):
    a = client.responses.create(model=server.model, input="Hi", max_output_tokens=2, temperature=0)
    b = client.responses.create(model=server.model, input="Hi", instructions="You are terse.",
                                max_output_tokens=2, temperature=0)
    assert b.usage.input_tokens > a.usage.input_tokens


def test_function_tool_round_trip(client, server):
    first = client.responses.create(model=server.model, input="What is the weather in Paris?", tools=[WEATHER],
                                    tool_choice="required", temperature=0, max_output_tokens=100)
    calls = [o for o in first.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather"
    follow = [{"role": "user", "content": "What is the weather in Paris?"},
              {"type": "function_call", "call_id": calls[0].call_id, "name": calls[0].name,
               "arguments": calls[0].arguments},
              {"type": "function_call_output", "call_id": calls[0].call_id, "output": "sunny, 21 C"}]
    second = client.responses.create(model=server.model, input=follow, tools=[WEATHER], tool_choice="none",
                                     temperature=0, max_output_tokens=20)
    alone = client.responses.create(model=server.model, input=follow[:1], tools=[WEATHER], tool_choice="none",
                                    temperature=0, max_output_tokens=1)
    assert second.status == "completed" and second.output_text
    assert second.usage.input_tokens > alone.usage.input_tokens  # the call and its output are in the prompt


def test_other_tool_types_skipped(client, server):
    r = client.responses.create(model=server.model, input="Hi", tools=[{"type": "web_search"}],
                                max_output_tokens=4, temperature=0)
    assert r.status == "completed"


@pytest.mark.parametrize("body, field", [({"input": 3}, "input"), ({"input": "x", "temperature": 9}, "temperature"),
                                         ({"input": "x", "max_output_tokens": 0}, "max_output_tokens")])
def test_bad_bodies_name_the_field(server, body, field):
    r = httpx.post(server.url + "/v1/responses", json=body)
    assert r.status_code == 400
    assert field in (r.json()["error"].get("param") or "")


def test_streamed_events(client, server):
    events = list(client.responses.create(model=server.model, input="Say hello.", max_output_tokens=8,
                                          temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert text and final.output_text == text and final.usage.output_tokens <= 8
    plain = client.responses.create(model=server.model, input="Say hello.", max_output_tokens=8, temperature=0)
    assert plain.output_text == text


def test_stream_helper_final_response(client, server):
    with client.responses.stream(model=server.model, input="What is the weather in Paris?", tools=[WEATHER],
                                 tool_choice="required", temperature=0, max_output_tokens=100) as s:
        for _ in s:
            pass
        final = s.get_final_response()
    calls = [o for o in final.output if o.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].arguments


def test_langchain_responses_api(server):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(model=server.model, base_url=server.url + "/v1", api_key="unused", use_responses_api=True,
                     temperature=0, max_tokens=8, max_retries=0)
    answer = llm.invoke("Say hello.")
    assert answer.text and answer.usage_metadata["output_tokens"] <= 8
    streamed = "".join(c.text for c in llm.stream("Say hello."))
    assert streamed == answer.text


@pytest.mark.parametrize("body, field", [
    ({"input": [{"type": "message", "role": "user", "content": 5}]}, "input"),
    ({"input": [{"type": "computer_call"}]}, "input"),
    ({"input": "x", "tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice")])
def test_bad_items_name_the_field(server, body, field):
    r = httpx.post(server.url + "/v1/responses", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field


def test_input_tokens_count_matches_usage(client, server):
    r = client.responses.create(model=server.model, input="Say hello.", instructions="Be brief.",
                                max_output_tokens=1, temperature=0)
    n = client.responses.input_tokens.count(model=server.model, input="Say hello.", instructions="Be brief.")
    assert n.input_tokens == r.usage.input_tokens


def test_text_format_json_schema(client, server):
    import json

    import jsonschema
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}}, "required": ["city"],
              "additionalProperties": False}
    r = client.responses.create(model=server.model, input="Name a city as JSON.", temperature=0,
                                max_output_tokens=60,
                                text={"format": {"type": "json_schema", "name": "city", "schema": schema,
                                                 "strict": True}})
    jsonschema.validate(json.loads(r.output_text), schema)


def test_litellm_responses_route(server):
    import litellm

    r = litellm.responses(model="openai/" + server.model, input="Say hello.", api_base=server.url + "/v1",
                          api_key="unused", max_output_tokens=16, temperature=0)  # (litellm raises < 16 to 16)
    assert r.output[0].content[0].text and r.usage.output_tokens <= 16


# ---- the response store: previous_response_id, retrieve, delete, input_items ----

def test_previous_response_id_prepends_the_conversation(client, server):
    first = client.responses.create(model=server.model, input="My name is Ada.", max_output_tokens=4, temperature=0)
    alone = client.responses.create(model=server.model, input="What is my name?", max_output_tokens=4,
                                    temperature=0, store=False)
    chained = client.responses.create(model=server.model, input="What is my name?", max_output_tokens=4,
                                      temperature=0, previous_response_id=first.id)
    assert chained.usage.input_tokens > alone.usage.input_tokens + first.usage.output_tokens
    assert chained.previous_response_id == first.id
    n = client.responses.input_tokens.count(model=server.model, input="What is my name?",
                                            previous_response_id=first.id)
    assert n.input_tokens == chained.usage.input_tokens


def test_retrieve_delete_and_input_items(client, server):
    r = client.responses.create(model=server.model, input="Say hello.", max_output_tokens=6, temperature=0)
    got = client.responses.retrieve(r.id)
    assert got.id == r.id and got.output_text == r.output_text and got.usage.output_tokens == r.usage.output_tokens
    items = client.responses.input_items.list(r.id)
    assert [i.type for i in items.data] == ["message"] and items.data[0].content[0].text == "Say hello."
    client.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.create(model=server.model, input="Hi", max_output_tokens=1, previous_response_id=r.id)
    assert e.value.body["code"] == "previous_response_not_found" and e.value.body["param"] == "previous_response_id"


def test_streamed_response_is_stored(client, server):
    events = list(client.responses.create(model=server.model, input="Say hello.", max_output_tokens=6,
                                          temperature=0, stream=True))
    final = events[-1].response
    assert client.responses.retrieve(final.id).output_text == final.output_text


def test_store_false_is_not_kept(client, server):
    r = client.responses.create(model=server.model, input="Hi", max_output_tokens=2, temperature=0, store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(r.id)


def test_chained_tool_call_output(client, server):
    first = client.responses.create(model=server.model, input="What is the weather in Paris?", tools=[WEATHER],
                                    tool_choice="required", parallel_tool_calls=False, temperature=0,
                                    max_output_tokens=100)
    call = next(o for o in first.output if o.type == "function_call")
    out = [{"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}]
    second = client.responses.create(model=server.model, input=out, previous_response_id=first.id, tools=[WEATHER],
                                     tool_choice="none", temperature=0, max_output_tokens=8)
    spelled = [{"role": "user", "content": "What is the weather in Paris?"},
               {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
               *out]
    same = client.responses.create(model=server.model, input=spelled, tools=[WEATHER], tool_choice="none",
                                   temperature=0, max_output_tokens=8, store=False)
    assert second.status == "completed" and second.usage.input_tokens == same.usage.input_tokens
    assert second.output_text == same.output_text


def _settled(client, rid: str, limit: int = 400):
    """The background response once it is no longer queued or in progress (polled, bounded: ~20 s)."""
    for _ in range(limit):
        r = client.responses.retrieve(rid)
        if r.status not in ("queued", "in_progress"):
            return r
        time.sleep(0.05)
    raise AssertionError(f"{rid} still {r.status}")


def test_background_response_completes_as_a_foreground_one(client, server):
    args = dict(model=server.model, input="The capital of France is", max_output_tokens=8, temperature=0)
    queued = client.responses.create(background=True, **args)
    assert queued.status in ("queued", "in_progress") and queued.background and queued.id.startswith("resp_")
    done = _settled(client, queued.id)
    fore = client.responses.create(**args)
    assert done.status == "completed" and done.id == queued.id
    assert done.output_text == fore.output_text and done.output_text
    assert done.usage.output_tokens == fore.usage.output_tokens and done.usage.input_tokens == fore.usage.input_tokens
    chained = client.responses.create(model=server.model, input="And of Italy?", previous_response_id=done.id,
                                      max_output_tokens=1, temperature=0)
    assert chained.usage.input_tokens > done.usage.input_tokens + done.usage.output_tokens


def test_cancel_ends_a_running_background_response_and_frees_its_blocks(client, server):
    queued = client.responses.create(model=server.model, input="1, 2, 3, 4, 5, 6,", background=True,
                                     max_output_tokens=3000, temperature=0)
    cancelled = client.responses.cancel(queued.id)
    assert cancelled.status == "cancelled" and cancelled.id == queued.id
    assert client.responses.retrieve(queued.id).status == "cancelled"
    assert client.responses.cancel(queued.id).status == "cancelled"  # again: as it is
    for _ in range(400):
        m, _ = parse_metrics(httpx.get(server.url + "/metrics").text)
        if total(m, "pyserve:kv_blocks_used") == 0 and total(m, "pyserve:num_requests_running") == 0:
            break
        time.sleep(0.05)
    assert total(m, "pyserve:kv_blocks_used") == 0 and total(m, "pyserve:num_requests_running") == 0
    assert client.responses.retrieve(queued.id).status == "cancelled"  # the job, aborted, did not overwrite it


def test_cancel_refuses_what_is_not_background(client, server):
    fore = client.responses.create(model=server.model, input="Hi", max_output_tokens=2, temperature=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.cancel(fore.id)
    assert e.value.body["param"] == "response_id"
    with pytest.raises(openai.NotFoundError):
        client.responses.cancel("resp_nonexistent")


@pytest.mark.parametrize("extra, param", [({"store": False}, "background"), ({"stream": True}, "stream")])
def test_background_refused_where_it_cannot_be_polled(server, extra, param):
    r = httpx.post(server.url + "/v1/responses", json={"input": "Hi", "background": True, **extra})
    assert r.status_code == 400 and r.json()["error"]["param"] == param


@pytest.fixture(scope="module")
def keyed_server():
    from pyserve.bench.launch import ServerProcess

    s = ServerProcess("--api-key", "key-a", "--api-key", "key-b").wait_ready()
    yield s
    assert s.stop() == 0, "".join(s.stderr)


def test_one_key_never_reads_another(keyed_server):
    a = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key="key-a", max_retries=0)
    b = openai.OpenAI(base_url=keyed_server.url + "/v1", api_key="key-b", max_retries=0)
    r = a.responses.create(model=keyed_server.model, input="Hi", max_output_tokens=2, temperature=0)
    assert a.responses.retrieve(r.id).id == r.id
    with pytest.raises(openai.NotFoundError):
        b.responses.retrieve(r.id)
    with pytest.raises(openai.NotFoundError):
        b.responses.input_items.list(r.id)
    with pytest.raises(openai.NotFoundError):
        b.responses.delete(r.id)
    with pytest.raises(openai.NotFoundError):
        b.responses.create(model=keyed_server.model, input="Hi", max_output_tokens=1, previous_response_id=r.id)
    assert a.responses.retrieve(r.id).id == r.id  # B's delete did not touch it
    bg = a.responses.create(model=keyed_server.model, input="1, 2, 3,", background=True, max_output_tokens=3000,
                            temperature=0)
    with pytest.raises(openai.NotFoundError):
        b.responses.cancel(bg.id)
    assert a.responses.cancel(bg.id).status == "cancelled"


def test_store_off_refuses_previous_response_id():
    from pyserve.bench.launch import ServerProcess

    s = ServerProcess("--response-store-size", "0").wait_ready()
    try:
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        r = c.responses.create(model=s.model, input="Hi", max_output_tokens=1, temperature=0)
        with pytest.raises(openai.BadRequestError) as e:
            c.responses.create(model=s.model, input="Hi", max_output_tokens=1, previous_response_id=r.id)
        assert e.value.body["param"] == "previous_response_id"
        with pytest.raises(openai.NotFoundError):
            c.responses.retrieve(r.id)
        with pytest.raises(openai.BadRequestError) as e:
            c.responses.create(model=s.model, input="Hi", max_output_tokens=1, background=True)
        assert e.value.body["param"] == "background"
    finally:
        assert s.stop() == 0, "".join(s.stderr)
