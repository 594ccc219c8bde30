"""Prometheus text exposition, read with prometheus_client's own parser: the bench's scrape of `GET /metrics`
around each level, and the tests' and scripts' reads of pyserve's metrics."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

# (sample name, sorted (label, value) pairs) -> value, e.g. ("pyserve:kv_blocks_used", (("model_name", "m"),))
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse_metrics(text: str) -> tuple[Samples, dict[str, str]]:
    """(samples, {family name: type}). Raises ValueError on text that is not Prometheus exposition."""
    samples: Samples = {}
    types: dict[str, str] = {}
    for fam in text_string_to_metric_families(text):
        types[fam.name] = fam.type
        for s in fam.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, types


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples called `name` whose labels include `labels` (0.0 when there are none)."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def totals(samples: Samples, prefix: str = "") -> dict[str, float]:
    """The value of each sample name that starts with `prefix` (dropped from the keys), summed over its label
    sets: totals(s, "pyserve:")["kv_blocks_used"]."""
    out: dict[str, float] = {}
    for (name, _), v in samples.items():
        if name.startswith(prefix):
            key = name[len(prefix):]
            out[key] = out.get(key, 0.0) + v
    return out


def _exposition_key(name: str, labels: dict[str, str]) -> str:
    """'name{a="x",b="y"}' as the exposition writes it (label values escaped)."""
    if not labels:
        return name
    esc = {k: v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") for k, v in labels.items()}
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in esc.items()) + "}"


def metrics_delta(before: str, after: str) -> dict[str, float]:
    """Counter (and histogram/summary _sum/_count) increases from `before` to `after`, plus gauges' values in
    `after`, by 'name{labels}'. Histogram buckets and *_created timestamps are left out. ValueError if either
    text is not Prometheus exposition."""
    old, _ = parse_metrics(before)
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(after):
        for s in fam.samples:
            if s.name.endswith(("_bucket", "_created")):
                continue
            if fam.type in ("counter", "histogram", "summary"):
                d = s.value - old.get((s.name, tuple(sorted(s.labels.items()))), 0.0)
                if d:
                    out[_exposition_key(s.name, s.labels)] = d
            elif fam.type == "gauge":
                out[_exposition_key(s.name, s.labels)] = s.value
    return out
