"""Summary statistics of latencies: the one percentile definition of the bench, the scripts and the tests."""
from __future__ import annotations

from typing import Iterable, Optional

import numpy as np

STAT_KEYS = ("mean", "p50", "p90", "p95", "p99", "max")
_PERCENTILES = (50, 90, 95, 99)


def summarize(values: Iterable[float]) -> dict[str, Optional[float]]:
    """mean, p50, p90, p95, p99 and max of the values; all None when there are none.

    Percentiles are numpy's "linear" method (its default, and vLLM's benchmark's): interpolated between the two
    nearest ranks, so p50 of [1, 2] is 1.5 and p99 of n values lies between the two largest."""
    a = np.fromiter(values, dtype=float)
    if a.size == 0:
        return dict.fromkeys(STAT_KEYS)
    ordered = np.append(np.percentile(a, _PERCENTILES, method="linear"), a.max())
    # Rounding in the interpolation must not break the order p50 <= ... <= max.
    ordered = np.maximum.accumulate(ordered)
    return {"mean": float(a.mean()), **{k: float(v) for k, v in zip(STAT_KEYS[1:], ordered)}}
