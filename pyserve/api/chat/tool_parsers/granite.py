"""IBM Granite 3.x calls: ``<|tool_call|>[{"name": …, "arguments": {…}}, …]`` (vLLM's ``granite`` parser)."""

from __future__ import annotations

from .base import Gen, marker_finder
from .json_calls import JsonCallParser

__all__ = ["GraniteToolParser"]

_FIND = marker_finder("<|tool_call|>")


class GraniteToolParser(JsonCallParser):
    name = "granite"

    def _grammar(self) -> Gen[None]:
        while (yield from self._text(_FIND)):
            if (yield from self._peek()) == "[":
                yield from self._call_array()
            self._content_to(self._pos)
