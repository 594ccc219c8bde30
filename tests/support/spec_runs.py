"""Runs of an engine with speculation for the tests that hold its outputs to a run without it: every prompt
batched or alone, greedy or seeded, and the engine's draft counters."""
from __future__ import annotations

import numpy as np

GREEDY = {"temperature": 0.0, "logprobs": 3}
SEEDED = {"temperature": 1.0, "top_k": 40, "seed": 7, "logprobs": 2}


def run(eng, requests: dict, sampling: dict, max_tokens: int = 40, n: int = 1) -> dict:
    """Adds {id: prompt}, steps until all end -> {(id, index): [(token, logprob, top)]}; every slot free after."""
    for rid, prompt in requests.items():
        eng.add(rid, prompt, sampling, max_tokens, True, n=n)
    out: dict = {}
    while eng.has_work():
        for o in eng.step():
            if o.token >= 0:
                out.setdefault((o.request_id, o.index), []).append((o.token, o.logprob, o.top))
    s = eng.stats()
    assert (s["state_slots_used"], s["blocks_used"]) == (0, 0)
    return out


def spec_counts(eng) -> np.ndarray:
    s = eng.stats()
    return np.array([s["spec_drafts"], s["spec_draft_tokens"], s["spec_accepted_tokens"]])


def each(make, prompts: dict, sampling: dict, max_tokens: int = 40, n: int = 1) -> dict:
    """Every prompt run by itself on the engine make() gives (a fresh one, or the same one each time)."""
    out = {}
    for rid, p in prompts.items():
        out.update(run(make(), {rid: p}, sampling, max_tokens, n))
    return out


def batched_the_same(on, prompts: dict, expected) -> None:
    """Greedy and seeded, every prompt batched on `on`: expected(sampling), with drafts accepted and rejected."""
    for sampling in (GREEDY, SEEDED):
        before = spec_counts(on)
        assert run(on, prompts, sampling) == expected(sampling)
        _, drafted, accepted = spec_counts(on) - before
        assert drafted > accepted > 0
