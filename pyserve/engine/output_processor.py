"""RequestState: turns one request's engine outputs (token, logprobs, finish) into text deltas.

Detokenization and stop strings live on the Python side of the per-step hand-off: the engine deals in
token ids; text is made here, once per token, incrementally.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .detokenizer import IncrementalDetokenizer
from .stop_strings import StopStrings
from .tokenizer import Tokenizer


def ranked(entry: dict[int, float]) -> list[tuple[int, float]]:
    """A logprobs entry's (id, logprob) pairs best first (value desc, id asc, the engine's order). An entry —
    a generated token's here, a prompt token's from the engine — is {the token: its logprob, then the best
    alternatives in that order, the token left out}: the token is merged in where it ranks, nothing sorted."""
    items = iter(entry.items())
    token, lp = next(items)
    rest = list(items)
    at = next((i for i, (t, v) in enumerate(rest) if lp > v or (lp == v and token < t)), len(rest))
    return rest[:at] + [(token, lp)] + rest[at:]


@dataclass(frozen=True)
class PromptProgress:
    """How far the prompt's prefill is (llama.cpp's `prompt_progress`): prompt tokens in all, served by the
    prefix cache, computed so far (cached ones included), and milliseconds since the request was first scheduled."""
    total: int
    cache: int
    processed: int
    time_ms: int

    def to_dict(self) -> dict:
        return {"total": self.total, "cache": self.cache, "processed": self.processed, "time_ms": self.time_ms}


@dataclass
class Delta:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: Optional[list[dict[int, float]]] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[str] = None  # the stop string that ended the sample (vLLM's stop_reason)
    progress: Optional[PromptProgress] = None  # the latest prompt progress (SamplingParams.return_progress)


class RequestState:
    """One sample's text state. Stop strings only count from the `min_tokens`-th token on (vLLM's rule)."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: list[int], stop: list[str], want_logprobs: bool,
                 skip_special: bool = True, min_tokens: int = 0, stop_ids: frozenset = frozenset()):
        self.detok = IncrementalDetokenizer(tokenizer, prompt_ids, skip_special=skip_special)
        self.stop_ids = stop_ids  # a token that ends the sample ("stop") writes no text, special or not (vLLM)
        self.stops = StopStrings(stop)
        self.want_logprobs = want_logprobs
        self.min_tokens = min_tokens
        self.n_tokens = 0
        self.finish_reason: Optional[str] = None

    @classmethod
    def for_params(cls, tokenizer: Tokenizer, prompt_ids: list[int], params) -> "RequestState":
        eos = frozenset() if params.ignore_eos else frozenset(tokenizer.eos_ids)
        stop_ids = frozenset(params.stop_token_ids) | eos
        return cls(tokenizer, prompt_ids, params.stop, params.logprobs is not None, params.skip_special_tokens,
                   params.min_tokens, stop_ids)

    def process(self, token: int, logprob: float, top: list, finish_reason: str) -> Delta:
        """One engine output. A stop-string match sets finish_reason 'stop' (the caller aborts the request)."""
        d = Delta()
        if token >= 0:
            d.token_ids.append(token)
            if self.want_logprobs:
                entry = {token: logprob}
                entry.update({tid: lp for tid, lp in top if tid not in entry})
                d.logprobs = [entry]
            self.n_tokens += 1
            text = "" if finish_reason == "stop" and token in self.stop_ids else self.detok.add(token)
            d.text = self.stops.feed(text) if self.n_tokens >= self.min_tokens else text
            if self.stops.matched is not None:
                self.finish_reason = d.finish_reason = "stop"
                d.stop_reason = self.stops.matched
                return d
        if finish_reason:
            if finish_reason != "abort":
                d.text += self.stops.feed(self.detok.flush())
                d.text += self.stops.flush()
                if self.stops.matched is not None:
                    finish_reason, d.stop_reason = "stop", self.stops.matched
            self.finish_reason = d.finish_reason = finish_reason
        return d
