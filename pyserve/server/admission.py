"""Admission control at the HTTP edge: per-key rate limits and a bounded, deadline-aware waiting queue.

Rate limits (`--rate-limit-rpm`, `--rate-limit-tpm`): one pair of token buckets per client key (the API key,
or the client address when no keys are configured). A bucket holds a minute's allowance and refills
continuously; a request takes 1 from the request bucket and (prompt tokens + max_tokens) from the token
bucket -- when max_tokens is absent, `default_completion_estimate` stands in for it. An empty bucket answers
429 `rate_limit_error` with `Retry-After` (seconds until the bucket holds enough).

Queue admission (`--max-waiting`, `--max-queue-wait`): every admitted request holds its sequences (prompts x
n) in the system until it ends. Up to `max_num_seqs` sequences run at once; the rest wait. A new request
that would wait is refused at once with 429 + `Retry-After` when the waiting queue would exceed
`max_waiting` sequences, or when its estimated start is later than `max_queue_wait` seconds. The estimate:
the sequences ahead of it beyond the running capacity must finish first; with the measured finish rate r
(sequences per second over a sliding window) and capacity C, a running sequence takes C / r on average, and
each group of C sequences ahead is counted as one full service time (finishes may come in lockstep
batches), i.e. ceil(ahead / C) * C / r -- a bound for the tail rather than the mean. Refusing at the door keeps the time-to-first-token of accepted requests bounded instead of
accepting everything and serving it too late.
"""
from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Optional

from ..api.base.context import Demand
from ..api.base.errors import OpenAIError


def rate_limited(message: str, retry_after: float, code: str = "rate_limit_exceeded") -> OpenAIError:
    secs = max(1, math.ceil(retry_after))
    return OpenAIError(message, 429, "rate_limit_error", None, code, headers={"Retry-After": str(secs)})


class TokenBucket:
    """`capacity` units, refilled at `capacity / period` per second."""

    def __init__(self, capacity: float, period: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.capacity = float(capacity)
        self.rate = self.capacity / period
        self.level = self.capacity
        self.clock = clock
        self.t = clock()

    def _refill(self) -> None:
        now = self.clock()
        self.level = min(self.capacity, self.level + (now - self.t) * self.rate)
        self.t = now

    def take(self, amount: float) -> float:
        """Takes `amount` and returns 0, or takes nothing and returns the seconds until it could."""
        self._refill()
        if amount <= self.level:
            self.level -= amount
            return 0.0
        return (amount - self.level) / self.rate


class RateLimiter:
    def __init__(self, rpm: int = 0, tpm: int = 0, clock: Callable[[], float] = time.monotonic,
                 max_keys: int = 10000):
        self.rpm, self.tpm, self.clock, self.max_keys = rpm, tpm, clock, max_keys
        self.requests: dict[str, TokenBucket] = {}
        self.tokens: dict[str, TokenBucket] = {}
        self.refused = 0

    @property
    def enabled(self) -> bool:
        return bool(self.rpm or self.tpm)

    def _bucket(self, table: dict, key: str, capacity: int) -> TokenBucket:
        b = table.get(key)
        if b is None:
            if len(table) >= self.max_keys:  # forget full (idle) buckets first; bounded memory
                now = self.clock()
                for k in [k for k, v in table.items() if v.level + (now - v.t) * v.rate >= v.capacity]:
                    del table[k]
                if len(table) >= self.max_keys:
                    table.pop(next(iter(table)))
            b = table[key] = TokenBucket(capacity, 60.0, self.clock)
        return b

    def check_request(self, key: str) -> None:
        if not self.rpm:
            return
        wait = self._bucket(self.requests, key, self.rpm).take(1)
        if wait:
            self.refused += 1
            raise rate_limited(f"Rate limit reached: {self.rpm} requests per minute. Please try again in "
                               f"{wait:.1f}s.", wait)

    def check_tokens(self, key: str, tokens: int) -> None:
        if not self.tpm:
            return
        if tokens > self.tpm:
            self.refused += 1
            raise rate_limited(f"Request too large: it needs {tokens} tokens (prompt + max_tokens) and the limit "
                               f"is {self.tpm} tokens per minute. Reduce the prompt or max_tokens.", 60,
                               code="tokens_exceeded")
        wait = self._bucket(self.tokens, key, self.tpm).take(tokens)
        if wait:
            self.refused += 1
            raise rate_limited(f"Rate limit reached: {self.tpm} tokens per minute; this request needs {tokens}. "
                               f"Please try again in {wait:.1f}s.", wait, code="tokens_exceeded")


@dataclass
class Estimate:
    running_capacity: int
    in_system: int  # sequences admitted and not finished
    queued: int  # of those, beyond the running capacity
    finish_rate: Optional[float]  # sequences per second, or None (not measured yet)
    wait: Optional[float]  # estimated seconds before a new request of `k` sequences starts


class Ticket:
    """An admitted request's place in the system; released once (explicitly, or when garbage collected)."""

    __slots__ = ("queue", "seqs", "released", "__weakref__")

    def __init__(self, queue: "AdmissionQueue", seqs: int):
        self.queue, self.seqs, self.released = queue, seqs, False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.queue._release(self.seqs)

    def __del__(self):
        self.release()


class AdmissionQueue:
    def __init__(self, capacity: Callable[[], int], max_waiting: int = 0, max_queue_wait: float = 0.0,
                 window: float = 30.0, clock: Callable[[], float] = time.monotonic):
        self.capacity = capacity  # sequences the engine runs at once
        self.max_waiting = max_waiting  # 0: unbounded
        self.max_queue_wait = max_queue_wait  # 0: no deadline
        self.window = window
        self.clock = clock
        self.in_system = 0
        self.finishes: deque = deque()  # (time, sequences)
        self.refused = 0
        self.admitted = 0

    @property
    def enabled(self) -> bool:
        return bool(self.max_waiting or self.max_queue_wait)

    def finish_rate(self) -> Optional[float]:
        now = self.clock()
        while self.finishes and now - self.finishes[0][0] > self.window:
            self.finishes.popleft()
        if len(self.finishes) < 2:
            return None
        span = now - self.finishes[0][0]
        if span <= 0:
            return None
        return sum(n for _, n in self.finishes) / span

    def estimate(self, k: int = 1) -> Estimate:
        cap = max(1, self.capacity())
        queued = max(0, self.in_system - cap)
        ahead = self.in_system + k - cap  # sequences that must finish before all k run
        rate = self.finish_rate()
        if ahead <= 0:
            wait = 0.0
        elif rate:
            # Conservative (a bound for the tail, not the mean): the running sequences may have started
            # together and finish together, so each group of `cap` sequences ahead costs one full service
            # time, cap / rate (Little's law), rather than cap smooth departures.
            wait = math.ceil(ahead / cap) * cap / rate
        else:
            wait = None
        return Estimate(cap, self.in_system, queued, rate, wait)

    def admit(self, k: int) -> Ticket:
        if self.enabled:
            est = self.estimate(k)
            new_queued = max(0, self.in_system + k - est.running_capacity)
            retry = (new_queued / est.finish_rate) if est.finish_rate else 5.0
            if self.max_waiting and new_queued > self.max_waiting:
                self.refused += 1
                raise rate_limited(f"The server is overloaded: {est.queued} sequences are waiting (at most "
                                   f"{self.max_waiting}). Please retry later.", retry, code="server_overloaded")
            if self.max_queue_wait and est.wait is not None and est.wait > self.max_queue_wait:
                self.refused += 1
                raise rate_limited(f"The server is overloaded: this request would start in about {est.wait:.1f}s, "
                                   f"over the {self.max_queue_wait:g}s bound. Please retry later.",
                                   est.wait - self.max_queue_wait, code="server_overloaded")
        self.in_system += k
        self.admitted += 1
        return Ticket(self, k)

    def _release(self, k: int) -> None:
        self.in_system -= k
        self.finishes.append((self.clock(), k))
        if len(self.finishes) > 4096:
            self.finishes.popleft()


class Admission:
    """What the serving layer's `admit(demand)` does for one client: the token rate limit (its cost: each
    choice's prompt plus the max_tokens asked, or `completion_estimate` capped by the choice's bound when
    none was), then queue admission. Returns the queue's ticket."""

    def __init__(self, limiter: RateLimiter, queue: AdmissionQueue, completion_estimate: int):
        self.limiter, self.queue, self.completion_estimate = limiter, queue, completion_estimate

    def admit(self, key: str, demand: Demand) -> Ticket:
        if self.limiter.tpm:
            est = self.completion_estimate
            cost = sum(n + (demand.asked if demand.asked is not None else min(est, bound))
                       for n, bound in demand.choices)
            self.limiter.check_tokens(key, cost)
        return self.queue.admit(len(demand.choices))
