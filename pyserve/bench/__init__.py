"""`pyserve bench`: a load generator for any OpenAI-compatible server.

    pyserve bench --base-url http://127.0.0.1:8000 --concurrency 1,4,16,64 --input-len 256 --output-len 128
    pyserve bench --base-url URL --request-rate 2,4,8 --duration 60          # open loop, Poisson arrivals
    pyserve bench --base-url URL --find-capacity --itl-p99-slo 0.050         # highest concurrency within SLO

Every request streams (SSE); the client measures, per request, TTFT (request sent -> first chunk with
content), each inter-token gap (ITL: the gaps between content chunks), TPOT ((e2e - ttft) / (tokens - 1)) and
e2e latency; per level, output tokens/s and requests/s over the level's wall time, errors, and mean/p50/p90/
p95/p99/max of each latency. Output tokens are the server's `usage.completion_tokens` (asked for with
`stream_options.include_usage`) or, when the server sends no usage, the number of content chunks.

Prompts are random English words cut to `--input-len` tokens, counted with the server's `POST /tokenize`
(vLLM's format) when it has one, else estimated from characters (`--chars-per-token`). With
`--shared-prefix-len P` every prompt starts with the same P-token text (for prefix caches). Prompts are never
reused within a run, so a prefix cache only ever sees the shared prefix.

Nothing here is specific to pyserve except an optional scrape of `GET /metrics` (Prometheus text) before
and after each level, whose counter deltas land in the JSON under `server_metrics`.

Needs httpx (and matplotlib for --plot): `pip install pyserve[bench]`.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Optional

STAT_KEYS = ("mean", "p50", "p90", "p95", "p99", "max")

# Common English words: random sequences of them make prompts that tokenize at roughly 1-1.5 tokens a word.
_WORDS = """
the of and to in is was for on that with as by at from his her he she it they we you this are be had have
not but or an which one all were there been their has when who will more no if out so said what up its about
into than them can only other new some could time these two may then do first any my now such like our over
man me even most made after also did many before must through back years where much your way well down should
because each just those people how too little state good very make world still own see men work long get here
between both life being under never day same another know while last might great old year off come since
against go came right used take three states himself few house use during without again place american around
however home small found thought went say part once general high upon school every does got united left number
course war until always away something fact though water less public put think almost hand enough far took head
yet government system better set told nothing night end why called didn find look going asked later point knew
city next program business give group toward young days let room president side social present given several
order national second possible rather per face among form important often things looked early white case john
become large big need four within felt along children saw best church ever least power development light thing
seemed family interest want members mind country area others done turned although open god service certain kind
problem began different door thus help sense means whole matter perhaps itself york times law human line above
name example action company hands local show whether five history gave today either act feet across taken past
quite anything seen having death experience body word half really field week car words already information
""".split()


# ----------------------------------------------------------------------------------------------- statistics

def percentile(sorted_values: list[float], q: float) -> float:
    """The q-th percentile (0..100) of sorted values, linear interpolation between ranks (numpy's default)."""
    n = len(sorted_values)
    if n == 1:
        return sorted_values[0]
    pos = (n - 1) * q / 100.0
    lo = int(math.floor(pos))
    hi = min(lo + 1, n - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def summarize(values: list[float]) -> dict[str, Optional[float]]:
    """mean, p50, p90, p95, p99, max of the values; all None when there are none."""
    if not values:
        return {k: None for k in STAT_KEYS}
    s = sorted(values)
    out = {"mean": sum(s) / len(s)}
    for q in (50, 90, 95, 99):
        out[f"p{q}"] = percentile(s, q)
    out["max"] = s[-1]
    # Interpolation rounding must not break the ordering p50 <= ... <= max.
    prev = -math.inf
    for k in ("p50", "p90", "p95", "p99", "max"):
        out[k] = prev = max(prev, out[k])
    return out


# --------------------------------------------------------------------------------------- Prometheus scrape

def parse_prometheus(text: str) -> tuple[dict[str, str], dict[str, float]]:
    """(family -> type, 'name{labels}' -> value) from Prometheus text exposition."""
    types: dict[str, str] = {}
    samples: dict[str, float] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line:
            continue
        if line.startswith("#"):
            parts = line.split()
            if len(parts) >= 4 and parts[1] == "TYPE":
                types[parts[2]] = parts[3]
            continue
        if "}" in line:
            key, _, rest = line.rpartition("}")
            key += "}"
        else:
            key, _, rest = line.partition(" ")
        fields = rest.split()
        if not fields:
            continue
        try:
            samples[key] = float(fields[0])
        except ValueError:
            continue
    return types, samples


def _family(name: str, types: dict[str, str]) -> tuple[str, str]:
    if name in types:
        return name, types[name]
    for suffix in ("_total", "_sum", "_count", "_bucket", "_created", "_info"):
        if name.endswith(suffix) and name[: -len(suffix)] in types:
            return name[: -len(suffix)], types[name[: -len(suffix)]]
    return name, "untyped"


def metrics_delta(before: str, after: str) -> dict[str, float]:
    """Counter (and histogram/summary _sum/_count) increases over a level, plus gauges' values after it.
    Histogram buckets and *_created timestamps are left out."""
    _, b = parse_prometheus(before)
    types, a = parse_prometheus(after)
    out: dict[str, float] = {}
    for key, value in a.items():
        name = key.split("{", 1)[0]
        if name.endswith("_bucket") or name.endswith("_created"):
            continue
        _, kind = _family(name, types)
        if kind in ("counter", "histogram", "summary"):
            d = value - b.get(key, 0.0)
            if d:
                out[key] = d
        elif kind == "gauge":
            out[key] = value
    return out


# ------------------------------------------------------------------------------------------------ requests

@dataclass
class RequestResult:
    ok: bool = False
    error: Optional[str] = None
    ttft: Optional[float] = None
    e2e: Optional[float] = None
    itl: list[float] = field(default_factory=list)
    output_tokens: int = 0
    prompt_tokens: Optional[int] = None
    usage_reported: bool = False

    @property
    def tpot(self) -> Optional[float]:
        if self.ok and self.output_tokens > 1 and self.ttft is not None and self.e2e is not None:
            return (self.e2e - self.ttft) / (self.output_tokens - 1)
        return None


def _chunk_text(obj: dict) -> str:
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


async def send_request(client, target: Target, prompt: str) -> RequestResult:
    """One streamed request, timed on the client."""
    r = RequestResult()
    body = target.body(prompt)
    chunks = 0
    last = None
    done = finished = False
    t0 = time.perf_counter()
    try:
        async with client.stream("POST", target.url, json=body, headers=target.headers) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode("utf-8", "replace")
                r.error = f"HTTP {resp.status_code}: {text[:200]}"
                return r
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    done = True
                    break
                now = time.perf_counter()
                try:
                    obj = json.loads(data)
                except ValueError:
                    r.error = f"bad SSE data: {data[:100]}"
                    return r
                if not isinstance(obj, dict):
                    continue
                if "error" in obj:
                    err = obj["error"]
                    r.error = "stream error: " + (err.get("message", str(err)) if isinstance(err, dict) else str(err))
                    return r
                if _chunk_text(obj):
                    if r.ttft is None:
                        r.ttft = now - t0
                    else:
                        r.itl.append(now - last)
                    last = now
                    chunks += 1
                for c in obj.get("choices") or []:
                    if isinstance(c, dict) and c.get("finish_reason"):
                        finished = c["finish_reason"]
                usage = obj.get("usage")
                if isinstance(usage, dict) and usage.get("completion_tokens") is not None:
                    r.usage_reported = True
                    r.output_tokens = int(usage["completion_tokens"])
                    if usage.get("prompt_tokens") is not None:
                        r.prompt_tokens = int(usage["prompt_tokens"])
        r.e2e = time.perf_counter() - t0
    except Exception as e:  # transport errors, timeouts, ...
        r.error = f"{type(e).__name__}: {e}"[:200]
        return r
    if not (done or finished):
        r.error = "stream ended early (no finish_reason, no [DONE])"
        return r
    if not r.usage_reported:
        r.output_tokens = chunks
    if r.ttft is None:
        r.error = f"no output tokens (finish_reason {finished or None})"
        return r
    r.ok = True
    return r


# ------------------------------------------------------------------------------------------------- prompts

class LengthCounter:
    """Counts prompt lengths in the server's tokens (POST /tokenize) or estimates them from characters."""

    def __init__(self, client=None, base_url: str = "", model: str = "", headers=None,
                 chars_per_token: float = 4.0):
        self.client, self.base_url, self.model, self.headers = client, base_url, model, headers or {}
        self.chars_per_token = chars_per_token
        self.use_tokenize = client is not None
        self.max_model_len: Optional[int] = None

    @property
    def unit(self) -> str:
        return "tokens (server /tokenize)" if self.use_tokenize else f"chars/{self.chars_per_token:g}"

    async def probe(self) -> None:
        """Keeps /tokenize only if the server answers it in vLLM's format."""
        if not self.use_tokenize:
            return
        try:
            n = await self._tokenize("Hello world")
            self.use_tokenize = n is not None
        except Exception:
            self.use_tokenize = False

    async def _tokenize(self, text: str) -> Optional[int]:
        resp = await self.client.post(self.base_url + "/tokenize", json={"model": self.model, "prompt": text},
                                      headers=self.headers)
        if resp.status_code != 200:
            return None
        obj = resp.json()
        if not isinstance(obj, dict):
            return None
        if isinstance(obj.get("max_model_len"), int):
            self.max_model_len = obj["max_model_len"]
        if isinstance(obj.get("count"), int):
            return obj["count"]
        if isinstance(obj.get("tokens"), list):
            return len(obj["tokens"])
        return None

    async def count(self, text: str) -> int:
        if self.use_tokenize:
            n = await self._tokenize(text)
            if n is not None:
                return n
            raise RuntimeError("POST /tokenize stopped answering")
        return max(1, math.ceil(len(text) / self.chars_per_token)) if text else 0


class PromptMaker:
    """Random-word prompts of a set length, optionally behind a shared prefix of a set length."""

    def __init__(self, counter: LengthCounter, input_len: int, shared_prefix_len: int = 0, seed: int = 0):
        self.counter, self.input_len, self.prefix_len = counter, input_len, shared_prefix_len
        self.rng = random.Random(seed)
        self.prefix = ""
        self.units_per_word = 1.5 if counter.use_tokenize else 6.0 / counter.chars_per_token
        self.lengths: list[int] = []

    def _words(self, n: int) -> list[str]:
        return [self.rng.choice(_WORDS) for _ in range(n)]

    async def _fit(self, head: str, target: int) -> tuple[str, int]:
        """head + random words, counted as close to `target` as the words allow (never over, when it can)."""
        empty = await self.counter.count(head) if head else await self.counter.count("")
        need = target - empty
        if need <= 0:
            return head, empty
        words = self._words(max(1, round(need / self.units_per_word)))
        sep = " " if head else ""
        best: Optional[tuple[str, int]] = None
        for _ in range(8):
            text = head + sep + " ".join(words)
            n = await self.counter.count(text)
            if n <= target and (best is None or n > best[1]):
                best = (text, n)
            if n == target:
                break
            per = max(0.5, (n - empty) / max(1, len(words)))
            step = round((target - n) / per)
            if step == 0:
                step = 1 if n < target else -1
            if step > 0:
                words += self._words(step)
            else:
                words = words[: max(1, len(words) + step)]
            if n > target and len(words) == 1:
                break
        if best is None:  # even one word is too long: take it anyway
            text = head + sep + words[0]
            best = (text, await self.counter.count(text))
        # Top up with short words one at a time (usually one token each).
        text, n = best
        for _ in range(4):
            if n >= target:
                break
            cand = text + " a"
            m = await self.counter.count(cand)
            if m > target:
                break
            text, n = cand, m
        self.units_per_word = max(0.3, (n - empty) / max(1, len(text[len(head):].split())))
        return text, n

    async def setup(self) -> None:
        if self.prefix_len:
            self.prefix, n = await self._fit("", self.prefix_len)
            self.prefix_len_actual = n

    async def make(self) -> str:
        text, n = await self._fit(self.prefix, self.input_len)
        self.lengths.append(n)
        return text


class PromptSource:
    """Hands out fresh prompts; `fill` makes them ahead of a level, `get` makes more if a level runs past."""

    def __init__(self, maker: PromptMaker):
        self.maker = maker
        self.ready: list[str] = []

    async def fill(self, n: int) -> None:
        while len(self.ready) < n:
            self.ready.append(await self.maker.make())

    async def get(self) -> str:
        if self.ready:
            return self.ready.pop(0)
        return await self.maker.make()


# --------------------------------------------------------------------------------------------- progress

class Progress:
    def __init__(self, total: Optional[int], desc: str, enabled: bool = True):
        self.total, self.desc, self.n, self.errors = total, desc, 0, 0
        self.t0 = self.last_print = time.monotonic()
        self.bar = None
        self.enabled = enabled
        self.tty = sys.stderr.isatty()
        if not enabled:
            return
        try:
            from tqdm import tqdm

            self.bar = tqdm(total=total, desc=desc, file=sys.stderr, unit="req", leave=False)
        except ImportError:
            self._plain(force=True)

    def update(self, ok: bool) -> None:
        self.n += 1
        self.errors += not ok
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(1)
            if not ok:
                self.bar.set_postfix(errors=self.errors)
        else:
            self._plain()

    def _plain(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last_print < (0.2 if self.tty else 5.0):
            return
        self.last_print = now
        total = f"/{self.total}" if self.total else ""
        err = f", {self.errors} errors" if self.errors else ""
        msg = f"{self.desc}: {self.n}{total} requests, {now - self.t0:.1f} s{err}"
        sys.stderr.write(("\r" + msg + "\033[K") if self.tty else msg + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.close()
        elif self.tty:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()


# ------------------------------------------------------------------------------------------------- levels

def level_report(results: list[RequestResult], wall: float, concurrency: Optional[int]) -> dict:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    errors: dict[str, int] = {}
    for r in results:
        if not r.ok:
            errors[r.error or "error"] = errors.get(r.error or "error", 0) + 1
    prompt_tokens = [r.prompt_tokens for r in ok if r.prompt_tokens is not None]
    rep = {
        "concurrency": concurrency,
        "completed": len(ok),
        "errors": len(results) - len(ok),
        "duration_s": wall,
        "output_tokens": out_tokens,
        "output_tokens_per_s": out_tokens / wall if wall > 0 else 0.0,
        "requests_per_s": len(ok) / wall if wall > 0 else 0.0,
        "ttft": summarize([r.ttft for r in ok if r.ttft is not None]),
        "itl": summarize([g for r in ok for g in r.itl]),
        "tpot": summarize([t for r in ok if (t := r.tpot) is not None]),
        "e2e": summarize([r.e2e for r in ok if r.e2e is not None]),
        "output_tokens_mean": out_tokens / len(ok) if ok else None,
        "prompt_tokens_mean": sum(prompt_tokens) / len(prompt_tokens) if prompt_tokens else None,
        "usage_reported": all(r.usage_reported for r in ok) if ok else None,
    }
    if errors:
        rep["error_messages"] = dict(sorted(errors.items(), key=lambda kv: -kv[1])[:5])
    return rep


class Runner:
    def __init__(self, args: argparse.Namespace, client, target: Target, source: PromptSource,
                 metrics_url: Optional[str]):
        self.args, self.client, self.target, self.source = args, client, target, source
        self.metrics_url = metrics_url
        self.levels: list[dict] = []
        self.rng = random.Random(args.seed + 1)

    def _n_prompts(self, concurrency: int) -> Optional[int]:
        if self.args.num_prompts is not None:
            return self.args.num_prompts
        if self.args.duration is not None:
            return None
        return max(16, 4 * concurrency)

    async def _scrape(self) -> Optional[str]:
        if not self.metrics_url:
            return None
        try:
            resp = await self.client.get(self.metrics_url, timeout=5.0, headers=self.target.headers)
            if resp.status_code == 200 and "html" not in resp.headers.get("content-type", ""):
                return resp.text
        except Exception:
            pass
        self.metrics_url = None  # the server has none: stop asking
        return None

    async def _timed(self, prompt: str, results: list, progress: Progress) -> None:
        r = await send_request(self.client, self.target, prompt)
        results.append(r)
        progress.update(r.ok)

    async def closed_level(self, concurrency: int) -> dict:
        n = self._n_prompts(concurrency)
        await self.source.fill(n if n is not None else min(2 * concurrency + 16, 1024))
        results: list[RequestResult] = []
        issued = 0
        before = await self._scrape()
        progress = Progress(n, f"concurrency {concurrency}", not self.args.no_progress)
        start = time.perf_counter()
        deadline = start + self.args.duration if self.args.duration is not None else None

        async def worker() -> None:
            nonlocal issued
            while (n is None or issued < n) and (deadline is None or time.perf_counter() < deadline):
                issued += 1
                await self._timed(await self.source.get(), results, progress)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
        progress.close()
        rep = level_report(results, wall, concurrency)
        rep["mode"] = "closed"
        await self._add_metrics(rep, before)
        self.levels.append(rep)
        return rep

    async def open_level(self, rate: float) -> dict:
        cap = self.args.max_concurrency
        n = self.args.num_prompts
        if n is None and self.args.duration is None:
            n = max(16, int(4 * rate * 4)) if math.isfinite(rate) else 64
        await self.source.fill(n if n is not None else min(int(2 * rate) + 16 if math.isfinite(rate) else 64, 1024))
        results: list[RequestResult] = []
        sem = asyncio.Semaphore(cap) if cap else None
        inflight = peak = 0
        before = await self._scrape()
        progress = Progress(n, f"rate {rate:g}/s", not self.args.no_progress)

        async def one(prompt: str) -> None:
            nonlocal inflight, peak
            if sem is not None:
                await sem.acquire()
            inflight += 1
            peak = max(peak, inflight)
            try:
                await self._timed(prompt, results, progress)
            finally:
                inflight -= 1
                if sem is not None:
                    sem.release()

        start = time.perf_counter()
        deadline = start + self.args.duration if self.args.duration is not None else None
        tasks = []
        next_t = start
        issued = 0
        while (n is None or issued < n) and (deadline is None or time.perf_counter() < deadline):
            if math.isfinite(rate) and issued:
                next_t += self.rng.expovariate(rate)
                delay = next_t - time.perf_counter()
                if deadline is not None and next_t >= deadline:
                    break
                if delay > 0:
                    await asyncio.sleep(delay)
            prompt = await self.source.get()
            tasks.append(asyncio.ensure_future(one(prompt)))
            issued += 1
        await asyncio.gather(*tasks)
        wall = time.perf_counter() - start
        progress.close()
        rep = level_report(results, wall, cap if cap else peak)
        rep.update(mode="poisson", request_rate=rate if math.isfinite(rate) else None, peak_concurrency=peak)
        await self._add_metrics(rep, before)
        self.levels.append(rep)
        return rep

    async def _add_metrics(self, rep: dict, before: Optional[str]) -> None:
        if before is None:
            return
        after = await self._scrape()
        if after is not None:
            rep["server_metrics"] = metrics_delta(before, after)

    def meets_slo(self, rep: dict) -> bool:
        if rep["errors"] or not rep["completed"]:
            return False
        for key, slo in (("itl", self.args.itl_p99_slo), ("ttft", self.args.ttft_p99_slo)):
            if slo is not None:
                p99 = rep[key]["p99"]
                if p99 is None or p99 > slo:
                    return False
        return True


async def search_capacity(probe: Callable[[int], Awaitable[bool]], max_concurrency: int, start: int = 1) -> int:
    """The highest concurrency in [start, max_concurrency] for which `probe` holds: doubling from `start`
    until it fails (or max_concurrency is reached), then bisecting between the last pass and the first
    fail. 0 when even `start` fails. Assumes the SLO holds below some point and fails above it."""
    good, bad = 0, None
    c = start
    while True:
        if await probe(c):
            good = c
            if c >= max_concurrency:
                return good
            c = min(2 * c, max_concurrency)
        else:
            bad = c
            break
    if good == 0:
        return 0
    while bad - good > 1:
        mid = (good + bad) // 2
        if await probe(mid):
            good = mid
        else:
            bad = mid
    return good


# -------------------------------------------------------------------------------------------------- output

def _ms(v: Optional[float]) -> str:
    return "-" if v is None else f"{v * 1000:.1f}"


def _s(v: Optional[float]) -> str:
    return "-" if v is None else f"{v:.2f}"


def format_table(levels: list[dict]) -> str:
    rate_mode = any(lv.get("mode") == "poisson" for lv in levels)
    head = ["rate" if rate_mode else "conc", "done", "err", "req/s", "out tok/s", "tok/req", "TTFT p50", "TTFT p99",
            "ITL p50", "ITL p99", "TPOT p50", "TPOT p99", "E2E p50", "E2E p99"]
    rows = []
    for lv in levels:
        x = lv.get("request_rate") if rate_mode else lv["concurrency"]
        rows.append([("inf" if x is None else f"{x:g}"), str(lv["completed"]), str(lv["errors"]),
                     f"{lv['requests_per_s']:.2f}", f"{lv['output_tokens_per_s']:.1f}",
                     "-" if lv["output_tokens_mean"] is None else f"{lv['output_tokens_mean']:.1f}",
                     _ms(lv["ttft"]["p50"]), _ms(lv["ttft"]["p99"]), _ms(lv["itl"]["p50"]), _ms(lv["itl"]["p99"]),
                     _ms(lv["tpot"]["p50"]), _ms(lv["tpot"]["p99"]), _s(lv["e2e"]["p50"]), _s(lv["e2e"]["p99"])])
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(head)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(head, widths)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    lines.append("(TTFT/ITL/TPOT in ms, E2E in s)")
    return "\n".join(lines)


def plot_levels(result: dict, path: str) -> None:
    """A PNG: output tokens/s, TTFT p50/p99 and ITL p50/p99 against concurrency (or request rate)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    levels = result["levels"]
    rate_mode = any(lv.get("mode") == "poisson" for lv in levels)
    xkey = "request_rate" if rate_mode else "concurrency"
    levels = sorted((lv for lv in levels if lv.get(xkey) is not None), key=lambda lv: lv[xkey])
    xs = [lv[xkey] for lv in levels]
    slo = result.get("slo") or {}
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))

    def series(key, q):
        return [None if lv[key][q] is None else lv[key][q] * 1000 for lv in levels]

    axes[0].plot(xs, [lv["output_tokens_per_s"] for lv in levels], "o-", label="output tok/s")
    axes[0].set_ylabel("output tokens/s")
    axes[0].set_title("Throughput")
    for ax, key, title in ((axes[1], "ttft", "TTFT"), (axes[2], "itl", "Inter-token latency")):
        for q, style in (("p50", "o-"), ("p99", "s--")):
            ax.plot(xs, series(key, q), style, label=f"{key.upper()} {q}")
        if slo.get(f"{key}_p99") is not None:
            ax.axhline(slo[f"{key}_p99"] * 1000, color="red", lw=1, ls=":", label=f"p99 SLO")
        ax.set_ylabel("ms")
        ax.set_title(title)
    for ax in axes:
        ax.set_xlabel("request rate (req/s)" if rate_mode else "concurrency")
        if len(set(xs)) > 1 and min(xs) > 0:
            ax.set_xscale("log", base=2)
            ax.set_xticks(xs)
            ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        if result.get("capacity"):
            ax.axvline(result["capacity"], color="green", lw=1, ls="-.", label=f"capacity {result['capacity']}")
        ax.set_ylim(bottom=0)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    title = (result.get("config") or {}).get("model")
    if title:
        fig.suptitle(str(title).rsplit("/", 1)[-1], fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------------------------------------------- main

def _root_url(url: str) -> str:
    url = url.rstrip("/")
    return url[:-3] if url.endswith("/v1") else url


def _int_list(text: str) -> list[int]:
    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of integers: {text!r}") from None
    if not vals or any(v < 1 for v in vals):
        raise argparse.ArgumentTypeError(f"concurrency levels must be >= 1: {text!r}")
    return vals


def _float_list(text: str) -> list[float]:
    try:
        vals = [float(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of numbers: {text!r}") from None
    if not vals or any(not v > 0 for v in vals):
        raise argparse.ArgumentTypeError(f"request rates must be > 0 ('inf' allowed): {text!r}")
    return vals


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "bench", help="load-test an OpenAI-compatible server",
        description="Load generator for any OpenAI-compatible server: streams every request and measures "
                    "TTFT, inter-token latency, TPOT, end-to-end latency and throughput per load level.")
    p.add_argument("--base-url", required=True, help="the server, e.g. http://127.0.0.1:8000 (a trailing /v1 is fine)")
    p.add_argument("--model", default=None, help="model name (default: the first of GET /v1/models)")
    p.add_argument("--endpoint", choices=("completions", "chat"), default="completions",
                   help="/v1/completions (default; exact prompt lengths) or /v1/chat/completions")
    p.add_argument("--api-key", default=None, help="sent as 'Authorization: Bearer KEY'")
    load = p.add_argument_group("load")
    load.add_argument("--concurrency", type=_int_list, default=None,
                      help="closed-loop levels: that many requests always in flight (default 1,4,16,64)")
    load.add_argument("--request-rate", type=_float_list, default=None,
                      help="open-loop levels instead: Poisson arrivals at R requests/s ('inf': all at once)")
    load.add_argument("--max-concurrency", type=int, default=None,
                      help="cap on requests in flight with --request-rate; upper bound for --find-capacity "
                           "(default 256 there)")
    load.add_argument("--num-prompts", type=int, default=None,
                      help="requests per level (default: max(16, 4 x concurrency), or unbounded with --duration)")
    load.add_argument("--duration", type=float, default=None,
                      help="seconds per level: no new requests after that (those in flight finish)")
    load.add_argument("--warmup", type=int, default=1, help="requests sent (and discarded) before the first level")
    load.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds")
    data = p.add_argument_group("prompts")
    data.add_argument("--input-len", type=int, default=256, help="prompt length in tokens")
    data.add_argument("--output-len", type=int, default=128, help="max_tokens of every request")
    data.add_argument("--shared-prefix-len", type=int, default=0,
                      help="tokens at the start of every prompt that are the same for all (prefix-cache test)")
    data.add_argument("--chars-per-token", type=float, default=4.0,
                      help="length estimate when the server has no POST /tokenize")
    data.add_argument("--no-tokenize", action="store_true", help="do not use POST /tokenize; estimate from chars")
    data.add_argument("--seed", type=int, default=0)
    data.add_argument("--temperature", type=float, default=None, help="sent when given (default: server's)")
    data.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                      help="do not send ignore_eos: true (for servers that reject unknown fields)")
    data.add_argument("--extra-body", type=json.loads, default=None, metavar="JSON",
                      help="extra request fields, e.g. '{\"min_tokens\": 128}'")
    cap = p.add_argument_group("capacity search")
    cap.add_argument("--find-capacity", action="store_true",
                     help="find the highest concurrency within the p99 SLO(s): doubling, then bisecting")
    cap.add_argument("--itl-p99-slo", type=float, default=None, help="seconds, e.g. 0.050")
    cap.add_argument("--ttft-p99-slo", type=float, default=None, help="seconds")
    out = p.add_argument_group("output")
    out.add_argument("--output-json", default=None, metavar="FILE", help='write {"levels": [...], ...}')
    out.add_argument("--plot", default=None, metavar="FILE", help="PNG of throughput, TTFT and ITL per level")
    out.add_argument("--no-server-metrics", action="store_true", help="do not scrape GET /metrics")
    out.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)
    return p


def _check_args(args: argparse.Namespace) -> Optional[str]:
    if args.input_len < 1 or args.output_len < 1:
        return "--input-len and --output-len must be >= 1"
    if not 0 <= args.shared_prefix_len < args.input_len:
        return "--shared-prefix-len must be below --input-len"
    if args.num_prompts is not None and args.num_prompts < 1:
        return "--num-prompts must be >= 1"
    if args.duration is not None and args.duration <= 0:
        return "--duration must be > 0"
    if args.max_concurrency is not None and args.max_concurrency < 1:
        return "--max-concurrency must be >= 1"
    if args.request_rate and args.concurrency:
        return "--concurrency and --request-rate exclude each other (cap a rate with --max-concurrency)"
    if args.request_rate and any(math.isinf(r) for r in args.request_rate) and args.num_prompts is None \
            and args.duration is not None:
        return "--request-rate inf with --duration needs --num-prompts (it would send without end)"
    if args.find_capacity:
        if args.request_rate:
            return "--find-capacity searches concurrency; drop --request-rate"
        if args.itl_p99_slo is None and args.ttft_p99_slo is None:
            return "--find-capacity needs --itl-p99-slo and/or --ttft-p99-slo"
        if args.itl_p99_slo is not None and args.output_len < 2:
            return "--itl-p99-slo needs --output-len >= 2"
    if args.extra_body is not None and not isinstance(args.extra_body, dict):
        return "--extra-body must be a JSON object"
    return None


async def _main(args: argparse.Namespace) -> int:
    import httpx

    root = _root_url(args.base_url)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    timeout = httpx.Timeout(args.timeout, connect=min(args.timeout, 30.0))
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        model = args.model
        if model is None:
            try:
                resp = await client.get(root + "/v1/models", headers=headers)
                resp.raise_for_status()
                model = resp.json()["data"][0]["id"]
            except Exception as e:
                print(f"pyserve bench: error: no --model given and GET {root}/v1/models failed: {e}", file=sys.stderr)
                return 1
        counter = LengthCounter(None if args.no_tokenize else client, root, model, headers, args.chars_per_token)
        await counter.probe()
        if counter.max_model_len and args.input_len + args.output_len > counter.max_model_len:
            print(f"pyserve bench: warning: input + output length {args.input_len + args.output_len} exceeds the "
                  f"server's max_model_len {counter.max_model_len}", file=sys.stderr)
        maker = PromptMaker(counter, args.input_len, args.shared_prefix_len, args.seed)
        await maker.setup()
        source = PromptSource(maker)
        target = Target(root, model, args.endpoint, args.output_len, headers, args.ignore_eos, args.temperature,
                        args.extra_body or {})
        print(f"pyserve bench: {model} at {root} ({args.endpoint}), input {args.input_len} {counter.unit}"
              f"{f' (shared prefix {args.shared_prefix_len})' if args.shared_prefix_len else ''}, "
              f"output {args.output_len} tokens", file=sys.stderr)
        runner = Runner(args, client, target, source, None if args.no_server_metrics else root + "/metrics")

        for _ in range(args.warmup):
            r = await send_request(client, target, await source.get())
            if not r.ok:
                print(f"pyserve bench: warning: warm-up request failed: {r.error}", file=sys.stderr)

        result: dict[str, Any] = {"levels": runner.levels}
        if args.find_capacity:
            max_c = args.max_concurrency or 256
            tried: dict[int, bool] = {}

            async def probe(c: int) -> bool:
                if c not in tried:
                    rep = await runner.closed_level(c)
                    tried[c] = rep["slo_ok"] = runner.meets_slo(rep)
                    print(f"  concurrency {c}: ITL p99 {_ms(rep['itl']['p99'])} ms, TTFT p99 "
                          f"{_ms(rep['ttft']['p99'])} ms, {rep['errors']} errors -> "
                          f"{'within' if tried[c] else 'over'} SLO", file=sys.stderr)
                return tried[c]

            capacity = await search_capacity(probe, max_c)
            runner.levels.sort(key=lambda lv: lv["concurrency"])
            result["capacity"] = capacity
            result["slo"] = {"itl_p99": args.itl_p99_slo, "ttft_p99": args.ttft_p99_slo,
                             "max_concurrency": max_c}
        elif args.request_rate:
            for rate in args.request_rate:
                await runner.open_level(rate)
        else:
            for c in args.concurrency or [1, 4, 16, 64]:
                await runner.closed_level(c)

    result["config"] = {k: v for k, v in vars(args).items() if k not in ("func", "api_key", "command")}
    result["config"].update(model=model, base_url=root, length_unit=counter.unit,
                            prompt_len_mean=sum(maker.lengths) / len(maker.lengths) if maker.lengths else None)
    print(format_table(runner.levels))
    short = [lv for lv in runner.levels if lv["output_tokens_mean"] is not None
             and lv["output_tokens_mean"] < 0.9 * args.output_len]
    if short:
        print(f"pyserve bench: warning: requests ended before --output-len {args.output_len} tokens (mean "
              f"{min(lv['output_tokens_mean'] for lv in short):.1f}): the server ignores ignore_eos, or stops or "
              f"interrupts streams; latencies are for shorter outputs", file=sys.stderr)
    if args.find_capacity:
        slos = ", ".join(f"{k} {v * 1000:g} ms" for k, v in (("ITL p99", args.itl_p99_slo),
                                                                  ("TTFT p99", args.ttft_p99_slo)) if v is not None)
        print(f"capacity: {result['capacity']} concurrent requests within {slos}")
    if args.output_json:
        with open(args.output_json, "w") as f:
            json.dump(result, f, indent=2)
    if args.plot:
        plot_levels(result, args.plot)
    return 0


def run(args: argparse.Namespace) -> int:
    err = _check_args(args)
    if err:
        print(f"pyserve bench: error: {err}", file=sys.stderr)
        return 2
    try:
        import httpx  # noqa: F401
    except ImportError:
        print("pyserve bench: error: needs httpx (pip install 'pyserve[bench]')", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_main(args))
    except KeyboardInterrupt:
        return 130


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="pyserve")
    add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
