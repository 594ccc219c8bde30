"""Gemma 4 calls: ``<|tool_call>call:name{key:value,…}<tool_call|>``, one block per call, text before the first
(vLLM's ``gemma4`` parser; llama.cpp's grammar). Keys are bare; values are Gemma's notation, which the template's
``format_argument`` writes: strings between ``<|"|>`` marks (no escapes inside), ``{k:v,…}``, ``[v,…]``,
numbers, ``true``/``false``, ``null`` (and ``None``, what the template prints for a null). They are typed as
written, not by the tool's schema. The markers are user-defined tokens: they stay in the decoded text."""

from __future__ import annotations

import json
import re
from typing import Optional, Union

from .base import Gen, marker_finder
from .tag_calls import END, TagCallParser

__all__ = ["Gemma4ToolParser"]

_FIND = marker_finder("<|tool_call>")
_QUOTE = '<|"|>'
_SCALAR = re.compile(r"[^,}\]\s]+")  # a number or literal runs up to the next delimiter
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_LITERALS = {"true": True, "false": False, "null": None, "None": None}
_KEY = re.compile(r"[^:}]+")  # llama.cpp's key: up to the colon
_BAD = object()


class _More(Exception):
    """The text ends inside the value: more may complete it."""


def _space(s: str, i: int) -> int:
    while i < len(s) and s[i].isspace():
        i += 1
    if i == len(s):
        raise _More
    return i


def _value(s: str, i: int) -> tuple[object, int]:
    """The value at ``s[i:]`` and where it ends; _More where the text may still complete it, ValueError where
    it cannot be one."""
    i = _space(s, i)
    if s.startswith(_QUOTE, i):
        end = s.find(_QUOTE, i + len(_QUOTE))
        if end < 0:
            raise _More
        return s[i + len(_QUOTE):end], end + len(_QUOTE)
    if s[i] in "{[":
        return _container(s, i)
    if _QUOTE.startswith(s[i:]):
        raise _More
    token = _SCALAR.match(s, i)
    if token is None or token.end() == len(s):
        raise _More if token else ValueError(s[i])
    text = token.group()
    if text in _LITERALS:
        return _LITERALS[text], token.end()
    if _NUMBER.fullmatch(text):
        return json.loads(text), token.end()
    raise ValueError(text)


def _container(s: str, i: int) -> tuple[object, int]:
    """A ``{k:v,…}`` or ``[v,…]`` at ``s[i]``."""
    is_dict, items = s[i] == "{", []
    close = "}" if is_dict else "]"
    i = _space(s, i + 1)
    while s[i] != close or items:
        key = None
        if is_dict:
            key, i = _key(s, i)
        value, i = _value(s, i)
        items.append((key, value))
        i = _space(s, i)
        if s[i] == close:
            break
        if s[i] != ",":
            raise ValueError(s[i])
        i = _space(s, i + 1)
    return (dict(items) if is_dict else [v for _, v in items]), i + 1


def _key(s: str, i: int) -> tuple[str, int]:
    """A member's key and the index after its colon."""
    if i >= len(s):
        raise _More
    match = _KEY.match(s, i)
    if match is None:
        raise ValueError(s[i])
    if match.end() == len(s):
        raise _More
    if s[match.end()] != ":":
        raise ValueError(s[match.end()])
    key = match.group().strip()
    if key.startswith(_QUOTE) and key.endswith(_QUOTE) and len(key) >= 2 * len(_QUOTE):
        key = key[len(_QUOTE):-len(_QUOTE)]  # what format_argument writes with escape_keys
    return key, match.end() + 1


class Gemma4ToolParser(TagCallParser):
    name = "gemma4"

    def _grammar(self) -> Gen[None]:
        while (yield from self._text(_FIND)):
            if (yield from self._tagged_call()) and (yield from self._literal("<tool_call|>")):
                self._drop_to(self._pos)  # missing at the end of the text: tolerated
            self._content_to(self._pos)  # a block that is not a call is content

    def _call_name(self) -> Gen[Optional[str]]:
        if not (yield from self._literal("call:")):
            return None
        name = yield from self._word("{")
        self._members = 0
        return name if name and (yield from self._literal("{")) else None

    def _pair(self) -> Gen[Union[tuple[str, object], str, None]]:
        c = yield from self._peek()
        if c == "}":
            self._pos += 1
            return END
        if self._members and c == ",":
            self._pos += 1
        elif self._members:
            return None
        self._members += 1
        key = yield from self._read(_key)
        value = _BAD if key is _BAD else (yield from self._read(_value))
        return None if value is _BAD else (key, value)

    def _read(self, parse) -> Gen[object]:
        """What ``parse(buf, pos)`` reads at ``_pos`` once the text holds it whole (``_pos`` moves past it);
        _BAD where it cannot be one."""
        while True:
            try:
                value, self._pos = parse(self._buf, self._pos)
                return value
            except _More:
                if self._final:
                    return _BAD
            except (ValueError, RecursionError):
                return _BAD
            yield

    def _value_of(self, name: str, key: str, raw: object) -> object:
        return raw  # typed as written
