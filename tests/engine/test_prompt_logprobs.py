"""Prompt logprobs (SamplingParams.prompt_logprobs) with the real model: the prefill rows' logprobs are the ones
the engine reports when it generates the same tokens, bit for bit; top-k contents; n > 1 shares one list;
max_tokens 0 scores the prompt alone; the prefix cache never skips a scored row; chunked, batched and
preempted runs give the same bits; AsyncLLM hands them over on each sample's first output.

Why bit for bit: a token's logits do not depend on its batch (docs/design/kernels.md, "Batch invariance"), so
prompt row p, computed in a prefill chunk, has the bits the decode step computed when it drew token p + 1,
and both go through one function (score_token / the sampler's raw logprobs) with the same log-sum-exp (at
temperature 1 the sampler reuses its draw's sum, the same sum of the same row), sampled or greedy.
"""
import random

import numpy as np
import pytest
import trio

from pyserve import LLM, SamplingParams
from pyserve.engine.async_llm import AsyncLLM
from support.prompts import PROMPTS

N_GEN = 12
GREEDY = SamplingParams(temperature=0, max_tokens=N_GEN, ignore_eos=True, logprobs=3)


def synthetic(n, seed):
    rng = random.Random(seed)
    return [2] + [rng.randrange(1000, 20000) for _ in range(n - 1)]


def score(llm, prompts, k=3, **kw):
    """prompt_logprobs of each prompt (strings or token ids), scored alone (max_tokens 0)."""
    prompts = [{"prompt_token_ids": p} if isinstance(p, list) else p for p in prompts]
    return [o.prompt_logprobs for o in llm.generate(prompts, SamplingParams(max_tokens=0, prompt_logprobs=k, **kw))]


@pytest.fixture(scope="module")
def generated(llm):
    """Greedy generations: (prompt ids, generated ids, their logprob entries) per prompt."""
    outs = llm.generate(PROMPTS, GREEDY)
    return [(o.prompt_token_ids, o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs]


@pytest.fixture(scope="module")
def scored(llm, generated):
    """prompt_logprobs=3 of every prompt + its generation, each scored alone."""
    return [score(llm, [p + g])[0] for p, g, _ in generated]


def test_prompt_logprobs_equal_generated_logprobs_bit_for_bit(generated, scored):
    for (prompt, gen, lps), plp in zip(generated, scored):
        assert len(plp) == len(prompt) + len(gen) and plp[0] is None
        assert plp[len(prompt):] == lps  # the same entries: ids, values (exact floats) and order


def test_shape_and_top_k_contents(llm, scored, generated):
    ids = generated[5][0] + generated[5][1]
    plp = scored[5]
    logits = llm.prompt_logits(ids)  # [T, n_vocab] float32, one fresh sequence: the same bits per row
    m = logits.max(axis=1, keepdims=True).astype(np.float64)
    ref = logits - m - np.log(np.exp(logits - m).sum(axis=1, keepdims=True))
    for p in range(1, len(ids)):
        entry = plp[p]
        assert next(iter(entry)) == ids[p]  # the prompt token first, then the 3 best (value desc, id asc)
        best = [int(t) for t in np.argsort(-logits[p - 1], kind="stable")[:3]]
        assert list(entry)[1:] == [t for t in best if t != ids[p]][: len(entry) - 1]
        assert len(entry) == (3 if ids[p] in best else 4)
        for t, lp in entry.items():  # row p - 1 scores token p
            assert lp == pytest.approx(ref[p - 1, t], abs=1e-4)
    zero = score(llm, [ids], k=0)[0]
    assert zero[0] is None and all(list(e) == [ids[p]] for p, e in enumerate(zero) if p)
    assert [e and e[ids[p]] for p, e in enumerate(zero)] == [e and e[ids[p]] for p, e in enumerate(plp)]


@pytest.mark.parametrize("sampling", [{"temperature": 1.0},  # the sampler's own log-sum-exp path
                                      {"temperature": 0.8, "top_p": 0.9, "presence_penalty": 1.0,
                                       "logit_bias": {236764: 3.0}}])
def test_sampled_tokens_too(llm, sampling):
    p = SamplingParams(seed=7, max_tokens=N_GEN, ignore_eos=True, logprobs=2, **sampling)
    out = llm.generate(PROMPTS[0], p)[0]
    plp = score(llm, [out.prompt_token_ids + out.outputs[0].token_ids], k=2)[0][len(out.prompt_token_ids):]
    assert len(plp) == N_GEN and plp == out.outputs[0].logprobs


def test_generation_carries_prompt_logprobs_and_n_samples_share_them(llm, generated):
    prompt, gen, lps = generated[2]
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True, logprobs=3, prompt_logprobs=3, n=3)
    before = llm.engine.stats()["tokens_computed"]
    out = llm.generate({"prompt_token_ids": prompt}, params)[0]
    # computed once: the prompt, then 3 samples × 3 decode steps
    assert llm.engine.stats()["tokens_computed"] - before == len(prompt) + 3 * 3
    assert out.prompt_logprobs == score(llm, [prompt])[0]
    assert [c.token_ids for c in out.outputs] == [gen[:4]] * 3 and all(c.logprobs == lps[:4] for c in out.outputs)


def test_max_tokens_zero_scores_the_prompt_alone(llm, generated):
    prompt = generated[0][0]
    before = llm.engine.stats()
    out = llm.generate({"prompt_token_ids": prompt}, SamplingParams(max_tokens=0, prompt_logprobs=1, n=2))[0]
    after = llm.engine.stats()
    assert [(c.token_ids, c.text, c.finish_reason) for c in out.outputs] == [([], "", "length")] * 2
    assert len(out.prompt_logprobs) == len(prompt)
    assert after["tokens_computed"] - before["tokens_computed"] == len(prompt) and after["blocks_used"] == 0
    with pytest.raises(ValueError, match="^max_tokens must be at least 1, got 0"):
        llm.generate(PROMPTS[0], SamplingParams(max_tokens=0))
    with pytest.raises(ValueError, match="^prompt_logprobs must be in"):
        SamplingParams(prompt_logprobs=21)


def test_prefix_cache_never_skips_a_scored_row(llm):
    eng = llm.engine
    ids = synthetic(100, 4)  # 6 full blocks and 4 tokens
    s0 = eng.stats()
    first = score(llm, [ids])[0]
    s1 = eng.stats()
    second = score(llm, [ids])[0]
    s2 = eng.stats()
    assert len(first) == 100 and second == first
    assert s2["prefix_cache_hits"] == s1["prefix_cache_hits"] == s0["prefix_cache_hits"]
    assert s2["prefix_cache_queries"] == s0["prefix_cache_queries"]  # no lookup: no query (as vLLM counts)
    assert s2["tokens_computed"] - s1["tokens_computed"] == 100
    # the scored prompt's blocks are cached for a request that does not score it
    llm.generate({"prompt_token_ids": ids}, SamplingParams(max_tokens=1))
    assert eng.stats()["prefix_cache_hits"] - s2["prefix_cache_hits"] == 96


def test_chunked_batched_and_preempted_runs_give_the_same_bits(model_path, generated, scored):
    prompts = [p + g for p, g, _ in generated]
    small = LLM(model_path, n_threads=2, max_num_batched_tokens=5)
    assert score(small, prompts) == scored
    # 12 blocks of 4 tokens: ~25-token sequences cannot all fit, the newest are preempted (and recomputed)
    tiny = LLM(model_path, n_threads=2, num_kv_blocks=12, block_size=4, max_num_batched_tokens=8)
    params = SamplingParams(temperature=0, max_tokens=N_GEN, ignore_eos=True, logprobs=3, prompt_logprobs=3)
    outs = tiny.generate([{"prompt_token_ids": p} for p, _, _ in generated], params)
    assert tiny.engine.stats()["preemptions"] > 0 and tiny.engine.stats()["blocks_used"] == 0
    for o, (p, g, lps), plp in zip(outs, generated, scored):
        assert (o.outputs[0].token_ids, o.outputs[0].logprobs) == (g, lps)
        assert o.prompt_logprobs == plp[: len(p)]


async def test_async_first_output_of_each_sample_carries_them(llm, generated):
    prompt, gen, lps = generated[3]
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, logprobs=3, prompt_logprobs=3, n=2)
    want = score(llm, [prompt])[0]
    with trio.fail_after(60):
        async with AsyncLLM.open(llm) as engine:
            engine.check(prompt, SamplingParams(max_tokens=0, prompt_logprobs=0))
            with pytest.raises(ValueError, match="^max_tokens must be at least 1"):
                engine.check(prompt, SamplingParams(max_tokens=0))
            outs = [o async for o in engine.generate({"prompt_token_ids": prompt}, params)]
            alone = [o async for o in engine.generate(prompt, SamplingParams(max_tokens=0, prompt_logprobs=3))]
    for i in range(2):
        mine = [o for o in outs if o.index == i]
        assert mine[0].prompt_logprobs == want and all(o.prompt_logprobs is None for o in mine[1:])
        assert [t for o in mine for t in o.token_ids_delta] == gen[:5]
        assert [e for o in mine for e in o.logprobs_delta] == lps[:5]
    assert [(o.prompt_logprobs, o.finish_reason, o.token_ids_delta) for o in alone] == [(want, "length", [])]


def test_ranked_merges_the_token_where_it_ranks():
    """An entry ({token: lp, then alternatives best first}) back in rank order (value desc, id asc) without a
    sort: the same as sorting it, wherever the token ranks, ties included."""
    import random

    from pyserve.engine.output_processor import ranked

    rng = random.Random(7)
    for _ in range(500):
        k = rng.randrange(0, 6)
        pool = {t: float(rng.choice([-0.5, -1.0, -2.0, -3.0, -4.5])) for t in rng.sample(range(50), k + 1)}
        best = sorted(pool.items(), key=lambda kv: (-kv[1], kv[0]))
        token, lp = rng.choice(best)
        top = best[:k] if rng.random() < 0.5 else best[:k + 1]  # the token among the top, or beside it
        entry = {token: lp} | {t: v for t, v in top if t != token}
        expect = sorted(entry.items(), key=lambda kv: (-kv[1], kv[0]))
        assert ranked(entry) == expect
