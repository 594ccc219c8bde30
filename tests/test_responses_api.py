"""/v1/responses through the openai SDK's client.responses on the default model (one server per module)."""
import httpx
import pytest

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
