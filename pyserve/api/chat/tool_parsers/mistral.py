"""Mistral calls: ``[TOOL_CALLS][{"name": …, "arguments": {…}}, …]`` (Mistral 7B v0.3, Nemo, Small up to 3.1) and
the newer ``[TOOL_CALLS]name[ARGS]{…}`` per call (tokenizer v11+, ``[CALL_ID]id`` before ``[ARGS]`` skipped);
vLLM's ``mistral`` parser. The marker is a special token: the detokenizer must keep it in the text.

Mistral's templates accept only call ids of 9 letters and digits (a history with others raises "Tool call IDs
should be alphanumeric strings with length 9!"), so that is this parser's default id, as in vLLM."""

from __future__ import annotations

import re
import secrets

from .base import Gen, marker_finder
from .json_calls import JsonCallParser

__all__ = ["MistralToolParser", "mistral_call_id"]

_FIND = marker_finder("[TOOL_CALLS]")
_NAME = re.compile(r"[A-Za-z0-9_.\-]*")


def mistral_call_id() -> str:
    """9 random hex digits: the ids Mistral's templates accept."""
    return secrets.token_hex(5)[:9]


class MistralToolParser(JsonCallParser):
    name = "mistral"
    default_call_id = staticmethod(mistral_call_id)

    def _grammar(self) -> Gen[None]:
        while (yield from self._text(_FIND)):
            c = yield from self._peek()
            if c == "[":
                yield from self._call_array()
            elif c is not None:
                yield from self._named_call()
            self._content_to(self._pos)

    def _named_call(self) -> Gen[bool]:
        name = yield from self._word()
        tag = yield from self._literal("[ARGS]", "[CALL_ID]")
        if tag == "[CALL_ID]":
            yield from self._word()
            tag = yield from self._literal("[ARGS]")
        return bool(name and tag) and (yield from self._args_value(name))

    def _word(self) -> Gen[str]:
        """The name characters at ``_pos``, once a character that is not one follows."""
        while True:
            end = _NAME.match(self._buf, self._pos).end()
            if end < len(self._buf) or self._final:
                word, self._pos = self._buf[self._pos:end], end
                return word
            yield
