"""What the engine refuses, in the form the layers above build their own rules and messages from, so they can
never disagree with it: the sampler's ranges (csrc/sampling/sampler.cpp's kSamplingBounds, the one statement of them)
and the error of a request longer than one sequence can be (its numbers, for each protocol's own wording)."""
from __future__ import annotations

import functools
import math
from typing import Any

from .. import _engine

# ValueError with .max_len (tokens one sequence can reach), .n_prompt and .max_tokens
ContextLengthError = _engine.ContextLengthError


@functools.cache
def sampling_bounds() -> dict[str, dict[str, Any]]:
    """{parameter: {lo, hi, lo_open, hi_open, rule}}: lo < x or lo <= x, x < hi or x <= hi (hi = inf: finite)."""
    return _engine.sampling_bounds()


def field_limits(name: str, kind: type = float) -> dict[str, Any]:
    """A parameter's range as pydantic Field keywords (ge / gt, le / lt)."""
    b = sampling_bounds()[name]
    out = {("gt" if b["lo_open"] else "ge"): kind(b["lo"])}
    if not math.isinf(b["hi"]):
        out["lt" if b["hi_open"] else "le"] = kind(b["hi"])
    return out
