"""Gemma 4's thinking channel through the real server: a random-weight model with Gemma 4's vocabulary and chat
template (thinking on with chat_template_kwargs enable_thinking, off by default as the template has it), read
with the openai SDK: the thought channel is the reasoning, a json_schema applies to the answer after it, and a
budget closes the channel."""
from __future__ import annotations

import json
import re

import jsonschema
import openai
import pytest

from pyserve.bench.launch import ServerProcess
from support import model_factory as tm
from support.gguf_vocab import vocab_meta
from support.paths import DATA

TEMPLATE = DATA / "chat_templates" / "templates" / "google-gemma-4-31B-it.jinja"
THOUGHT, ANSWER = "Two and two make four.", "Four."
THINK = {"chat_template_kwargs": {"enable_thinking": True}}
STEER = {**THINK, "structured_outputs": {"regex": re.escape(f"<|channel>thought\n{THOUGHT}<channel|>{ANSWER}")}}
ASK = [{"role": "user", "content": "What is 2 + 2?"}]
SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
          "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}


@pytest.fixture(scope="module")
def gemma4(tmp_path_factory):
    path = tm.write_test_model(tmp_path_factory.mktemp("gemma4") / "g4.gguf", "qwen3", qtype="Q8_0",
                               vocab=vocab_meta("gemma-4"), chat_template=TEMPLATE.read_text(), name="g4")
    with ServerProcess("--model", str(path)).wait_ready() as srv:
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


def chat(client: openai.OpenAI, **kw):
    return client.chat.completions.create(model=client.models.list().data[0].id, messages=ASK, temperature=0,
                                          **{"max_tokens": 60, **kw})


def test_the_thought_channel_is_the_reasoning(gemma4):
    msg = chat(gemma4, extra_body=STEER).choices[0].message
    assert (msg.reasoning_content, msg.content) == (THOUGHT, ANSWER)


def test_thinking_off_by_default_leaves_no_reasoning(gemma4):
    out = chat(gemma4, extra_body={"structured_outputs": {"regex": re.escape(ANSWER)}})
    assert out.choices[0].message.content == ANSWER
    assert getattr(out.choices[0].message, "reasoning_content", None) is None


@pytest.mark.parametrize("budget", [0, 4])
def test_json_schema_applies_after_the_thought_channel(gemma4, budget):
    out = chat(gemma4, response_format=FORMAT, max_tokens=120, extra_body={**THINK, "thinking_token_budget": budget})
    msg = out.choices[0].message
    jsonschema.validate(json.loads(msg.content), SCHEMA)
    assert "<channel|>" not in msg.content and out.choices[0].finish_reason == "stop"
