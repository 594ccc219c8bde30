"""One streamed request and its timing on the client: TTFT, the inter-token gaps, e2e, output tokens."""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass
class RequestResult:
    ok: bool = False
    error: Optional[str] = None
    ttft: Optional[float] = None  # s, request sent (open loop: arrived) -> first chunk with content
    e2e: Optional[float] = None  # s, request sent (open loop: arrived) -> end of the stream
    queue_wait: float = 0.0  # s, arrived -> sent: waiting for a slot under --max-concurrency (open loop)
    itl: list[float] = field(default_factory=list)  # s, the gaps between content chunks
    output_tokens: int = 0
    prompt_tokens: Optional[int] = None
    usage_reported: bool = False

    @property
    def tpot(self) -> Optional[float]:
        if self.ok and self.output_tokens > 1 and self.ttft is not None and self.e2e is not None:
            return (self.e2e - self.ttft) / (self.output_tokens - 1)
        return None


def chunk_text(obj: dict) -> str:
    """The generated text of one streamed chunk (first choice), completions or chat (content or reasoning)."""
    choices = obj.get("choices") or []
    if not choices or not isinstance(choices[0], dict):
        return ""
    c = choices[0]
    if isinstance(c.get("text"), str):
        return c["text"]
    delta = c.get("delta") or {}
    parts = [delta.get(k) for k in ("content", "reasoning_content", "reasoning")]
    return "".join(p for p in parts if isinstance(p, str))


@dataclass
class Target:
    base_url: str  # scheme://host:port, no trailing /v1
    model: str
    endpoint: str  # "chat" | "completions"
    output_len: int
    headers: dict[str, str]
    ignore_eos: bool = True
    temperature: Optional[float] = None
    extra_body: dict = field(default_factory=dict)

    @property
    def url(self) -> str:
        return self.base_url + ("/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions")

    def body(self, prompt: str) -> dict:
        b: dict[str, Any] = {"model": self.model, "max_tokens": self.output_len, "stream": True,
                             "stream_options": {"include_usage": True}}
        if self.endpoint == "chat":
            b["messages"] = [{"role": "user", "content": prompt}]
        else:
            b["prompt"] = prompt
        if self.ignore_eos:
            b["ignore_eos"] = True
        if self.temperature is not None:
            b["temperature"] = self.temperature
        b.update(self.extra_body)
        return b


class _Stream:
    """One stream's state as its SSE events arrive."""

    def __init__(self, r: RequestResult, t0: float):
        self.r, self.t0 = r, t0
        self.last: Optional[float] = None  # perf_counter of the last content chunk
        self.chunks = 0  # content chunks: the token count when the server sends no usage
        self.done = False  # [DONE] seen
        self.finish_reason: Optional[str] = None

    def event(self, data: str, now: float) -> bool:
        """Takes one `data:` payload; False once the stream is over ([DONE]) or broken (r.error set)."""
        if data == "[DONE]":
            self.done = True
            return False
        try:
            obj = json.loads(data)
        except ValueError:
            self.r.error = f"bad SSE data: {data[:100]}"
            return False
        if not isinstance(obj, dict):
            return True
        if "error" in obj:
            err = obj["error"]
            self.r.error = "stream error: " + (err.get("message", str(err)) if isinstance(err, dict) else str(err))
            return False
        if chunk_text(obj):
            self._content(now)
        for c in obj.get("choices") or []:
            if isinstance(c, dict) and c.get("finish_reason"):
                self.finish_reason = c["finish_reason"]
        self._usage(obj.get("usage"))
        return True

    def _content(self, now: float) -> None:
        if self.r.ttft is None:
            self.r.ttft = now - self.t0
        else:
            self.r.itl.append(now - self.last)
        self.last = now
        self.chunks += 1

    def _usage(self, usage: Any) -> None:
        if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
            self.r.usage_reported = True
            self.r.output_tokens = int(usage["completion_tokens"])
            if usage.get("prompt_tokens") is not None:
                self.r.prompt_tokens = int(usage["prompt_tokens"])

    def close(self) -> None:
        """Judges the stream once it has ended without an error."""
        r = self.r
        if not (self.done or self.finish_reason):
            r.error = "stream ended early (no finish_reason, no [DONE])"
            return
        if not r.usage_reported:
            r.output_tokens = self.chunks
        if r.ttft is None:
            r.error = f"no output tokens (finish_reason {self.finish_reason})"
            return
        r.ok = True


async def send_request(client, target: Target, prompt: str, arrival: Optional[float] = None) -> RequestResult:
    """One streamed request (an httpx.AsyncClient's), timed on the client from `arrival` (perf_counter s, when
    the request was due; default: now, when it is sent)."""
    sent = time.perf_counter()
    t0 = sent if arrival is None else arrival
    r = RequestResult(queue_wait=sent - t0)
    stream = _Stream(r, t0)
    try:
        async with client.stream("POST", target.url, json=target.body(prompt), headers=target.headers) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode("utf-8", "replace")
                r.error = f"HTTP {resp.status_code}: {text[:200]}"
                return r
            async for line in resp.aiter_lines():
                if line.startswith("data:") and not stream.event(line[5:].strip(), time.perf_counter()):
                    break
        r.e2e = time.perf_counter() - t0
    except Exception as e:  # transport errors, timeouts, ...
        r.error = f"{type(e).__name__}: {e}"[:200]
        return r
    if r.error is None:
        stream.close()
    return r
