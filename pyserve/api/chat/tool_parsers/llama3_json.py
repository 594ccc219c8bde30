"""Llama 3.1 / 3.2 / 3.3 JSON calls: ``{"name": …, "parameters": {…}}`` as the whole response, or after
``<|python_tag|>``; parallel calls separated by ``;`` (vLLM's ``llama3_json`` parser). A JSON object at the start
is a call only if its first key is one a call has, so a JSON answer stays content."""

from __future__ import annotations

from .base import Gen, marker_finder
from .json_calls import JsonCallParser

__all__ = ["Llama3JsonToolParser"]

_FIND = marker_finder("<|python_tag|>")


class Llama3JsonToolParser(JsonCallParser):
    name = "llama3_json"

    def _grammar(self) -> Gen[None]:
        if (yield from self._peek()) == "{":
            yield from self._calls(strict=True)
        while (yield from self._text(_FIND)):
            if (yield from self._peek()) == "{":
                yield from self._calls(strict=False)
            self._content_to(self._pos)

    def _calls(self, strict: bool) -> Gen[None]:
        while (yield from self._call_object(strict)):
            if (yield from self._peek()) != ";":
                return
            self._pos += 1
            if (yield from self._peek()) != "{":
                break
        self._content_to(self._pos)  # what is not a call is content
