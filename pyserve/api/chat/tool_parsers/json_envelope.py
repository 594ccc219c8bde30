"""The polyfill's answer, for templates that know no tools: the model writes one JSON object (a grammar enforces
it), ``{"tool_calls": [{"name": …, "arguments": {…}}, …]}`` or ``{"response": "…"}`` (llama.cpp's generic
format). The response string streams out as content, decoded as it arrives; anything else is content as written."""

from __future__ import annotations

import json
from typing import Optional

from .base import Gen
from .json_calls import JsonCallParser

__all__ = ["JsonEnvelopeToolParser"]


def _string_prefix(s: str, i: int) -> tuple[int, bool]:
    """How far the JSON string body from ``i`` holds whole characters (an escape sequence, a surrogate pair of
    them, is one); True when the closing quote is there, at that index."""
    n = len(s)
    while i < n:
        c = s[i]
        if c == '"':
            return i, True
        if c == "\\":
            size = 6 if s.startswith("u", i + 1) else 2
            if size == 6 and s[i + 2:i + 4].upper() in ("D8", "D9", "DA", "DB"):
                size = 12  # a high surrogate: its low half decodes with it
            if i + size > n:
                break
            i += size
        else:
            i += 1
    return i, False


class JsonEnvelopeToolParser(JsonCallParser):
    name = "json_envelope"

    def _grammar(self) -> Gen[None]:
        if (yield from self._peek()) == "{":
            self._pos += 1
            yield from self._envelope()
        yield from self._text(lambda buf, pos: (len(buf), None))  # the rest is content

    def _envelope(self) -> Gen[bool]:
        key = None
        if (yield from self._peek()) == '"':
            key = yield from self._value()
        if key not in ("tool_calls", "response") or (yield from self._peek()) != ":":
            return False
        self._pos += 1
        c = yield from self._peek()
        if key == "tool_calls":
            ok = c == "[" and (yield from self._call_array())
        else:
            ok = c == '"' and (yield from self._response())
        if not ok or (yield from self._peek()) != "}":
            return False
        self._pos += 1
        self._drop_to(self._pos)
        return True

    def _response(self) -> Gen[bool]:
        """The response string at ``_pos``, sent as content as its characters complete (the envelope is held
        until the first of them, so that a string that does not decode from its start leaves it all content)."""
        self._pos += 1
        while True:
            end, closed = _string_prefix(self._buf, self._pos)
            text = _decode(self._buf[self._pos:end])
            if text is None:
                return False
            self._pos = end + 1 if closed else end
            if text or closed:
                self._drop_to(self._pos)
                self._content(text)
            if closed:
                return True
            if self._final:
                return False
            yield


def _decode(body: str) -> Optional[str]:
    try:
        return json.loads(f'"{body}"')
    except ValueError:
        return None
