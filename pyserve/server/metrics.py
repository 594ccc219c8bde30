"""Prometheus metrics: what users feel (latencies measured at the socket), what the server did (tokens,
outcomes), and the engine's state (read at scrape time).

Every app has its own CollectorRegistry, so several apps in one process never collide. Names mirror vLLM's
with the `pyserve:` prefix; every series carries `model_name`.

Clock: `time.monotonic()` throughout; the engine's timestamps (StepOutput.scheduled_ts / step_ts) are
CLOCK_MONOTONIC too, so they compare with the HTTP arrival directly.

How a generation request is timed (`RequestTimer`, one per HTTP request, kept in the ASGI scope):
- arrival: the first line of the app's ASGI callable (`instrument`), before Quart parses anything, before the
  body is read, the template rendered, the prompt tokenized or the request queued in the engine;
- a token is *written* when the body write that carries it has returned from the server's send (the
  socket write). The serving layer reports the tokens of each chunk (`writing(k)`) before yielding it; the
  ASGI send wrapper calls `written()` after the send. An empty write (a delta whose text is held back, e.g. a
  partial stop string) carries its tokens over to the next non-empty write;
- time to first token: arrival → the first write with a token. For a non-streamed response that is the
  write of the response body, so there TTFT == e2e (nothing reaches the user earlier);
- inter-token latency: one observation per token after the request's first. A write of k tokens that comes
  g seconds after the previous one records g/k, k times (the gap of a batched write split evenly over its
  tokens); extra tokens in the request's first write record 0. So per request count == tokens − 1 and sum ==
  last write − first write. Non-streamed responses have no per-token writes: their tokens count as
  "visible" when the server receives them from the engine, with the same rule;
- time per output token: (e2e − ttft) / (tokens − 1) for a stream; (last token received − first) /
  (tokens − 1) for a non-streamed response (whose ttft is e2e);
- queue time: arrival → the engine step that first scheduled any of the request's choices; prefill: that
  step → the forward pass that produced the first token; decode: that → the forward pass of the last token
  (engine clocks).
e2e, time per output token, queue, prefill, decode and request_success are recorded when a request
completes (its last byte written); TTFT and ITL as they happen. A request whose client went away before
the end counts in request_aborted_total instead.
"""
from __future__ import annotations

import time
from typing import Callable, Optional

import trio
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
TIMER_KEY = "pyserve.timer"  # the RequestTimer's key in the ASGI scope

# 1 ms … 60 s, denser where a CPU server's latencies fall
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
                   0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 15.0, 20.0, 30.0, 45.0, 60.0)


class _Children:
    """The labelled children of one model name (a `.labels()` lookup per token would cost a lock and a dict)."""

    def __init__(self, m: "Metrics", name: str):
        self.ttft = m.ttft.labels(name)
        self.itl = m.itl.labels(name)
        self.tpot = m.tpot.labels(name)
        self.e2e = m.e2e.labels(name)
        self.queue = m.queue.labels(name)
        self.prefill = m.prefill.labels(name)
        self.decode = m.decode.labels(name)
        self.prompt_tokens = m.prompt_tokens.labels(name)
        self.generation_tokens = m.generation_tokens.labels(name)
        self.aborted = m.aborted.labels(name)
        self.name = name
        self.inflight = 0  # this model's generation requests being served
        self._success = m.success
        self._success_children: dict[str, object] = {}

    def success(self, reason: str):
        c = self._success_children.get(reason)
        if c is None:
            c = self._success_children[reason] = self._success.labels(self.name, reason)
        return c


class Metrics:
    """The app's registry. What it does not observe itself it is handed: each loaded model's engine stats
    (`serve_model` / `unserve_model`), the in-flight count, and the edge's refusal counters (`add_counter`).
    `model_name` labels the server-wide series (the edge's counters): the model's name when the server has
    one, "" when it serves several."""

    def __init__(self):
        self.model_name = ""
        self._engines: dict[str, Callable[[], dict]] = {}  # loaded model → its engine's stats, read at scrape
        self._retired: dict[str, dict] = {}  # unloaded model → its engines' counters so far (they never go back)
        self.inflight = InFlight()
        self._counters: list[tuple[str, str, Callable[[], int]]] = []
        self.registry = CollectorRegistry(auto_describe=False)
        r, ml = self.registry, ["model_name"]

        def hist(name: str, doc: str) -> Histogram:
            return Histogram(name, doc, ml, registry=r, buckets=LATENCY_BUCKETS)

        self.ttft = hist("pyserve:time_to_first_token_seconds",
                         "HTTP request arrival to the first generated token written to the socket")
        self.itl = hist("pyserve:inter_token_latency_seconds",
                        "gap between successive written tokens of a request (a batched write's gap split evenly)")
        self.tpot = hist("pyserve:request_time_per_output_token_seconds",
                         "per request: (e2e - ttft) / (generated tokens - 1)")
        self.e2e = hist("pyserve:e2e_request_latency_seconds", "HTTP request arrival to its last byte written")
        self.queue = hist("pyserve:request_queue_time_seconds", "HTTP request arrival to first scheduled in the engine")
        self.prefill = hist("pyserve:request_prefill_time_seconds", "first scheduled to the first token computed")
        self.decode = hist("pyserve:request_decode_time_seconds", "first token computed to the last")
        self.prompt_tokens = Counter("pyserve:prompt_tokens", "prompt tokens of generation requests", ml, registry=r)
        self.generation_tokens = Counter("pyserve:generation_tokens", "tokens generated", ml, registry=r)
        self.success = Counter("pyserve:request_success", "finished choices of completed requests, by finish reason",
                               ml + ["finished_reason"], registry=r)
        self.aborted = Counter("pyserve:request_aborted", "generation requests whose client went away before the end",
                               ml, registry=r)
        self.http_requests = Counter("pyserve:http_requests", "HTTP responses by endpoint and status",
                                     ["endpoint", "status"], registry=r)
        self._connection_errors = Counter("pyserve:connection_errors", "connections ended by an error inside them "
                                          "(contained: the server went on), by kind", ["kind"], registry=r)
        r.register(self)  # the engine's gauges and counters, read at scrape time
        self._children: dict[str, _Children] = {}

    def serve_model(self, name: str, engine_stats: Callable[[], dict]) -> None:
        """A model's engine is loaded: its stats are read at each scrape, labelled with its name."""
        self._engines[name] = engine_stats

    def unserve_model(self, name: str) -> None:
        """Its engine is going: its counters are kept (a model loaded again counts on from there)."""
        stats = self._engines.pop(name, dict)()
        kept = self._retired.setdefault(name, {})
        for key, _, _ in _COUNTERS:
            kept[key] = kept.get(key, 0) + stats.get(key, 0)

    def connection_errors(self, kind: str) -> None:
        """One connection ended by an error of this kind (server/http/connection.py)."""
        self._connection_errors.labels(kind).inc()

    def add_counter(self, metric: str, doc: str, value: Callable[[], int]) -> None:
        """A counter kept elsewhere (the edge's refusals), read at scrape time."""
        self._counters.append((metric, doc, value))

    def children(self, name: Optional[str] = None) -> _Children:
        name = self.model_name if name is None else name
        c = self._children.get(name)
        if c is None:
            c = self._children[name] = _Children(self, name)
        return c

    def collect(self):
        stats = {name: engine_stats() for name, engine_stats in self._engines.items()}
        for name in [*self._retired, *(n for n, c in self._children.items() if c.inflight)]:
            stats.setdefault(name, {})
        if not stats:
            stats[self.model_name] = {}  # nothing loaded (yet): the series exist, at 0
        for key, metric, doc in _GAUGES:
            yield _family(GaugeMetricFamily, metric, doc, {n: s.get(key, 0) for n, s in stats.items()})
        yield _family(GaugeMetricFamily, "pyserve:kv_cache_usage_perc", "fraction of KV cache blocks in use (0-1)",
                      {n: _ratio(s.get("blocks_used", 0), s.get("blocks_total", 0)) for n, s in stats.items()})
        yield _family(GaugeMetricFamily, "pyserve:spec_decode_draft_acceptance_rate",
                      "drafted tokens accepted / drafted, since the start (0 before any draft)",
                      {n: _ratio(s.get("spec_accepted_tokens", 0), s.get("spec_draft_tokens", 0))
                       for n, s in stats.items()})
        yield _family(GaugeMetricFamily, "pyserve:http_requests_in_flight", "generation requests being served",
                      {n: self._children[n].inflight if n in self._children else 0 for n in stats})
        for key, metric, doc in _COUNTERS:
            yield _family(CounterMetricFamily, metric, doc,
                          {n: s.get(key, 0) + self._retired.get(n, {}).get(key, 0) for n, s in stats.items()})
        for metric, doc, value in self._counters:
            yield _family(CounterMetricFamily, metric, doc, {self.model_name: value()})
        if any("step_buckets" in s for s in stats.values()):
            yield _step_histogram(stats)

    content_type = CONTENT_TYPE  # of what render() returns

    def render(self) -> bytes:
        return generate_latest(self.registry)


_GAUGES = [("running", "pyserve:num_requests_running", "sequences in the engine's batch"),
           ("waiting", "pyserve:num_requests_waiting", "sequences waiting to be scheduled"),
           ("blocks_used", "pyserve:kv_blocks_used", "KV cache blocks in use"),
           ("blocks_total", "pyserve:kv_blocks_total", "KV cache blocks in all"),
           ("kv_cache_bytes", "pyserve:kv_cache_bytes", "KV cache pool size in bytes (its blocks in --kv-cache-dtype)"),
           ("state_bytes", "pyserve:recurrent_state_bytes",
            "recurrent state memory in bytes: its slots and checkpoints (hybrid models; else 0)"),
           ("state_slots_used", "pyserve:recurrent_state_slots_used",
            "recurrent state slots in use (hybrid models' DeltaNet layers: one per running sequence; else 0)"),
           ("state_slots_total", "pyserve:recurrent_state_slots_total", "recurrent state slots in all (else 0)"),
           ("grammar_matchers", "pyserve:grammar_matchers",
            "structured-output matchers alive: one per constrained sample, plus the compiled grammars cached"),
           ("disk_bytes", "pyserve:kv_disk_bytes", "the KV cache's disk tier: bytes of this model's blocks on disk "
            "(--kv-cache-dir; else 0)"),
           ("disk_entries", "pyserve:kv_disk_blocks", "the KV cache's disk tier: blocks on disk")]
_COUNTERS = [("preemptions", "pyserve:num_preemptions", "sequences preempted"),
             ("prefix_cache_queries", "pyserve:prefix_cache_queries",
              "prompt tokens looked up in the prefix cache at admission"),
             ("prefix_cache_hits", "pyserve:prefix_cache_hits", "prompt tokens found in the prefix cache at admission"),
             ("steps", "pyserve:engine_steps", "engine steps"),
             ("tokens_computed", "pyserve:tokens_computed", "tokens run through the model (drafted ones too)"),
             ("spec_drafts", "pyserve:spec_decode_num_drafts", "speculative drafts verified (one per stream and step)"),
             ("spec_draft_tokens", "pyserve:spec_decode_num_draft_tokens", "speculative tokens drafted and verified"),
             ("spec_accepted_tokens", "pyserve:spec_decode_num_accepted_tokens",
              "drafted tokens the model agreed with (each one a decode step saved)"),
             ("disk_hits", "pyserve:kv_disk_hits", "KV blocks read back from the disk tier instead of recomputed"),
             ("disk_bytes_read", "pyserve:kv_disk_read_bytes", "bytes read from the disk tier"),
             ("disk_bytes_written", "pyserve:kv_disk_written_bytes", "bytes written to the disk tier"),
             ("disk_corrupt", "pyserve:kv_disk_corrupt", "disk tier entries that failed their checks (dropped)"),
             ("disk_write_errors", "pyserve:kv_disk_write_errors",
              "disk tier writes that failed (a full disk: the block is not kept, nothing else happens)")]


def _step_histogram(stats: dict) -> HistogramMetricFamily:
    """The engines' step times (schedule → forward → sampling, on the engine thread): what inter-token latency
    would be with nothing else on the path; compare with pyserve:inter_token_latency_seconds."""
    f = HistogramMetricFamily("pyserve:engine_step_seconds", "wall time of each engine step",
                              labels=["model_name"])
    for name, s in stats.items():
        if "step_buckets" in s:
            buckets = [(repr(b), c) for b, c in zip(s["step_bucket_bounds"], s["step_buckets"])]
            f.add_metric([name], buckets + [("+Inf", s["steps"])], s["step_seconds_sum"])
    return f


def _ratio(num: float, den: float) -> float:
    return num / den if den else 0.0


def _family(kind, metric: str, doc: str, values: dict):
    """One metric family, a sample per model name."""
    f = kind(metric, doc, labels=["model_name"])
    for name, value in values.items():
        f.add_metric([name], value)
    return f


class InFlight:
    """Generation requests being served; the drain waits for it to reach 0."""

    def __init__(self):
        self.count = 0
        self._idle = trio.Event()
        self._idle.set()

    def enter(self) -> None:
        if self.count == 0:
            self._idle = trio.Event()
        self.count += 1

    def leave(self) -> None:
        self.count -= 1
        if self.count == 0:
            self._idle.set()

    async def wait_idle(self) -> None:
        while self.count:
            await self._idle.wait()


class RequestTimer:
    """One HTTP request's clock (see the module docstring), the serving layer's RequestObserver: it calls
    `start`, `output`, `received` (non-streamed), `writing` (streamed) and `end`; the ASGI wrapper calls
    `written` after each body send and `close` when the request is over."""

    __slots__ = ("metrics", "arrival", "active", "stream", "pending", "n_prompt", "n_tokens", "first_write",
                 "last_visible", "first_visible", "end_ts", "outcome", "reasons", "scheduled", "first_token_ts",
                 "last_token_ts", "model", "_c")

    def __init__(self, metrics: Metrics, arrival: float):
        self.metrics = metrics
        self.arrival = arrival
        self.active = False        # a generation started: the request is accounted at close
        self.stream = False
        self.pending = 0           # tokens of the body chunk(s) being written, not yet counted as written
        self.n_prompt = 0
        self.n_tokens = 0          # tokens received from the engine
        self.first_write: Optional[float] = None
        self.first_visible: Optional[float] = None
        self.last_visible: Optional[float] = None
        self.end_ts: Optional[float] = None  # the last body message sent
        self.outcome: Optional[str] = None  # "ok", "abort" (client gone), "error"
        self.reasons: list[str] = []
        self.scheduled = self.first_token_ts = self.last_token_ts = 0.0
        self.model: Optional[str] = None  # the served model's name (its series' label), set when it is chosen
        self._c: Optional[_Children] = None

    # ---- the serving layer ----

    def start(self, n_prompt: int, stream: bool) -> None:
        """A generation begins; prompt tokens as usage reports them (each prompt once, whatever n)."""
        self.active = True
        self.stream = stream
        self.n_prompt = n_prompt
        self._c = self.metrics.children(self.model)
        self._c.inflight += 1
        self.metrics.inflight.enter()

    def output(self, out) -> int:
        """Notes one engine delta (a StreamOutput); returns its token count."""
        k = len(out.token_ids_delta)
        self.n_tokens += k
        s = getattr(out, "scheduled_ts", 0.0)
        if s and (not self.scheduled or s < self.scheduled):
            self.scheduled = s
        f = getattr(out, "first_token_ts", 0.0)
        if f and (not self.first_token_ts or f < self.first_token_ts):
            self.first_token_ts = f
        last = getattr(out, "last_token_ts", 0.0)
        if last > self.last_token_ts:
            self.last_token_ts = last
        if out.finish_reason:
            self.reasons.append(out.finish_reason)
        return k

    def received(self, k: int) -> None:
        """Non-streamed: k tokens arrived from the engine now (the ITL clock of a response not streamed)."""
        if k:
            self._visible(time.monotonic(), k)

    def writing(self, k: int) -> None:
        """Streamed: the body write being handed to the server carries k more tokens."""
        self.pending += k

    def end(self, outcome: str) -> None:
        """The generation is over. A non-streamed response's tokens ride on its one body write."""
        self.outcome = outcome
        if outcome == "ok" and not self.stream:
            self.pending = self.n_tokens
        self._c.inflight -= 1
        self.metrics.inflight.leave()

    # ---- the ASGI wrapper ----

    def written(self, now: float, nonempty: bool, final: bool) -> None:
        k = self.pending
        if k and (nonempty or final):
            self.pending = 0
            if self.first_write is None:
                self.first_write = now
                self._c.ttft.observe(now - self.arrival)
            if self.stream:
                self._visible(now, k)
        if final:
            self.end_ts = now

    def close(self) -> None:
        if not self.active:
            return
        self.active = False
        c = self._c
        c.prompt_tokens.inc(self.n_prompt)
        c.generation_tokens.inc(self.n_tokens)
        if self.outcome == "ok" and self.end_ts is not None:
            c.e2e.observe(self.end_ts - self.arrival)
            for r in self.reasons:
                c.success(r).inc()
            if self.n_tokens > 1:
                if self.stream and self.first_write is not None:
                    c.tpot.observe((self.end_ts - self.first_write) / (self.n_tokens - 1))
                elif self.first_visible is not None:
                    c.tpot.observe((self.last_visible - self.first_visible) / (self.n_tokens - 1))
            if self.scheduled:
                c.queue.observe(max(0.0, self.scheduled - self.arrival))
                if self.first_token_ts:
                    c.prefill.observe(max(0.0, self.first_token_ts - self.scheduled))
                    c.decode.observe(max(0.0, self.last_token_ts - self.first_token_ts))
        elif self.outcome in (None, "abort", "ok"):  # "ok" without its last byte sent: the client went away
            c.aborted.inc()

    def _visible(self, now: float, k: int) -> None:
        itl = self._c.itl
        if self.last_visible is None:
            self.first_visible = now
            for _ in range(k - 1):
                itl.observe(0.0)
        else:
            gap = (now - self.last_visible) / k
            for _ in range(k):
                itl.observe(gap)
        self.last_visible = now


def instrument(app, metrics: Metrics) -> None:
    """Wraps the app's ASGI callable: takes each request's arrival time first thing, counts responses by
    endpoint and status, and times body writes (after the server's send returned)."""
    inner = app.asgi_app
    known: dict[str, str] = {}

    def endpoint(path: str) -> str:
        if not known:
            for rule in app.url_map.iter_rules():
                if "<" not in rule.rule:
                    known[rule.rule] = rule.rule
        e = known.get(path)
        if e is not None:
            return e
        if path.startswith("/v1/models/"):
            return "/v1/models/{model}"
        return "other"

    async def asgi_app(scope, receive, send):
        if scope["type"] != "http":
            return await inner(scope, receive, send)
        timer = RequestTimer(metrics, time.monotonic())
        scope[TIMER_KEY] = timer
        path = scope.get("path", "")

        async def timed_send(message):
            typ = message["type"]
            if typ == "http.response.start" and path != "/metrics":
                metrics.http_requests.labels(endpoint(path), str(message["status"])).inc()
            await send(message)
            if typ == "http.response.body":
                timer.written(time.monotonic(), bool(message.get("body")), not message.get("more_body", False))

        try:
            return await inner(scope, receive, timed_send)
        finally:
            timer.close()

    app.asgi_app = asgi_app
