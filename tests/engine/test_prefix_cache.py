"""Prefix caching with the real model: hit counters, time to first token, outputs identical to a cold run."""
import random
import time

import pytest

from pyserve import _engine

GREEDY = {"temperature": 0.0, "logprobs": 3}


def synthetic(n, seed):
    rng = random.Random(seed)
    return [2] + [rng.randrange(1000, 20000) for _ in range(n - 1)]


def run(eng, rid, prompt, max_tokens, sampling=GREEDY):
    """Adds one request and steps until it ends. -> (tokens, logprobs, tops, seconds to the first token)."""
    eng.add(rid, prompt, sampling, max_tokens, True)
    t0 = time.perf_counter()
    ttft = None
    toks, lps, tops = [], [], []
    while True:
        for o in eng.step():
            r, tok, lp, top, reason = o.request_id, o.token, o.logprob, o.top, o.finish_reason
            assert r == rid
            if tok >= 0:
                ttft = ttft or time.perf_counter() - t0
                toks.append(tok), lps.append(lp), tops.append(top)
            if reason:
                return toks, lps, tops, ttft


@pytest.fixture(scope="module")
def eng(model_path):
    return _engine.Engine(model_path, n_threads=2)


@pytest.fixture(scope="module")
def cold_eng(model_path):
    return _engine.Engine(model_path, n_threads=2, enable_prefix_caching=False)


PREFIX = synthetic(1000, 1)
A = PREFIX + synthetic(9, 2)[1:]  # 1008 tokens: 63 full blocks
B = PREFIX + synthetic(9, 3)[1:]  # the same first 1000 tokens, a different tail


def test_hits_ttft_and_identical_output(eng, cold_eng):
    s0 = eng.stats()
    cold = run(eng, "a", A, 8)
    s1 = eng.stats()
    assert s1["prefix_cache_hits"] - s0["prefix_cache_hits"] == 0
    assert s1["prefix_cache_queries"] - s0["prefix_cache_queries"] == len(A)
    # A's 63 full blocks stay cached with nothing holding them (its 64th, partial at the end, is not kept).
    assert s1["blocks_used"] == 0 and s1["blocks_cached"] == 63
    warm = run(eng, "b", B, 8)
    s2 = eng.stats()
    # B shares 1000 tokens with A: the 62 full blocks inside them hit (the 63rd holds B's own tail).
    assert s2["prefix_cache_hits"] - s1["prefix_cache_hits"] == 992
    assert s2["prefix_cache_queries"] - s1["prefix_cache_queries"] == len(B)
    # Computed: all of A and 8 generated - 1, then B's 16 uncached tokens and 7.
    assert s2["tokens_computed"] - s0["tokens_computed"] == (len(A) + 7) + (len(B) - 992 + 7)
    ref = run(cold_eng, "b", B, 8)
    print(f"\nTTFT cold {cold[3] * 1e3:.1f} ms (1008 tokens), with 992 cached {warm[3] * 1e3:.1f} ms: "
          f"ratio {warm[3] / cold[3]:.3f}")
    assert warm[:3] == ref[:3]  # bit-identical tokens, logprobs and top logprobs


def test_same_prompt_twice_is_identical(eng, cold_eng):
    p = synthetic(100, 7)
    first = run(eng, "p1", p, 6)
    h = eng.stats()["prefix_cache_hits"]
    second = run(eng, "p2", p, 6)
    assert eng.stats()["prefix_cache_hits"] - h == 96  # 6 full blocks; the 7th holds the last token
    assert first[:3] == second[:3] == run(cold_eng, "p", p, 6)[:3]


def test_cached_blocks_are_evicted_when_needed(model_path):
    # 70 blocks: the first prompt's 62 cached blocks must make way for a second, different one.
    eng = _engine.Engine(model_path, n_threads=2, num_kv_blocks=70)
    run(eng, "x", synthetic(1000, 11), 1)
    assert eng.stats()["blocks_cached"] == 62
    run(eng, "y", synthetic(1000, 12), 1)
    s = eng.stats()
    # y took the 8 never-cached blocks, then evicted x's blocks tail first: x keeps its first 70 - 63 = 7.
    assert s["blocks_used"] == 0 and s["blocks_cached"] == 62 + 7 and s["prefix_cache_hits"] == 0
    run(eng, "x2", synthetic(1000, 11), 1)
    assert eng.stats()["prefix_cache_hits"] == 7 * 16
