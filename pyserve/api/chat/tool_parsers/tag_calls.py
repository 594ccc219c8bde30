"""The tag formats' shared part (GLM-4.5's ``<arg_key>``/``<arg_value>``, Qwen3-Coder's ``<parameter=…>``): a
call is a name and key/value pairs whose values are bare text, each read up to its closing tag and made JSON by
the parameter's schema in the request's tools.

A value is the text itself where the tool's schema types that parameter as a string; otherwise it is the value
the text spells as JSON, or else as a Python literal (Qwen3-Coder's template writes ``True`` and ``None`` through
Jinja's ``string``), and the text itself when it spells neither. That is vLLM's ``glm45`` rule, used for both
families here (vLLM's ``qwen3_coder`` keeps the text of a parameter its schema does not list; here such a
parameter is read like any parameter that is not a string).

A stream sends the call's header once its name is complete, then each argument once its closing tag has come
(``{"city": "Paris"``, then ``, "unit": "celsius"``, then ``}``), so the stream and the whole text give the same
arguments. A key given twice makes the call malformed, as in the pythonic format. Gemma 4's calls have the same
shape (a name, then key:value members) with values in a notation of their own, already typed (gemma4)."""

from __future__ import annotations

import ast
import json
import re
from typing import Optional, Union

from .base import Gen, ToolParser

__all__ = ["END", "TagCallParser"]

END = "end"  # what a pair reader returns at the call's closing tag
_NAME = re.compile(r"[^\s<>]+")  # a call's name or an argument's key: no space, no tag
_READ_ERRORS = (ValueError, SyntaxError, TypeError, MemoryError, RecursionError)


def _is_string(schema: object) -> bool:
    types = schema.get("type") if isinstance(schema, dict) else None
    return types == "string" or (isinstance(types, list) and "string" in types)


def _typed(schema: object, text: str) -> object:
    """The argument value ``text`` stands for, by the parameter's ``schema`` (the module's rule)."""
    if _is_string(schema):
        return text
    for read in (json.loads, ast.literal_eval):
        try:
            value = read(text.strip())
            json.dumps(value, allow_nan=False)  # only what JSON can hold (no NaN, set or bytes)
            return value
        except _READ_ERRORS:
            pass
    return text


class TagCallParser(ToolParser):
    """Base of the tag formats: a subclass's grammar calls ``_tagged_call`` after a call's opening tag and
    writes ``_call_name`` and ``_pair``."""

    def _call_name(self) -> Gen[Optional[str]]:
        raise NotImplementedError

    def _pair(self) -> Gen[Union[tuple[str, object], str, None]]:
        """The next (key, value as read), END at the call's closing tag, None where the text is not either."""
        raise NotImplementedError

    def _tagged_call(self) -> Gen[bool]:
        """A whole call from ``_pos``: True once its closing tag is read; False where it breaks (a call a
        stream already sent is closed with the arguments it had)."""
        name = yield from self._call_name()
        if not name:
            return False
        opened = not self._final
        if opened:
            self._open(name)
        members: list[str] = []
        keys: set[str] = set()
        while True:
            pair = yield from self._pair()
            if pair == END:
                self._close_members(name, members, opened)
                return True
            if pair is None or pair[0] in keys:
                break
            keys.add(pair[0])
            members.append(("{" if not members else ", ") + self._member(name, *pair))
            if opened:
                self._args(members[-1], self._pos)
        if opened:
            self._close()
        return False

    def _member(self, name: str, key: str, raw: object) -> str:
        value = self._value_of(name, key, raw)
        return f"{json.dumps(key, ensure_ascii=False)}: {json.dumps(value, ensure_ascii=False)}"

    def _value_of(self, name: str, key: str, raw: object) -> object:
        """The value of argument ``key`` of tool ``name`` that ``_pair`` read: its text, typed by the schema."""
        schema = self._schemas.get(name, {})
        properties = schema.get("properties") if isinstance(schema, dict) else None
        return _typed(properties.get(key) if isinstance(properties, dict) else None, raw)

    # ---- reading primitives ----

    def _upto(self, *markers: str) -> Gen[Optional[str]]:
        """The text from ``_pos`` to the first of ``markers`` (``_pos`` moves to it, not past it); None at the
        end of the text without one."""
        while True:
            hits = [i for m in markers if (i := self._buf.find(m, self._pos)) >= 0]
            if hits:
                text, self._pos = self._buf[self._pos:min(hits)], min(hits)
                return text
            if self._final:
                return None
            yield

    def _word(self, *ends: str) -> Gen[Optional[str]]:
        """A name or key up to the first of ``ends`` or of a space or tag, stripped; None if it is not one."""
        text = yield from self._upto(*ends, "\n", "<")
        text = text.strip() if text is not None else ""
        return text if _NAME.fullmatch(text) else None

    def _tag_text(self, close: str) -> Gen[Optional[str]]:
        """The text up to the closing tag ``close``, which is read too; None at the end of the text without it."""
        text = yield from self._upto(close)
        if text is not None:
            self._pos += len(close)
        return text
