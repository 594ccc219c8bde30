"""cache_salt (vLLM's): requests with different salts never share cached KV blocks — proved by the hit counters
and by the blocks themselves (each salt caches its own copy) — while one salt reuses its own prefix as before."""
import random

import pytest

from pyserve import _engine
from support.engine_runs import greedy_run as run


def toks(n, start=100):
    return list(range(start, start + n))


def finish(sim):
    while sim.has_work():
        sim.step()


def test_salts_partition_the_prefix_cache_in_the_scheduler():
    sim = _engine.testing.SchedulerSim(64, 4, max_batched_tokens=64)
    prompt = toks(33)  # 8 full blocks before the last token's
    runs = [("a", "tenant-1"), ("b", "tenant-2"), ("c", ""), ("d", "tenant-1"), ("e", "tenant-2"), ("f", "")]
    hits, cached = [], []
    for rid, salt in runs:
        before = sim.stats()["prefix_cache_hits"]
        sim.add(rid, prompt, 1, cache_salt=salt)
        finish(sim)
        hits.append(sim.stats()["prefix_cache_hits"] - before)
        cached.append(sim.stats()["blocks_cached"])
    assert hits == [0, 0, 0, 32, 32, 32]
    assert cached[:3] == [8, 16, 24] and cached[3:] == [24, 24, 24]  # each salt's own copy, then reused


def test_one_salt_of_two_requests_shares_within_the_step():
    sim = _engine.testing.SchedulerSim(64, 4, max_batched_tokens=64)
    sim.add("a", toks(33), 1, cache_salt="x")
    finish(sim)
    sim.add("b", toks(33) + [7, 7, 7, 7], 1, cache_salt="x")
    sim.add("c", toks(33) + [7, 7, 7, 7], 1, cache_salt="y")
    step = sim.step()
    assert sorted((s[0], s[2], s[3]) for s in step["scheduled"]) == [("b", 32, 5), ("c", 0, 37)]


@pytest.fixture(scope="module")
def eng(model_path):
    return _engine.Engine(model_path, n_threads=2)


def test_the_engine_caches_per_salt_and_gives_the_same_tokens(eng):
    rng = random.Random(5)
    prompt = [2] + [rng.randrange(1000, 20000) for _ in range(199)]  # 12 full blocks of 16 before the last token
    first, c1 = run(eng, "a", prompt, "alice")
    cached = eng.stats()["blocks_cached"]
    other, c2 = run(eng, "b", prompt, "bob")
    assert eng.stats()["blocks_cached"] - cached == 12  # bob's own copy of the prefix: alice's blocks unseen
    again, c3 = run(eng, "c", prompt, "alice")
    plain, c4 = run(eng, "d", prompt, "")
    assert (c1, c2, c3, c4) == (0, 0, 192, 0)
    assert first == other == again == plain and len(first) == 4
