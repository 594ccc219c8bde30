"""Tool calling against the real chat templates of tests/data/chat_templates (origin: tests/data/README.md): tool
cases render exactly from OpenAI-shaped messages; each template's family is detected; the detected parser reads
the tool call the template itself writes into an assistant turn, and what it parses renders back to the same
prompt. (The fixtures as they are, dict arguments and all, are test_chat_template.py's reference cases.)"""

from __future__ import annotations

import copy
import json
from datetime import datetime

import pytest

from pyserve.api.chat.tool_parsers import detect_tool_parser, get_tool_parser, renders_tools
from pyserve.api.template.chat_template import ChatTemplate, ChatTemplateError, decode_tool_call_arguments
from support.chat_cases import CASES, TEMPLATE_ERROR
from support.gguf_vocab import vocab_meta

TOOL_CASES = [c for c in CASES if c["tools"] is not None or any("tool_calls" in m for m in c["messages"])]
ROUNDTRIPS = [c for c in CASES if "/f_tools_roundtrip" in c["case"]]
TEMPLATES = {c["family"]: c["template"] for c in CASES}

# family → parser (None: the template renders no tools, so the polyfill applies)
EXPECTED_PARSER = {
    "llama-3.1-instruct": "llama3_json", "llama-3.2-instruct": "llama3_json", "qwen2.5-instruct": "hermes",
    "qwen3": "hermes", "mistral-nemo-instruct-2407": "mistral", "granite-3.3-instruct": "granite",
    "gemma-3-it": None, "phi-3.5-mini-instruct": None, "smollm2-instruct": None, "chatml": None,
    "deepseek-r1-distill-qwen": None,  # it renders tool calls in history but never the tool list
    "glm-4.6": "glm45", "glm-4.7-flash": "glm45", "qwen3-coder": "qwen3_coder", "qwen3.5": "qwen3_coder",
    "gemma-4": "gemma4",
}
END_OF_TURN = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "</s>", "<|observation|>", "<|user|>", "<|tool_response>",
               "<turn|>")
# what a generation prompt adds that the history's assistant turn does not hold: GLM-4.7 opens the reasoning
# block (the turn writes it closed, "</think>"), Gemma 4 writes an empty thought channel (the turn has none)
PROMPT_ONLY = {"glm-4.7-flash": "<think>", "gemma-4": "<|channel>thought\n<channel|>"}
# what the template writes before a call in the assistant turn: content to a tool parser (an empty reasoning
# block, a reasoning parser's to split off)
CONTENT_BEFORE_CALL = {"qwen3": "<think>\n\n</think>\n\n", "qwen3.5": "\n</think>\n\n",  # its prompt opens it
                       "glm-4.6": "\n<think></think>\n", "glm-4.7-flash": "</think>"}


def _template(case: dict) -> ChatTemplate:
    return ChatTemplate(case["template"], bos_token=case["bos_token"], eos_token=case["eos_token"])


def _render(case: dict, messages: list, add_generation_prompt: bool) -> str:
    now = datetime.fromisoformat(case["now"]) if case["now"] else None
    return _template(case).render(decode_tool_call_arguments(messages), tools=case["tools"],
                                  add_generation_prompt=add_generation_prompt, now=now)


def _openai_shaped(messages: list) -> list:
    """The fixture's messages as an OpenAI client sends them: arguments as JSON text, no text as null."""
    out = copy.deepcopy(messages)
    for m in out:
        for call in m.get("tool_calls", ()):
            call["function"]["arguments"] = json.dumps(call["function"]["arguments"])
        if "tool_calls" in m and not m.get("content"):
            m["content"] = None
    return out


def test_tool_cases_present():
    assert len(TOOL_CASES) == 17 + 15 and len(ROUNDTRIPS) == 6 + 10
    assert set(EXPECTED_PARSER) == set(TEMPLATES)


@pytest.mark.parametrize("case", TOOL_CASES, ids=[c["case"] for c in TOOL_CASES])
def test_openai_shaped_tool_messages_render_exactly(case):
    messages = _openai_shaped(case["messages"])
    original = copy.deepcopy(messages)
    if case["expected_error"] is None:
        assert _render(case, messages, case["add_generation_prompt"]) == case["expected"]
    else:
        with pytest.raises(ChatTemplateError) as info:
            _render(case, messages, case["add_generation_prompt"])
        if case["expected_error_type"] == TEMPLATE_ERROR:
            assert str(info.value) == case["expected_error"]
    assert messages == original  # decoded copies, the request's messages untouched


def test_decode_tool_call_arguments_leaves_what_is_not_json():
    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "ok", "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{not json"}},
                    {"id": "b", "type": "function", "function": {"name": "g", "arguments": '{"x": [1]}'}}]}]
    out = decode_tool_call_arguments(messages)
    assert out[0] is messages[0]
    assert out[1]["content"] == "ok"
    assert [c["function"]["arguments"] for c in out[1]["tool_calls"]] == ["{not json", {"x": [1]}]


@pytest.mark.parametrize("family", sorted(TEMPLATES))
def test_detect_family(family):
    assert detect_tool_parser(TEMPLATES[family]) == EXPECTED_PARSER[family]
    assert renders_tools(TEMPLATES[family]) == (family != "deepseek-r1-distill-qwen"
                                                and EXPECTED_PARSER[family] is not None)


def test_detect_pythonic():
    # the instruction vLLM's tool_chat_template_llama3.2_pythonic.jinja and Llama 4's template give
    source = ("{% if tools %}Call functions as [func_name1(params_name1=params_value1, params_name2=params_value2"
              "...), func_name2(params)]:\n{{ tools | tojson }}{% endif %}"
              "{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}"
              "<|eot_id|>{% endfor %}")
    assert detect_tool_parser(source) == "pythonic"


def _read_back(case: dict):
    """The detected parser's reading of the assistant turn that the case's template writes for its tool call:
    what the model would generate after the generation prompt, up to the end of its turn."""
    user, assistant, _ = case["messages"]
    prompt = _render(case, [user], True)
    with_call = _render(case, [user, assistant], False)
    extra = PROMPT_ONLY.get(case["family"], "")
    assert with_call.startswith(prompt.removesuffix(extra)) and prompt.endswith(extra)
    generated = with_call[len(prompt) - len(extra):]
    generated = generated[:min(generated.find(t) % (len(generated) + 1) for t in END_OF_TURN)]
    tools = [t["function"] for t in case["tools"]]  # the tag formats type the arguments by these schemas
    return get_tool_parser(detect_tool_parser(case["template"]))(tools=tools).parse(generated)


@pytest.mark.parametrize("case", [c for c in ROUNDTRIPS if EXPECTED_PARSER[c["family"]] != "granite"],
                         ids=lambda c: c["family"])
def test_parser_reads_what_the_template_writes(case):
    """The assistant turn the template renders for the fixture's tool call is what the model would generate:
    the family's parser reads that call back, and the parsed call renders the same conversation again."""
    user, assistant, tool = case["messages"]
    result = _read_back(case)
    [call] = result.tool_calls
    expected = assistant["tool_calls"][0]["function"]
    assert result.content == CONTENT_BEFORE_CALL.get(case["family"])
    assert (call.name, json.loads(call.arguments)) == (expected["name"], expected["arguments"])

    replayed = [user, {"role": "assistant", "content": result.content, "tool_calls": [call.to_openai()]},
                {**tool, "tool_call_id": call.id}]
    assert _render(case, replayed, True) == case["expected"].replace("abc123xyz", call.id)


@pytest.mark.parametrize("conversation", ["f_tools_roundtrip", "f_tools_roundtrip_typed"])
def test_gemma4_vocab_template(conversation):
    """The template inside Gemma 4's vocabulary file (tests/data/vocab; an older revision than
    google-gemma-4-31B-it.jinja, which knows no OpenAI tool messages) writes the same calls: detected, read back."""
    source = vocab_meta("gemma-4")["tokenizer.chat_template"]
    case = {**next(c for c in CASES if c["case"] == f"gemma-4/{conversation}"), "template": source}
    assert source != TEMPLATES["gemma-4"] and detect_tool_parser(source) == "gemma4"
    [call] = _read_back(case).tool_calls
    expected = case["messages"][1]["tool_calls"][0]["function"]
    assert (call.name, json.loads(call.arguments)) == (expected["name"], expected["arguments"])
