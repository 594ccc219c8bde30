"""What the server layer hands the serving layer with each request, so that serving never reaches up.

- `observer`: the request's clock (the server's metrics timer). Serving reports what happens; the observer
  decides what to measure. Outside an instrumented app, `NullObserver`.
- `admit(demand)`: the HTTP edge's admission (per-key token rate limit, queue admission); raises a 429
  OpenAIError or returns a ticket whose `release()` the serving layer calls when the request ends.
- `draining`: set at the drain deadline of a shutdown; in-flight responses end with an error.
- `stall_timeout` / `on_stall`: a stream whose client stops reading is aborted after that many seconds.
- `request_id`: the request's id (the client's X-Request-Id, or one the edge made); responses' ids build on it.
- `owner`: who stored state (the response store) belongs to: a hash of the caller's API key; None on a server
  without keys.
- `cache_tenant`: whose prefix cache a request's prompt may reuse: the owner, unless the server shares one
  cache across keys (--shared-prefix-cache); `cache_salt()` folds it into the request's own salt.
- `sse_keepalive`: a stream silent this many seconds (a long prefill, a queue) gets an SSE comment line (0: never).
"""
from __future__ import annotations

import secrets
from dataclasses import dataclass, field
from typing import Callable, Optional, Protocol

import trio


class RequestObserver(Protocol):
    def start(self, n_prompt: int, stream: bool) -> None:
        """A generation begins: `n_prompt` prompt tokens (each prompt once, whatever n)."""

    def output(self, out) -> int:
        """Notes one engine delta (a StreamOutput); returns its token count."""

    def received(self, k: int) -> None:
        """Non-streamed: k tokens arrived from the engine now."""

    def writing(self, k: int) -> None:
        """Streamed: the body write about to be handed to the server carries k more tokens."""

    def end(self, outcome: str) -> None:
        """The generation is over: "ok", "error" or "abort" (the client went away)."""


class NullObserver:
    def start(self, n_prompt: int, stream: bool) -> None:
        pass

    def output(self, out) -> int:
        return len(out.token_ids_delta)

    def received(self, k: int) -> None:
        pass

    def writing(self, k: int) -> None:
        pass

    def end(self, outcome: str) -> None:
        pass


@dataclass
class Demand:
    """What a request asks of the server, for admission: each choice's (prompt tokens, max_tokens bound),
    and the max_tokens the client sent (None: the bound is the rest of the context)."""
    choices: list[tuple[int, int]]
    asked: Optional[int]


class _NoTicket:
    def release(self) -> None:
        pass


def admit_all(demand: Demand) -> _NoTicket:
    return _NoTicket()


@dataclass
class RequestContext:
    observer: RequestObserver = field(default_factory=NullObserver)
    admit: Callable[[Demand], object] = admit_all
    draining: Optional[trio.Event] = None
    stall_timeout: float = 0.0
    on_stall: Optional[Callable[[], None]] = None
    request_id: str = field(default_factory=lambda: secrets.token_hex(12))
    owner: Optional[str] = None
    cache_tenant: Optional[str] = None
    sse_keepalive: float = 0.0

    def cache_salt(self, salt: Optional[str]) -> Optional[str]:
        """The salt a prompt is cached under: the request's own (vLLM's cache_salt) within its tenant's, so
        that no key's prompts are probed through another's cache hits (None: the shared cache)."""
        if self.cache_tenant is None:
            return salt
        return f"{self.cache_tenant}:{salt or ''}"  # the tenant is a hex digest: no ':' in it

    def response_id(self, prefix: str) -> str:
        return f"{prefix}-{self.request_id}"
