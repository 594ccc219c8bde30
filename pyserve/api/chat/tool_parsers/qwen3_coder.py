"""Qwen3-Coder calls, also Qwen3.5's (vLLM's ``qwen3_coder`` parser): ``<tool_call>`` ``<function=name>``, per
argument ``<parameter=key>`` value ``</parameter>``, then ``</function>`` ``</tool_call>``, each tag on its own
line. Values are bare text without the newline on each side that the template writes, typed by the tool's schema
(tag_calls). A missing ``</tool_call>`` after a whole ``</function>`` is tolerated, as hermes tolerates it."""

from __future__ import annotations

from typing import Optional, Union

from .base import Gen, marker_finder
from .tag_calls import END, TagCallParser

__all__ = ["Qwen3CoderToolParser"]

_FIND = marker_finder("<tool_call>")


class Qwen3CoderToolParser(TagCallParser):
    name = "qwen3_coder"

    def _grammar(self) -> Gen[None]:
        while (yield from self._text(_FIND)):
            if (yield from self._tagged_call()):
                yield from self._peek()
                if (yield from self._literal("</tool_call>")):
                    self._drop_to(self._pos)
            self._content_to(self._pos)  # a block that is not a call is content

    def _call_name(self) -> Gen[Optional[str]]:
        yield from self._peek()
        if not (yield from self._literal("<function=")):
            return None
        name = yield from self._word(">")
        return name if name and (yield from self._literal(">")) else None

    def _pair(self) -> Gen[Union[tuple[str, str], str, None]]:
        yield from self._peek()
        tag = yield from self._literal("<parameter=", "</function>")
        if tag != "<parameter=":
            return END if tag else None
        key = yield from self._word(">")
        if key is None or not (yield from self._literal(">")):
            return None
        value = yield from self._tag_text("</parameter>")
        if value is None:
            return None
        return key, value.removeprefix("\n").removesuffix("\n")
