"""Reasoning through the real server: a random-weight qwen3 model with Qwen3.5's vocabulary and chat template
(whose generation prompt opens the think block) served by `pyserve serve`, its output steered through a think
block by a regex grammar (vLLM's structured_outputs, which constrains the whole text), read with the openai SDK:
reasoning_content and reasoning split from the content, streamed equals not streamed, reasoning tokens counted,
reasoning_effort "none" turns thinking off; the default model (no template of its own) has no reasoning."""
from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import openai
import pytest

from pyserve.bench.launch import ServerProcess
from support import model_factory as tm
from support.gguf_vocab import vocab_meta
from support.paths import DATA

TEMPLATE = DATA / "chat_templates" / "templates" / "Qwen3.5-4B.jinja"
THOUGHT, ANSWER = "Two and two make four.", "Four."
STEER = {"structured_outputs": {"regex": re.escape(f"{THOUGHT}\n</think>\n\n{ANSWER}")}}
ASK = [{"role": "user", "content": "What is 2 + 2?"}]


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    vocab = {**vocab_meta("qwen35"), "tokenizer.ggml.add_bos_token": False}  # Qwen writes no BOS
    return tm.write_test_model(tmp_path_factory.mktemp("reasoning") / "qwen3.gguf", "qwen3", qtype="Q8_0",
                               vocab=vocab, chat_template=TEMPLATE.read_text(), name="thinker")


@pytest.fixture(scope="module")
def thinker(model_file):
    with ServerProcess("--model", str(model_file)).wait_ready() as srv:
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


def chat(client: openai.OpenAI, **kw):
    return client.chat.completions.create(model=client.models.list().data[0].id, messages=ASK, temperature=0,
                                          **{"max_tokens": 40, **kw})


def test_reasoning_is_split_from_the_content(thinker):
    out = chat(thinker, extra_body=STEER)
    msg = out.choices[0].message
    assert (msg.reasoning_content, msg.reasoning, msg.content) == (THOUGHT, THOUGHT, ANSWER)
    details = out.usage.completion_tokens_details
    assert 0 < details.reasoning_tokens < out.usage.completion_tokens


def test_streamed_equals_not_streamed(thinker):
    whole = chat(thinker, extra_body=STEER)
    reasoning, content, usage, order = "", "", None, []
    for chunk in chat(thinker, extra_body=STEER, stream=True, stream_options={"include_usage": True}):
        usage = chunk.usage or usage
        for ch in chunk.choices:
            r = getattr(ch.delta, "reasoning_content", None)
            assert r == getattr(ch.delta, "reasoning", None)
            reasoning += r or ""
            content += ch.delta.content or ""
            order += ["r"] * bool(r) + ["c"] * bool(ch.delta.content)
    assert (reasoning, content) == (THOUGHT, ANSWER)
    assert order == sorted(order, reverse=True)  # every reasoning delta before the content
    assert usage.completion_tokens_details.reasoning_tokens == whole.usage.completion_tokens_details.reasoning_tokens


def test_reasoning_effort_none_turns_thinking_off(thinker):
    out = chat(thinker, reasoning_effort="none", extra_body={"structured_outputs": {"regex": re.escape(ANSWER)}})
    msg = out.choices[0].message
    assert msg.content == ANSWER and getattr(msg, "reasoning_content", None) is None
    assert out.usage.completion_tokens_details.reasoning_tokens == 0


def test_a_bad_effort_is_a_400(thinker):
    with pytest.raises(openai.BadRequestError, match="reasoning_effort"):
        chat(thinker, reasoning_effort="extreme")


def test_a_required_tool_call_follows_the_reasoning(thinker):
    tool = {"type": "function", "function": {"name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}
    out = chat(thinker, tools=[tool], tool_choice="required", extra_body={"thinking_token_budget": BUDGET},
               max_tokens=60)
    msg = out.choices[0].message
    assert msg.reasoning_content and out.choices[0].finish_reason == "tool_calls"
    assert [c.function.name for c in msg.tool_calls] == ["add"]
    jsonschema.validate(json.loads(msg.tool_calls[0].function.arguments), tool["function"]["parameters"])


def test_a_negative_budget_is_a_400(thinker):
    with pytest.raises(openai.BadRequestError, match="thinking_token_budget"):
        chat(thinker, extra_body={"thinking_token_budget": -1})


def test_reasoning_parser_none_leaves_the_text_alone(model_file):
    with ServerProcess("--model", str(model_file), "--reasoning-parser", "none").wait_ready() as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)
        out = chat(client, extra_body=STEER)
    assert out.choices[0].message.content == f"{THOUGHT}\n</think>\n\n{ANSWER}"
    assert getattr(out.choices[0].message, "reasoning_content", None) is None
    assert out.usage.completion_tokens_details is None


def test_the_default_model_has_no_reasoning(client):
    out = chat(client, max_tokens=4)
    msg = out.choices[0].message
    assert getattr(msg, "reasoning_content", None) is None and out.usage.completion_tokens_details is None


SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
          "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}
BUDGET = 6


def tokens_to_close(out) -> int:
    """The tokens generated up to the one that completes "</think>" (the grammar lets the model spell it)."""
    text = ""
    for i, t in enumerate(out.choices[0].logprobs.content):
        text += t.token
        if "</think>" in text:
            return i + 1
    raise AssertionError(f"no </think> in {text!r}")


def test_json_schema_applies_to_the_answer_after_the_reasoning(thinker):
    """Free reasoning (cut by the budget: this random model would not close it), then valid JSON content."""
    out = chat(thinker, response_format=FORMAT, extra_body={"thinking_token_budget": BUDGET}, max_tokens=60,
               logprobs=True)
    msg = out.choices[0].message
    jsonschema.validate(json.loads(msg.content), SCHEMA)
    assert msg.reasoning_content and "</think>" not in msg.reasoning_content
    assert out.choices[0].finish_reason == "stop"
    assert out.usage.completion_tokens_details.reasoning_tokens == tokens_to_close(out) > BUDGET


def test_the_budget_closes_the_think_block(thinker):
    out = chat(thinker, extra_body={"thinking_token_budget": BUDGET}, max_tokens=20, logprobs=True)
    close = tokens_to_close(out)
    assert out.usage.completion_tokens_details.reasoning_tokens == close
    assert close - BUDGET <= len("</think>")  # the budget's tokens, then the marker forced
    assert out.usage.completion_tokens > close and out.choices[0].message.content  # the answer followed
    streamed = "".join(getattr(ch.delta, "reasoning_content", None) or ""
                       for chunk in chat(thinker, extra_body={"thinking_token_budget": BUDGET}, max_tokens=20,
                                         stream=True) for ch in chunk.choices)
    assert streamed == (out.choices[0].message.reasoning_content or "")
