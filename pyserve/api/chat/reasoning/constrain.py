"""Structured output and tool grammars after the reasoning, and the thinking budget, as one llguidance grammar.

A ``response_format`` or tool-call grammar constrains the answer, not the thinking: the request's grammar (a JSON
schema's TopLevelGrammar, as StructuredOutputsParams compiles it) becomes a subgrammar ``@json_schema`` after a
free reasoning part and the end marker (``start: think answer``). Free reasoning is a lazy terminal whose
``suffix`` is the end marker: it ends at the model's first ``</think>``, and the answer's grammar starts there.

A budget (``thinking_token_budget``, ``--reasoning-budget``) is ``max_tokens=N`` on that terminal, which then
ends after N tokens and the grammar forces the end marker, so the answer follows. llguidance forces what must
follow only where the terminal itself cannot go on, and its lexer looks one byte ahead: a budgeted reasoning part
is therefore text without ``<`` (the first byte of the marker), so that a ``<`` always starts the marker. (Tried
first: a suffix terminal with max_tokens ends at the budget without forcing its suffix; ``/(?s:.*)/`` minus the
texts containing the marker cannot give back ``</think`` once read.) One grammar, not two engine requests (the
thinking stopped at the marker, then the answer under the grammar from prompt + reasoning): one request keeps
streaming, n > 1, and the engine's admission as they are.

gpt-oss's harmony markers are control tokens, which llguidance's Lark names (``<|channel|>``): an optional analysis
message (free text, which cannot contain a control token, so the model's ``<|end|>`` ends it; a budget is
``max_tokens`` on it, after which ``<|end|>`` is forced), then the final channel's header and the answer.
Harmony's tool calls go to another channel, so a tool grammar there applies to the whole output. Gemma 4's
``<|channel>`` / ``<channel|>`` are user-defined tokens, whose text is in the text: a text-marker format.
"""
from __future__ import annotations

import json
from typing import Optional

from ....engine.structured import StructuredOutputsParams
from .base import ReasoningParser

__all__ = ["after_reasoning"]

TEXT_MARKERS = ("qwen3", "deepseek_r1", "glm45", "gemma4")  # gemma4's are user-defined tokens: text
_GAP = r"/\s{0,2}/"  # the templates' "\n\n" after the marker; bounded, or a model may write whitespace for ever
_ANSWER_FREE = '{"grammars": [{"name": "answer", "lark_grammar": "start: /(?s:.*)/"}]}'


def after_reasoning(parser: ReasoningParser, so: Optional[StructuredOutputsParams],
                    budget: Optional[int], tools: bool = False) -> Optional[StructuredOutputsParams]:
    """The constraint of a thinking request: ``so`` (None: free text; ``tools``: a tool-call grammar) after the
    reasoning, the reasoning cut at ``budget`` tokens (None: no bound). ``so`` itself where the output does not
    start a reasoning block."""
    control = parser.name in _CONTROL and not (tools and parser.name == "gpt_oss")
    if not (parser.name in TEXT_MARKERS or control) or not parser.may_reason or (so is None and budget is None):
        return so
    kind, text = so.llguidance() if so is not None else ("llguidance", _ANSWER_FREE)
    if kind != "llguidance":
        return so
    answer = json.loads(text)["grammars"]
    lark = (_control_markers if control else _think_block)(parser, "@" + answer[0]["name"], budget)
    grammars = [{"name": "reasoning", "lark_grammar": lark}, *answer]
    return StructuredOutputsParams(llguidance_grammar=json.dumps({"grammars": grammars}))


# formats whose markers are control tokens, as Lark (llguidance names a control token as `<|channel|>`):
# (the block's opening, its closing, the header between it and the answer)
_CONTROL = {"gpt_oss": ('<|channel|> "analysis" <|message|>', '<|end|> <|start|> "assistant"',
                        '<|channel|> "final" <|message|> ')}


def _control_markers(parser: ReasoningParser, ref: str, budget: Optional[int]) -> str:
    """gpt-oss: ``[<|channel|>analysis<|message|>THOUGHT<|end|><|start|>assistant]<|channel|>final<|message|>``
    (the prompt ends with ``<|start|>assistant``), an optional block of free text (which cannot hold a control
    token: the model's closing token ends it), then the answer."""
    opening, closing, header = _CONTROL[parser.name]
    limit = "" if budget is None else f"[max_tokens={budget}]"
    if parser.in_reasoning:
        return f"start: think {closing} {header}{ref}\nthink{limit}: /(?s:.*)/\n"
    return (f"start: block? {header}{ref}\nblock: {opening} think {closing}\n"
            f"think{limit}: /(?s:.*)/\n")


def _think_block(parser: ReasoningParser, ref: str, budget: Optional[int]) -> str:
    """The ``<think>`` formats: the reasoning up to the text marker, then the answer."""
    opening = "" if parser.in_reasoning else f"{_GAP} {json.dumps(parser.start)} "  # bounded, as after the block
    if budget is None:
        lark = f'start: {opening}think {_GAP} {ref}\nthink[suffix={json.dumps(parser.end)}]: /(?s:.*)/\n'
    else:
        lark = (f'start: {opening}think {json.dumps(parser.end)} {_GAP} {ref}\n'
                f'think[stop="", max_tokens={budget}]: /(?s:.*)/ & ~/(?s:.*)<(?s:.*)/\n')
    return lark
