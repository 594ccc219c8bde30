"""The JSON pieces of the call formats: a call object ``{"name": …, "arguments": {…}}``, a list of them, and a
call whose arguments are a bare JSON value. Values are read with the stdlib decoder (``raw_decode``) wherever
they start; a stream's arguments go out as the model writes them (their text, verbatim) until the decoder reads a
whole value there, so they need no partial-JSON parser: nothing but that value's end is looked for."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Optional

from .base import Gen, ToolParser

__all__ = ["JsonCallParser"]

_DECODER = json.JSONDecoder()
_BAD = object()  # what _value returns for text that is not a JSON value
_ARG_KEYS = ("arguments", "parameters")  # "parameters": Llama 3's name for the arguments
_CALL_KEYS = ("name", "type", "id", *_ARG_KEYS)  # a call object's keys; a bare object must start with one
_CLOSERS = {"{": "}", "[": "]", '"': '"'}


@dataclass
class _ObjectCall:
    name: Optional[str] = None
    args: Optional[str] = None  # the arguments' JSON text not sent yet; "" once sent
    opened: bool = False  # its header went out


class JsonCallParser(ToolParser):
    """Base of the parsers whose calls are JSON."""

    def _value(self) -> Gen[object]:
        """The JSON value at ``_pos`` (``_pos`` moves past it), ``_BAD`` when the text there is none."""
        while True:
            try:
                value, end = _DECODER.raw_decode(self._buf, self._pos)
            except ValueError:
                if self._final:
                    return _BAD
            else:  # a number or literal at the end of the text so far may still grow
                if end < len(self._buf) or self._final or self._buf[self._pos] in '{["':
                    self._pos = end
                    return value
            yield

    def _stream_args(self) -> Gen[bool]:
        """The JSON value at ``_pos`` as the open call's arguments, sent as it arrives; False if it is none."""
        start = sent = self._pos
        closer = _CLOSERS.get(self._buf[start])
        while True:
            end = None
            # an object, list or string can only end in new text that holds its closer: decode again only then
            if closer is None or self._final or self._buf.find(closer, sent) >= 0:
                try:
                    _, end = _DECODER.raw_decode(self._buf, start)
                except ValueError:
                    pass
            if end is not None and (end < len(self._buf) or self._final or closer is not None):
                self._args(self._buf[sent:end], end)
                self._pos = end
                return True
            if self._final:
                return False
            self._args(self._buf[sent:], len(self._buf))
            sent = self._pos = len(self._buf)
            yield

    def _call_object(self, strict: bool = False) -> Gen[bool]:
        """A call object at ``_pos`` ('{'): ``{"name": …, "arguments": …}``, "parameters" for "arguments", other
        keys ("type", "id") skipped. True once it is read; False where it breaks (a call already sent is closed).
        ``strict``: the first key must be one a call has (a bare object at the start of a Llama 3 response)."""
        self._pos += 1
        call = _ObjectCall()
        c = yield from self._peek()
        while c == '"':
            key = yield from self._value()
            if (strict and key not in _CALL_KEYS) or (yield from self._peek()) != ":":
                break
            self._pos += 1
            strict = False
            if (yield from self._peek()) is None or not (yield from self._member(key, call)):
                break
            c = yield from self._peek()
            if c == ",":
                self._pos += 1
                c = yield from self._peek()
            elif c != "}":
                break
        else:
            if c == "}" and call.name is not None:
                self._pos += 1
                if not call.opened:
                    self._open(call.name)
                self._args("{}" if call.args is None else call.args, self._pos)
                self._close()
                return True
        if call.opened:
            self._close()
        return False

    def _member(self, key: object, call: _ObjectCall) -> Gen[bool]:
        """The value of a call object's ``key``: the name (a stream sends the header now), the arguments (a
        stream sends them as they come once the header is out), anything else skipped."""
        if key in _ARG_KEYS and call.args is None and call.opened:
            call.args = ""
            return (yield from self._stream_args())
        start = self._pos
        value = yield from self._value()
        if value is _BAD:
            return False
        if key in _ARG_KEYS and call.args is None:
            call.args = self._buf[start:self._pos]
        elif key == "name" and call.name is None:
            if not isinstance(value, str) or not value:
                return False
            call.name = value
            if not self._final:
                self._open(value)
                call.opened = True
                if call.args is not None:  # arguments written before the name
                    self._args(call.args, self._pos)
                    call.args = ""
        return True

    def _call_array(self) -> Gen[bool]:
        """A JSON list of call objects at ``_pos`` ('['); True once it is read."""
        self._pos += 1
        c = yield from self._peek()
        while c == "{" and (yield from self._call_object()):
            c = yield from self._peek()
            if c != ",":
                break
            self._pos += 1
            c = yield from self._peek()
        if c == "]":
            self._pos += 1
            self._drop_to(self._pos)
            return True
        return False

    def _args_value(self, name: str) -> Gen[bool]:
        """A call named ``name`` whose arguments are the JSON value at ``_pos`` (Mistral's ``name[ARGS]{…}``)."""
        if (yield from self._peek()) is None:
            return False
        if self._final:
            start = self._pos
            if (yield from self._value()) is _BAD:
                return False
            self._open(name)
            self._args(self._buf[start:self._pos], self._pos)
        else:
            self._open(name)
            if not (yield from self._stream_args()):
                self._close()
                return False
        self._close()
        return True
