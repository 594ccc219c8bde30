"""Prometheus metrics: engine gauges read at scrape time, request counters kept by the server."""
from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    def __init__(self):
        self.requests_started = 0
        self.requests_finished: dict[str, int] = {}
        self.generation_tokens = 0
        self.state = None
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self)

    def finished(self, reason: str, n_tokens: int) -> None:
        self.requests_finished[reason] = self.requests_finished.get(reason, 0) + 1
        self.generation_tokens += n_tokens

    def collect(self):
        labels = ["model_name"]
        name = self.state.served_model_name if self.state else ""
        stats = self.state.engine.stats() if self.state and self.state.engine is not None else {}
        for key, metric, doc in [("running", "pyserve:num_requests_running", "sequences in the engine's batch"),
                                 ("waiting", "pyserve:num_requests_waiting", "sequences waiting for KV blocks"),
                                 ("blocks_used", "pyserve:kv_blocks_used", "KV cache blocks in use"),
                                 ("blocks_total", "pyserve:kv_blocks_total", "KV cache blocks in all")]:
            g = GaugeMetricFamily(metric, doc, labels=labels)
            g.add_metric([name], stats.get(key, 0))
            yield g
        g = GaugeMetricFamily("pyserve:kv_cache_usage_perc", "fraction of KV cache blocks in use", labels=labels)
        total = stats.get("blocks_total", 0)
        g.add_metric([name], stats.get("blocks_used", 0) / total if total else 0.0)
        yield g
        g = GaugeMetricFamily("pyserve:http_requests_in_flight", "generation requests being served", labels=labels)
        g.add_metric([name], self.state.inflight if self.state else 0)
        yield g
        for key, metric, doc in [("preemptions", "pyserve:num_preemptions", "sequences preempted"),
                                 ("steps", "pyserve:engine_steps", "engine steps"),
                                 ("tokens_computed", "pyserve:tokens_computed", "tokens run through the model")]:
            c = CounterMetricFamily(metric, doc, labels=labels)
            c.add_metric([name], stats.get(key, 0))
            yield c
        c = CounterMetricFamily("pyserve:generation_tokens", "tokens generated", labels=labels)
        c.add_metric([name], self.generation_tokens)
        yield c
        c = CounterMetricFamily("pyserve:request_success", "finished choices by finish reason",
                                labels=labels + ["finished_reason"])
        for reason, count in sorted(self.requests_finished.items()):
            c.add_metric([name, reason], count)
        yield c

    def render(self) -> bytes:
        return generate_latest(self.registry)
