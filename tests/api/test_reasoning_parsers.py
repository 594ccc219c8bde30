"""Reasoning parsers (pyserve/api/chat/reasoning): each format's output split whole, then streamed split at every
point of the text and in every pair of pieces the qwen3.5 test vocabulary's tokens make: the stream joins to the
whole parse and no marker (nor a piece of one) reaches either field; detection from the real templates."""
from __future__ import annotations

import pytest

from pyserve.api.chat.reasoning import REASONING_PARSERS, detect_reasoning_parser, get_reasoning_parser
from pyserve.api.chat.reasoning.constrain import after_reasoning
from pyserve.api.chat.reasoning.plan import ReasoningPlan
from pyserve.engine.detokenizer import IncrementalDetokenizer
from pyserve.engine.structured import StructuredOutputsParams
from support.gguf_vocab import vocab_tokenizer
from support.paths import DATA

TEMPLATES = DATA / "chat_templates" / "templates"
HARMONY_FINAL = "<|start|>assistant<|channel|>final<|message|>"

# (parser, rendered prompt's end, model output, reasoning, content)
CASES = [
    ("qwen3", "<|im_start|>assistant\n<think>\n", "Two and two.\n</think>\n\nFour.", "Two and two.", "Four."),
    ("qwen3", "<|im_start|>assistant\n", "<think>\nHm < think.\n</think>\n\nFour <b>.", "Hm < think.", "Four <b>."),
    ("qwen3", "<|im_start|>assistant\n", "Four, no thinking.", "", "Four, no thinking."),
    ("qwen3", "<|im_start|>assistant\n<think>\n\n</think>\n\n", "Four </think>.", "", "Four </think>."),
    ("qwen3", "<|im_start|>assistant\n<think>\n", "Cut short, still thinking <", "Cut short, still thinking <", ""),
    ("deepseek_r1", "<｜Assistant｜><think>\n", "x</think>y", "x", "y"),
    ("glm45", "<|assistant|><think>", "Reason.</think>Answer.", "Reason.", "Answer."),
    ("glm45", "<|assistant|></think>", "Answer.", "", "Answer."),
    ("gemma4", "<start_of_turn>model\n", "<|channel>thought\nReason.<channel|>Answer.", "Reason.", "Answer."),
    ("gpt_oss", "<|start|>assistant",
     f"<|channel|>analysis<|message|>Think hard.<|end|>{HARMONY_FINAL}The answer.", "Think hard.", "The answer."),
    ("gpt_oss", "<|start|>assistant", "<|channel|>analysis<|message|>Hm.<|end|><|channel|>final<|message|>A.", "Hm.", "A."),
    ("gpt_oss", "<|start|>assistant", "<|channel|>final<|message|>No analysis.", "", "No analysis."),
]


def stream(name: str, prompt: str, pieces: list[str]) -> tuple[str, str]:
    """The joined fields of a stream (a piece of a marker sent as either field would show in them)."""
    p = get_reasoning_parser(name)(prompt)
    outs = [p.feed(x) for x in pieces] + [p.finish()]
    return "".join(o.reasoning for o in outs), "".join(o.content for o in outs)


@pytest.mark.parametrize("name,prompt,text,reasoning,content", CASES)
def test_whole_text_splits(name, prompt, text, reasoning, content):
    assert get_reasoning_parser(name)(prompt).parse(text) == (reasoning, content)


@pytest.mark.parametrize("name,prompt,text,reasoning,content", CASES)
def test_every_split_point_gives_the_whole_parse(name, prompt, text, reasoning, content):
    for i in range(len(text) + 1):
        for j in range(i, len(text) + 1):
            assert stream(name, prompt, [text[:i], text[i:j], text[j:]]) == (reasoning, content), (i, j)


@pytest.mark.parametrize("name,prompt,text,reasoning,content", [c for c in CASES if c[0] != "gpt_oss"])
def test_token_by_token_through_a_real_vocabulary(name, prompt, text, reasoning, content):
    """qwen3.5's test vocabulary has no <think> token: the markers come in pieces ('</', 'think', '>')."""
    tok = vocab_tokenizer("qwen35")
    ids = tok.encode(text, add_special=False, parse_special=True)
    detok = IncrementalDetokenizer(tok, [], False)
    pieces = [detok.add(t) for t in ids] + [detok.flush()]
    assert "".join(pieces) == text
    assert stream(name, prompt, pieces) == (reasoning, content)


def test_disabled_thinking_is_content():
    p = get_reasoning_parser("qwen3")("<|im_start|>assistant\n<think>\n", enabled=False)
    assert p.parse("x</think>y") == ("", "x</think>y")


def test_effort_goes_to_the_template():
    assert ReasoningPlan("qwen3", "none", None).template_kwargs() == {"enable_thinking": False}
    assert not ReasoningPlan("qwen3", "none", None).enabled
    assert ReasoningPlan("gpt_oss", "low", {"x": 1}).template_kwargs() == {"reasoning_effort": "low", "x": 1}
    assert not ReasoningPlan("qwen3", None, {"enable_thinking": False}).enabled


PIECES = ["a", "b", "</think>", "\n\n", "c"]  # token id i writes PIECES[i]


def test_reasoning_tokens_count_the_block():
    split = ReasoningPlan("qwen3", None, None).split("<think>\n", PIECES.__getitem__)
    for i, text in enumerate(PIECES):
        split.feed(text, [i])
    assert split.tokens == 3


@pytest.mark.parametrize("cut", [[5], [2, 3], [3, 2], [1, 3, 1], [4, 1]])
def test_reasoning_tokens_do_not_depend_on_how_tokens_fall_in_deltas(cut):
    """A slow reader gets several tokens in one delta: the count is the same."""
    split = ReasoningPlan("qwen3", None, None).split("<think>\n", PIECES.__getitem__)
    start = 0
    for n in cut:
        ids = list(range(start, start + n))
        split.feed("".join(PIECES[i] for i in ids), ids)
        start += n
    assert split.tokens == 3


@pytest.mark.parametrize("template,name", [("Qwen3.5-4B.jinja", "qwen3"), ("GLM-4.6.jinja", "glm45"),
                                           ("GLM-4.7-Flash.jinja", "glm45"),
                                           ("google-gemma-4-31B-it.jinja", "gemma4"), ("Qwen3-Coder.jinja", None)])
def test_detected_from_the_template(template, name):
    assert detect_reasoning_parser((TEMPLATES / template).read_text()) == name


def test_registry():
    assert set(REASONING_PARSERS) == {"qwen3", "deepseek_r1", "glm45", "gemma4", "gpt_oss"}
    with pytest.raises(ValueError, match="qwen3"):
        get_reasoning_parser("nope")


def accepts(so, text: str) -> bool:
    """Whether the grammar of ``so`` (a TopLevelGrammar) takes ``text`` to an accepting end (llguidance on a
    byte vocabulary)."""
    from llguidance import LLMatcher, LLTokenizer

    kind, grammar = so.llguidance()
    assert kind == "llguidance"
    m = LLMatcher(LLTokenizer("byte"), grammar, log_level=0)
    return all(m.consume_token(b) for b in text.encode()) and m.is_accepting()


@pytest.mark.parametrize("prompt,opening", [("<|im_start|>assistant\n<think>\n", ""),
                                            ("<|im_start|>assistant\n", "<think>\n")])
def test_the_answer_grammar_starts_after_the_think_block(prompt, opening):
    so = StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "integer"}},
                                       "required": ["a"], "additionalProperties": False})
    wrapped = after_reasoning(get_reasoning_parser("qwen3")(prompt), so, None)
    assert accepts(wrapped, opening + 'x < y {"a": 2}</think>\n\n{"a": 1}')
    assert not accepts(wrapped, opening + "x</think>\n\nnot json")
    assert not accepts(wrapped, '{"a": 1}' if opening else "")  # the reasoning block comes first


def test_no_think_block_keeps_the_constraint():
    so = StructuredOutputsParams(json={"type": "object"})
    assert after_reasoning(get_reasoning_parser("qwen3")("<think>\n\n</think>\n\n"), so, None) is so
    # harmony's tool calls go to their own channel: a tool grammar applies to the whole output
    assert after_reasoning(get_reasoning_parser("gpt_oss")("<|start|>assistant"), so, 5, tools=True) is so
    assert after_reasoning(get_reasoning_parser("gemma4")("<|turn>model\n<|channel>thought\n<channel|>"), so, 5) is so
