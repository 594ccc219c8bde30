"""Pythonic calls (Llama 3.2 / 4 pythonic templates, vLLM's ``pythonic`` parser): a Python list of calls with
keyword arguments, ``[get_weather(city="Paris"), get_time(tz="CET")]``, at the start of the response or of a line.

The arguments become JSON: each keyword's value is read with ``ast.literal_eval`` and written with ``json.dumps``;
a stream sends the call's header with its first argument and then one keyword at a time, as each completes
(``{"city": "Paris"``, then ``, "n": 2``, then ``}``), so both ways give the same text."""

from __future__ import annotations

import ast
import json
import re
from typing import Optional

from .base import Gen, ToolParser

__all__ = ["PythonicToolParser"]

_IDENT = r"[A-Za-z_][\w.]*"
_START = re.compile(rf"(?:^|(?<=\n))[ \t]*(\[)\s*{_IDENT}\s*\(")  # a list of calls at a line start
_START_PREFIX = re.compile(rf"[ \t]*(?:\[\s*(?:{_IDENT}\s*)?)?")  # what may still grow into a _START
_NAME = re.compile(rf"\s*({_IDENT})\s*\(")
_NAME_PREFIX = re.compile(rf"\s*(?:{_IDENT}\s*)?")
_CLOSERS = {")": "(", "]": "[", "}": "{"}


def _find_list(buf: str, pos: int) -> tuple[int, Optional[int]]:
    """A ``find`` for ``ToolParser._text``: a ``[name(`` at a line start; ``end`` is at its ``[``."""
    hit = _START.search(buf, pos)
    if hit:
        return hit.start(), hit.start(1)
    newline = buf.rfind("\n", pos)
    line = newline + 1 if newline >= 0 else pos if pos == 0 or buf[pos - 1] == "\n" else len(buf)
    return (line, None) if _START_PREFIX.fullmatch(buf, line) else (len(buf), None)


def _argument_end(s: str, i: int, final: bool) -> Optional[int]:
    """Where the argument starting at ``i`` ends: the index of the ``,`` or closing bracket after it, outside
    strings and brackets; None while the text may still complete it."""
    stack: list[str] = []
    quote = ""
    while i < len(s):
        c = s[i]
        if quote:
            if c == "\\":
                i += 1
            elif s.startswith(quote, i):
                i += len(quote) - 1
                quote = ""
        elif c in "'\"":
            if not final and len(s) - i < 3 and s[i:] == c * (len(s) - i):
                return None  # '' or "" at the end may still open a triple quote
            quote = c * 3 if s.startswith(c * 3, i) else c
        elif c in "([{":
            stack.append(c)
        elif c in _CLOSERS:
            if not stack or stack.pop() != _CLOSERS[c]:
                return i
        elif c == "," and not stack:
            return i
        i += 1
    return None


def _member(text: str) -> Optional[tuple[str, str]]:
    """``city="Paris"`` → ("city", '"city": "Paris"'); None when it is not one keyword argument with a literal."""
    try:
        call = ast.parse(f"f({text})", mode="eval").body
        if call.args or len(call.keywords) != 1 or call.keywords[0].arg is None:
            return None
        key, value = call.keywords[0].arg, ast.literal_eval(call.keywords[0].value)
        return key, f"{json.dumps(key)}: {json.dumps(value, ensure_ascii=False, allow_nan=False)}"
    except (SyntaxError, ValueError, TypeError, MemoryError, RecursionError):
        return None


class PythonicToolParser(ToolParser):
    name = "pythonic"

    def _grammar(self) -> Gen[None]:
        while (yield from self._text(_find_list)):
            yield from self._call_list()
            self._content_to(self._pos)  # what is not a call is content

    def _call_list(self) -> Gen[bool]:
        self._pos += 1  # '['
        while True:
            name = yield from self._name()
            if name is None or not (yield from self._keywords(name)):
                return False
            c = yield from self._peek()
            if c == "]":
                self._pos += 1
                self._drop_to(self._pos)
                return True
            if c != ",":
                return False
            self._pos += 1

    def _name(self) -> Gen[Optional[str]]:
        """The ``name(`` at ``_pos`` (``_pos`` moves past it), once complete; None when it cannot be one."""
        while True:
            match = _NAME.match(self._buf, self._pos)
            if match:
                self._pos = match.end()
                return match.group(1)
            if self._final or not _NAME_PREFIX.fullmatch(self._buf, self._pos):
                return None
            yield

    def _argument_end(self) -> Gen[Optional[int]]:
        while True:
            end = _argument_end(self._buf, self._pos, self._final)
            if end is not None or self._final:
                return end
            yield

    def _keywords(self, name: str) -> Gen[bool]:
        """The keyword arguments after ``name(`` up to its ``)``, as the call's JSON arguments."""
        opened = False  # streaming: the header goes out with the first argument, then each once complete
        members: list[str] = []
        keys: set[str] = set()
        while True:
            end = yield from self._argument_end()
            if end is None or self._buf[end] not in ",)":
                break
            text, self._pos = self._buf[self._pos:end], end + 1
            if text.strip():  # f() and a trailing comma have none
                member = _member(text)
                if member is None or member[0] in keys:
                    break
                keys.add(member[0])
                members.append(("{" if not members else ", ") + member[1])
                if not opened and not self._final:
                    self._open(name)
                    opened = True
                if opened:
                    self._args(members[-1], self._pos)
            if self._buf[end] == ")":
                self._close_members(name, members, opened)
                return True
        if opened:
            self._close()
        return False
