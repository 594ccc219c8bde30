"""Hermes-style calls (Hermes 2/3 Pro, Qwen2.5, Qwen3): ``<tool_call>{"name": …, "arguments": {…}}</tool_call>``,
one block per call, text before the first (vLLM's ``hermes`` parser)."""

from __future__ import annotations

from .base import Gen, marker_finder
from .json_calls import JsonCallParser

__all__ = ["HermesToolParser"]

_FIND = marker_finder("<tool_call>")


class HermesToolParser(JsonCallParser):
    name = "hermes"

    def _grammar(self) -> Gen[None]:
        while (yield from self._text(_FIND)):
            if (yield from self._peek()) == "{" and (yield from self._call_object()):
                yield from self._peek()
                if (yield from self._literal("</tool_call>")):  # missing at the end of the text: tolerated
                    self._drop_to(self._pos)
            self._content_to(self._pos)  # a block that is not a call is content
