"""gpt-oss's harmony tool calls (vLLM's ``openai`` parser): a commentary-channel message addressed to the tool,
``<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>ARGS<|call|>`` — the recipient may
also follow the channel (``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>``), the start
marker may be missing (the first message of a turn), and ``<|call|>`` is an end of generation, so the text often
ends at the arguments. A commentary message without a recipient is a preamble the user sees: its body is
content. The analysis and final channels are the reasoning parser's (reasoning/gpt_oss.py)."""

from __future__ import annotations

import json
import re
from typing import Optional

from .base import Gen, ToolParser, marker_finder

__all__ = ["HarmonyToolParser"]

_FIND = marker_finder("<|start|>assistant", "<|channel|>commentary")
_END = marker_finder("<|call|>", "<|end|>", "<|start|>")
_RECIPIENT = re.compile(r"to=(?:functions\.)?([^\s<]+)")


class HarmonyToolParser(ToolParser):
    name = "openai"

    def _grammar(self) -> Gen[None]:
        while (yield from self._text(_FIND)):
            header = yield from self._header()
            if header is None:  # not a message header after all
                self._content_to(self._pos)
                continue
            recipient = _RECIPIENT.search(header)
            if recipient and self._final:
                self._whole_call(recipient.group(1))
            elif recipient:  # streamed: the header goes out now, the arguments as they come
                self._open(recipient.group(1))
                yield from self._body(self._args_to)
                self._close()
            else:
                self._drop_to(self._pos)
                yield from self._body(self._content_to)

    def _header(self) -> Gen[Optional[str]]:
        """The header from the marker up to ``<|message|>`` (``_pos`` after it); None at the end of the text or
        where another message starts first."""
        start = self._mark
        while True:
            i = self._buf.find("<|message|>", self._pos)
            if i >= 0:
                header, self._pos = self._buf[start:i], i + len("<|message|>")
                return None if "<|start|>" in header[1:] else header
            if self._final:
                return None
            yield

    def _body(self, take) -> Gen[None]:
        """The message's text up to its end marker (dropped; a next ``<|start|>`` is left to read), handed to
        ``take(end)`` as it arrives."""
        while True:
            start, end = _END(self._buf, self._pos)
            take(start)
            self._pos = start
            if end is not None or self._final:
                self._pos = self._past_end(start, end)
                self._drop_to(self._pos)
                return
            yield

    def _past_end(self, start: int, end: Optional[int]) -> int:
        """Where reading goes on after a body that stops at ``start``: past its end marker, at a next message's
        ``<|start|>`` (left to read), or at the end of the text (a cut end marker's start is dropped)."""
        if end is None:
            return len(self._buf)
        return start if self._buf.startswith("<|start|>", start) else end

    def _whole_call(self, name: str) -> None:
        """At the end of the text: a call if it ended (``<|call|>``, ``<|end|>``) or its arguments are whole
        JSON (``<|call|>`` ends the generation, so the text often stops at them); else content."""
        start, end = _END(self._buf, self._pos)
        args = self._buf[self._pos:start]
        if end is None and not _is_json(args):
            self._content_to(len(self._buf))
            self._pos = len(self._buf)
            return
        self._open(name)
        self._args(args, start)
        self._pos = self._past_end(start, end)
        self._close()

    def _args_to(self, end: int) -> None:
        self._args(self._buf[self._mark:end], end)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
        return True
    except ValueError:
        return False
