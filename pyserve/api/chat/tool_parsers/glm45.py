"""GLM-4.5 / 4.6 / 4.7 calls (vLLM's ``glm45`` parser): ``<tool_call>name`` and then, per argument,
``<arg_key>key</arg_key><arg_value>value</arg_value>``, up to ``</tool_call>``; GLM-4.5 and 4.6 put each tag on
its own line, 4.7 writes them without newlines. Values are bare text, typed by the tool's schema (tag_calls)."""

from __future__ import annotations

from typing import Optional, Union

from .base import Gen, marker_finder
from .tag_calls import END, TagCallParser

__all__ = ["Glm45ToolParser"]

_FIND = marker_finder("<tool_call>")


class Glm45ToolParser(TagCallParser):
    name = "glm45"

    def _grammar(self) -> Gen[None]:
        while (yield from self._text(_FIND)):
            yield from self._tagged_call()
            self._content_to(self._pos)  # a block that is not a call is content

    def _call_name(self) -> Gen[Optional[str]]:
        return (yield from self._word())

    def _pair(self) -> Gen[Union[tuple[str, str], str, None]]:
        yield from self._peek()
        tag = yield from self._literal("<arg_key>", "</tool_call>")
        if tag != "<arg_key>":
            return END if tag else None
        key = yield from self._word()
        if key is None or not (yield from self._literal("</arg_key>")):
            return None
        yield from self._peek()
        if not (yield from self._literal("<arg_value>")):
            return None
        value = yield from self._tag_text("</arg_value>")
        return None if value is None else (key, value)
