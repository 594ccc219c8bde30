"""gpt-oss's harmony format through the real server: a random-weight model whose vocabulary holds harmony's
control tokens (<|start|>, <|channel|>, <|message|>, <|end|>, <|return|>, <|call|>, <|constrain|>) and which
carries gpt-oss's own chat template (llama.cpp's models/templates/openai-gpt-oss-120b.jinja), steered through an
analysis channel and the final one by a Lark grammar that names the control tokens, read with the openai SDK:
the analysis text is the reasoning, the final channel's text the content, no marker leaks, streamed equals not
streamed, and reasoning_effort reaches the template's system message."""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import openai
import pytest

from pyserve.bench.launch import ServerProcess
from support import model_factory as tm
from support.gguf_vocab import vocab_meta
from support.paths import DATA

TEMPLATE = DATA / "chat_templates" / "templates" / "openai-gpt-oss-120b.jinja"
HARMONY = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|return|>", "<|call|>", "<|constrain|>"]
THOUGHT, ANSWER = "Two and two make four.", "Four."
CONTROL = 3  # llama.cpp's token type of a control token
# the whole output: the analysis message, the final one, the end of the turn
STEER = {"structured_outputs": {"grammar": (
    f'start: <|channel|> "analysis" <|message|> "{THOUGHT}" <|end|> <|start|> "assistant" <|channel|> "final" '
    f'<|message|> "{ANSWER}" <|return|>')}}
ASK = [{"role": "user", "content": "What is 2 + 2?"}]


def harmony_vocab() -> dict:
    """Qwen3.5's vocabulary with harmony's control tokens added at its end, <|return|> the end of a turn."""
    meta = dict(vocab_meta("qwen35"))
    base = len(meta["tokenizer.ggml.tokens"])
    meta["tokenizer.ggml.tokens"] = list(meta["tokenizer.ggml.tokens"]) + HARMONY
    meta["tokenizer.ggml.token_type"] = list(meta["tokenizer.ggml.token_type"]) + [CONTROL] * len(HARMONY)
    meta["tokenizer.ggml.eos_token_id"] = base + HARMONY.index("<|return|>")
    meta["tokenizer.ggml.add_bos_token"] = False
    return meta


@pytest.fixture(scope="module")
def model_file(tmp_path_factory) -> Path:
    return tm.write_test_model(tmp_path_factory.mktemp("harmony") / "harmony.gguf", "qwen3", qtype="Q8_0",
                               vocab=harmony_vocab(), chat_template=TEMPLATE.read_text(), name="harmony")


@pytest.fixture(scope="module")
def harmony(model_file):
    with ServerProcess("--model", str(model_file)).wait_ready() as srv:
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


def chat(client: openai.OpenAI, **kw):
    return client.chat.completions.create(model=client.models.list().data[0].id, messages=ASK, temperature=0,
                                          **{"max_tokens": 60, **kw})


def test_analysis_is_the_reasoning_and_final_the_content(harmony):
    out = chat(harmony, extra_body=STEER)
    msg = out.choices[0].message
    assert (msg.reasoning_content, msg.reasoning, msg.content) == (THOUGHT, THOUGHT, ANSWER)
    assert out.choices[0].finish_reason == "stop"
    details = out.usage.completion_tokens_details
    assert 0 < details.reasoning_tokens < out.usage.completion_tokens


def test_streamed_equals_not_streamed_and_no_marker_leaks(harmony):
    reasoning, content = "", ""
    for chunk in chat(harmony, extra_body=STEER, stream=True):
        for ch in chunk.choices:
            reasoning += getattr(ch.delta, "reasoning_content", None) or ""
            content += ch.delta.content or ""
    assert (reasoning, content) == (THOUGHT, ANSWER)
    assert "<|" not in reasoning + content


def prompt_text(client: openai.OpenAI, **kw) -> str:
    """The rendered prompt, read back as vLLM's prompt_logprobs decode it (the first token has none)."""
    out = chat(client, max_tokens=1, extra_body={"prompt_logprobs": 0}, **kw)
    return "".join(next(iter(p.values()))["decoded_token"] for p in out.model_extra["prompt_logprobs"][1:])


def test_reasoning_effort_reaches_the_template(harmony):
    assert "Reasoning: high\n" in prompt_text(harmony, reasoning_effort="high")
    assert "Reasoning: low\n" in prompt_text(harmony, reasoning_effort="low")
    assert "Reasoning: medium\n" in prompt_text(harmony)  # the template's default
    assert prompt_text(harmony).endswith("<|start|>assistant")


def test_end_closes_a_message_not_the_turn(harmony):
    """<|end|> is no end of generation where <|return|> and <|call|> are (llama.cpp's harmony rule): the model
    goes on past the analysis message to the final one, and stops at <|return|>."""
    out = chat(harmony, extra_body=STEER, logprobs=True)
    tokens = [t.token for t in out.choices[0].logprobs.content]
    assert tokens.count("<|end|>") == 1 and tokens[-1] == "<|return|>"


SCHEMA = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"],
          "additionalProperties": False}
FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": SCHEMA}}


@pytest.mark.parametrize("budget", [0, 5])
def test_json_schema_applies_to_the_final_channel_after_a_budget(harmony, budget):
    """The analysis message is free text cut at the budget (then <|end|> is forced); the schema constrains the
    final channel only."""
    out = chat(harmony, response_format=FORMAT, max_tokens=120, logprobs=True,
               extra_body={"thinking_token_budget": budget})
    msg = out.choices[0].message
    jsonschema.validate(json.loads(msg.content), SCHEMA)
    tokens = [t.token for t in out.choices[0].logprobs.content]
    head = tokens[:tokens.index("<|end|>")] if "<|end|>" in tokens else []
    assert len(head) <= 3 + budget  # <|channel|> analysis <|message|> (as spelled) and the budget's tokens
    assert "<|" not in (getattr(msg, "reasoning_content", None) or "") + msg.content
    assert out.choices[0].finish_reason == "stop"


WEATHER = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]

def test_a_tool_result_goes_back_as_the_functions_message(harmony):
    """A call in the history is rendered as the commentary message to the function (its arguments decoded,
    not a JSON string of JSON), its result as the function's own message, the tools as the developer message's
    TypeScript namespace; the model's calls are read back by tool_parsers/harmony.py (test_tool_parsers.py)."""
    call = {"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [call]},
                     {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 21 C"}]
    out = harmony.chat.completions.create(model=harmony.models.list().data[0].id, messages=history, tools=WEATHER,
                                          temperature=0, max_tokens=1, extra_body={"prompt_logprobs": 0})
    text = "".join(next(iter(p.values()))["decoded_token"] for p in out.model_extra["prompt_logprobs"][1:])
    assert ('<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{"city": "Paris"}'
            '<|call|>') in text
    assert '<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"Sunny, 21 C"<|end|>' in text
    assert "namespace functions" in text and "type get_weather" in text
