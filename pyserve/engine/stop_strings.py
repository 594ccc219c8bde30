"""StopStrings: stop sequences defined on text, for streams.

Text arrives in pieces; a stop string may straddle several. The checker never releases text that a
later match would have to retract: it holds back the longest tail that is a prefix of some stop string,
and releases it when the match fails or when generation ends (flush).
"""
from __future__ import annotations

from typing import Optional, Sequence


class StopStrings:
    def __init__(self, stops: Sequence[str]):
        self.stops = [s for s in stops if s]
        self.held = ""
        self.matched: Optional[str] = None

    def feed(self, text: str) -> str:
        """Returns the text that is safe to emit. After a match, `matched` is set and the rest is dropped."""
        if self.matched is not None or not text:
            return ""
        if not self.stops:
            return text
        buf = self.held + text
        hit = self._first_match(buf)
        if hit is not None:
            at, stop = hit
            self.matched, self.held = stop, ""
            return buf[:at]
        keep = self._partial_tail(buf)
        self.held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep]

    def flush(self) -> str:
        """Releases what is held back (generation ended without a match)."""
        out, self.held = self.held, ""
        return out

    def _first_match(self, buf: str) -> Optional[tuple[int, str]]:
        best = None
        for s in self.stops:
            i = buf.find(s)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        return best

    def _partial_tail(self, buf: str) -> int:
        """Length of the longest suffix of buf that is a proper prefix of a stop string."""
        longest = 0
        for s in self.stops:
            for n in range(min(len(s) - 1, len(buf)), longest, -1):
                if buf.endswith(s[:n]):
                    longest = n
                    break
        return longest
