"""Incremental (streaming) detokenization.

Each token contributes a fixed byte string (``Tokenizer.piece``), so decoding is a byte
concatenation followed by UTF-8 decoding. Streaming therefore only has to hold back the bytes
of a character that is not complete yet (an emoji spread over several byte-fallback tokens):
an incremental UTF-8 decoder does exactly that, in O(1) per token, and the concatenation of
its outputs equals the one-shot ``bytes.decode("utf-8", errors="replace")`` of the whole
sequence, replacement characters included.
"""
from __future__ import annotations

import codecs
from typing import Sequence

from .tokenizer import Tokenizer

__all__ = ["IncrementalDetokenizer"]

_Utf8Decoder = codecs.getincrementaldecoder("utf-8")


class IncrementalDetokenizer:
    """Turns generated token ids into text, one token at a time.

    ``"".join(add(t) for t in ids) + flush()`` equals ``tokenizer.decode(ids)`` when
    ``prompt_ids`` is empty, and the text the ids add after the prompt otherwise
    (``tokenizer.decode(prompt_ids + ids)`` minus ``tokenizer.decode(prompt_ids)``): the
    SentencePiece space prefix is only dropped when the text starts with these tokens.
    No ``add`` result ever ends inside a UTF-8 character.
    """

    __slots__ = ("tokenizer", "skip_special", "_decoder", "_strip_space", "_piece", "n_tokens")

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int] = (), skip_special: bool = True) -> None:
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        self._decoder = _Utf8Decoder(errors="replace")
        self._piece = tokenizer.piece
        # a space prefix is removed only where the whole text starts: with a prompt that
        # renders to something, the generated text is a continuation and keeps its spaces
        self._strip_space = bool(tokenizer.add_space_prefix) and not any(
            tokenizer.piece(i, skip_special) for i in prompt_ids)
        self.n_tokens = 0

    def add(self, token_id: int) -> str:
        """The new text that ``token_id`` completes ("" while a character is incomplete)."""
        self.n_tokens += 1
        data = self._piece(token_id, self.skip_special)
        if not data:
            return ""
        if self._strip_space:
            self._strip_space = False
            if data[:1] == b" ":
                data = data[1:]
        return self._decoder.decode(data, False)

    def flush(self) -> str:
        """Text still held back (an incomplete character comes out as U+FFFD, as in ``decode``)."""
        out = self._decoder.decode(b"", True)
        self._decoder.reset()
        return out
