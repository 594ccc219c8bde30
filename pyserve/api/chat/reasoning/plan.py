"""What a chat request's reasoning options make of its prompt and its output: the template's kwargs
(``reasoning_effort: "none"`` → ``enable_thinking: false``; low/medium/high → the template's ``reasoning_effort``,
gpt-oss's), and per choice a split of the generated text into reasoning and content with the count of tokens
generated inside the reasoning (``completion_tokens_details.reasoning_tokens``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from ....engine.structured import StructuredOutputsParams
from . import ReasoningDelta, ReasoningParser, get_reasoning_parser
from .constrain import after_reasoning

__all__ = ["ChoiceSplit", "ReasoningPlan", "message_fields"]


@dataclass
class ReasoningPlan:
    parser_name: Optional[str]  # the format (None: no reasoning split)
    effort: Optional[str]       # the request's reasoning_effort
    kwargs: Optional[dict]      # the request's chat_template_kwargs
    budget: Optional[int] = None  # tokens the reasoning may take (None: no bound)

    @property
    def active(self) -> bool:
        return self.parser_name is not None

    @property
    def enabled(self) -> bool:
        """The request leaves thinking on (reasoning_effort none or enable_thinking false turn it off)."""
        return self.effort != "none" and (self.kwargs or {}).get("enable_thinking") is not False

    def template_kwargs(self) -> Optional[dict]:
        """chat_template_kwargs with the effort's: the request's own keys win."""
        if self.effort is None:
            return self.kwargs
        extra = {"enable_thinking": False} if self.effort == "none" else {"reasoning_effort": self.effort}
        return {**extra, **(self.kwargs or {})}

    def constraint(self, prompt: str, so: Optional[StructuredOutputsParams],
                   field: Optional[str]) -> tuple[Optional[StructuredOutputsParams], Optional[str]]:
        """The request's constraint (and the field it came from) with the reasoning in front: response_format
        and tool grammars apply to the answer (a raw structured_outputs grammar to the whole text); a budget
        alone is a grammar too."""
        if not self.active or not self.enabled or field not in ("response_format", "tools", None):
            return so, field
        parser = get_reasoning_parser(self.parser_name)(prompt)
        return after_reasoning(parser, so, self.budget, field == "tools"), field or "thinking_token_budget"

    def split(self, prompt: str, piece: Callable[[int], str]) -> Optional["ChoiceSplit"]:
        """A fresh split for one choice (None: the text is all content); piece: a token's own text."""
        if not self.active:
            return None
        return ChoiceSplit(get_reasoning_parser(self.parser_name)(prompt, self.enabled), piece)


class ChoiceSplit:
    """One choice's reasoning parser and its reasoning-token count: a token counts as reasoning when the text
    before or after it is inside the block (the tokens that write the markers count). Counted per token, not
    per delta: how many tokens one delta carries depends on how fast the client reads."""

    def __init__(self, parser: ReasoningParser, piece: Callable[[int], str]):
        self.parser = parser
        self.piece = piece
        self.tokens = 0

    def feed(self, text: str, ids: list[int], final: bool = False) -> ReasoningDelta:
        inside = self.parser.in_reasoning
        before = self.parser.snapshot() if len(ids) > 1 else None
        d = self.parser.feed(text)
        after = self.parser.in_reasoning
        if before is None or (inside and after) or not (inside or after or d.reasoning):
            self.tokens += len(ids) if inside or after else 0
        else:  # the delta crosses a marker: which of its tokens were inside
            self.tokens += _count_inside(before, [self.piece(t) for t in ids])
        if final:
            end = self.parser.finish()
            d.reasoning += end.reasoning
            d.content += end.content
        return d

    def whole(self, deltas: list[tuple[str, list[int]]]) -> tuple[str, str]:
        """(reasoning, content) of a whole choice fed delta by delta (so that it splits, and counts, as the
        same choice streamed does)."""
        parts = [self.feed(text, ids) for text, ids in deltas] + [self.parser.finish()]
        return "".join(p.reasoning for p in parts), "".join(p.content for p in parts)


def _count_inside(parser: ReasoningParser, pieces: list[str]) -> int:
    """The tokens of a delta that crosses a marker which count as reasoning, fed to (a copy of) the parser
    as it was before the delta, one token's text at a time."""
    n = 0
    for text in pieces:
        inside = parser.in_reasoning
        parser.feed(text)
        n += inside or parser.in_reasoning
    return n


def message_fields(reasoning: str) -> dict:
    """The message's (or delta's) reasoning fields: both names, absent when there is none."""
    return {"reasoning_content": reasoning, "reasoning": reasoning} if reasoning else {}
