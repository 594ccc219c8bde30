"""What every reasoning parser shares: one choice's generated text → its reasoning and its content, whole or
streamed (``feed(delta)`` per text delta, ``finish()`` at the end; ``parse(text)`` is the same machine fed the
whole text), as the tool parsers are driven.

A format is two markers: ``start`` opens the reasoning block, ``end`` closes it; ``after`` (harmony's headers of the
final channel) are dropped where they follow ``end``. The rendered prompt decides where the output begins: a prompt
that ends inside an open block (Qwen3.5's and GLM-4.7's generation prompt write ``<think>``) starts in the
reasoning; one that ends with a closed, empty block (``enable_thinking: false``) or a disabled request starts in
the content; otherwise the output is reasoning only if its first text is ``start``.

Text that might still become a marker is held back (a marker split across tokens never leaks into either field);
whitespace next to the markers (the templates' newlines) is dropped, as the templates strip it when they render
the reasoning back.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import ClassVar

__all__ = ["ReasoningDelta", "ReasoningParser"]

_START, _REASONING, _AFTER, _LEAD, _CONTENT = "start", "reasoning", "after", "lead", "content"


@dataclass
class ReasoningDelta:
    reasoning: str = ""
    content: str = ""


class ReasoningParser:
    """Base of the parsers; a subclass sets ``name``, ``start``, ``end`` (and ``after``). One instance reads one
    choice. ``in_reasoning``: whether the text read so far ends inside the reasoning block."""

    name: ClassVar[str]
    start: ClassVar[str]
    end: ClassVar[str]
    after: ClassVar[tuple[str, ...]] = ()  # headers dropped where they follow `end` (the first that matches)

    def __init__(self, prompt: str = "", enabled: bool = True):
        """prompt: the rendered prompt (its end says whether the output starts inside the block); enabled:
        False when the request turned thinking off (the output is content)."""
        self._buf = ""
        self._state = _CONTENT if not enabled else self._initial(prompt.rstrip())
        self._ws = ""  # whitespace held inside the reasoning (dropped if the block ends after it)
        self._sent_reasoning = False  # leading whitespace is dropped until reasoning text went out

    def _initial(self, prompt: str) -> str:
        if self.end and prompt.endswith(self.end):
            return _CONTENT
        if prompt.endswith(self.start):
            return _REASONING
        return _START

    def snapshot(self) -> "ReasoningParser":
        """A copy that reads on from here (every field is an immutable value: a shallow copy, ~2 µs)."""
        return copy.copy(self)

    @property
    def in_reasoning(self) -> bool:
        return self._state == _REASONING

    @property
    def may_reason(self) -> bool:
        """The output is, or may open, a reasoning block."""
        return self._state in (_START, _REASONING)

    def feed(self, text: str) -> ReasoningDelta:
        self._buf += text
        out = ReasoningDelta()
        while self._step(out, final=False):
            pass
        return out

    def finish(self) -> ReasoningDelta:
        out = ReasoningDelta()
        while self._step(out, final=True):
            pass
        if self._state == _REASONING:  # a block cut short (max_tokens): what was held is reasoning
            out.reasoning += self._buf
        else:
            out.content += self._buf
        self._buf = ""
        return out

    def parse(self, text: str) -> tuple[str, str]:
        """(reasoning, content) of the whole text."""
        a, b = self.feed(text), self.finish()
        return a.reasoning + b.reasoning, a.content + b.content

    # ---- the machine: each step consumes what it can decide; False when it must wait ----

    def _step(self, out: ReasoningDelta, final: bool) -> bool:
        return getattr(self, "_on_" + self._state)(out, final)

    def _on_start(self, out: ReasoningDelta, final: bool) -> bool:
        text = self._buf.lstrip()
        if text.startswith(self.start):
            self._buf, self._state = text[len(self.start):], _REASONING
            return True
        if (self.start.startswith(text) or not text) and not final:
            return False  # still may open the block
        self._state = _AFTER if self.after else _CONTENT  # harmony may skip the analysis: its final header goes
        return True

    def _on_reasoning(self, out: ReasoningDelta, final: bool) -> bool:
        at = self._buf.find(self.end)
        if at >= 0:
            self._reason(out, self._buf[:at], closing=True)
            self._buf, self._state = self._buf[at + len(self.end):], _AFTER
            return True
        keep = 0 if final else _partial(self._buf, self.end)
        self._reason(out, self._buf[:len(self._buf) - keep], closing=False)
        self._buf = self._buf[len(self._buf) - keep:]
        return False

    def _reason(self, out: ReasoningDelta, text: str, closing: bool) -> None:
        """Reasoning text: leading whitespace dropped, trailing whitespace held until more follows."""
        text = self._ws + text
        if not out.reasoning and not self._sent_reasoning:
            text = text.lstrip()
        body = text.rstrip()
        self._ws = "" if closing else text[len(body):]
        if body:
            out.reasoning += body
            self._sent_reasoning = True

    def _on_after(self, out: ReasoningDelta, final: bool) -> bool:
        """After the end marker: harmony's final-channel header dropped, then the whitespace before the content."""
        text = self._buf.lstrip()
        for header in self.after:
            if text.startswith(header):
                self._buf, self._state = text[len(header):], _LEAD
                return True
        if any(h.startswith(text) for h in self.after) and not final:
            return False
        self._state = _LEAD
        return True

    def _on_lead(self, out: ReasoningDelta, final: bool) -> bool:
        self._buf = self._buf.lstrip()
        if not self._buf and not final:
            return False
        self._state = _CONTENT
        return True

    def _on_content(self, out: ReasoningDelta, final: bool) -> bool:
        out.content += self._buf
        self._buf = ""
        return False


def _partial(buf: str, marker: str) -> int:
    """The length of the longest tail of ``buf`` that starts ``marker`` (text that may still become it)."""
    for k in range(min(len(marker) - 1, len(buf)), 0, -1):
        if marker.startswith(buf[-k:]):
            return k
    return 0
