"""Embeddings in the engine with the real model: LLM.embed and AsyncLLM.embed against the NumPy reference's
final-norm hidden states, batch == alone and chunked == unchunked bit for bit, text == token ids, prefill only
(no decode step), blocks back after, the prefix cache (mean pooling computes every row; last may hit), abort.

Tolerance against the reference. The float64 reference is exact; the engine rounds every matmul input to
8 bits (Q8_0 / Q8_K) and keeps K/V in f16, as llama.cpp does, which alone moves this model's hidden states
by 1 - cos ≈ 0.5e-3 to 3e-3 (the reference's own emulation of that rounding, over three equally valid sets
of rounding decisions). So the bound on 1 - cos(engine, exact) is 2.5 × the largest emulated deviation (the
factor tests/models/test_arch_logits.py uses for logits); the rows next to the right one differ by far more (1 - cos
≥ 0.1, asserted), so a wrong row, a missing norm or a wrong mean fails.
"""
import random

import numpy as np
import pytest
import trio

from pyserve import LLM, SamplingParams
from pyserve.engine.async_llm import AsyncLLM
from support import numpy_ref as nr
from support.async_engine import settled
from support.prompts import PROMPTS

LONG_TEXT = "The quick brown fox jumps over the lazy dog. " * 8  # ~80 tokens: several chunks of 5


def synthetic(n, seed):
    rng = random.Random(seed)
    return [2] + [rng.randrange(1000, 20000) for _ in range(n - 1)]


def cos(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def pooled(h, pooling):
    return h[-1] if pooling == "last" else h.mean(axis=0)


@pytest.fixture(scope="module")
def small(model_path):
    """5 tokens a step: every prompt here is prefilled in several chunks."""
    return LLM(model_path, n_threads=2, max_num_batched_tokens=5)


@pytest.fixture(scope="module")
def alone(llm):
    """(pooling, normalize) -> one vector per prompt, each embedded on its own."""
    return {(p, n): [llm.embed(t, pooling=p, normalize=n)[0] for t in PROMPTS + [LONG_TEXT]]
            for p in ("last", "mean") for n in (True, False)}


@pytest.mark.parametrize("text", [PROMPTS[1], PROMPTS[5], LONG_TEXT])
def test_matches_the_reference_hidden_states(llm, model_path, text):
    ids = llm.tokenize(text)
    exact = nr.ref_hidden(model_path, ids)
    emulated = [nr.ref_hidden(model_path, ids, emulate_ggml=True, emulate_seed=s) for s in (None, 0, 1)]
    for pooling in ("last", "mean"):
        got = llm.embed(text, pooling=pooling, normalize=False)[0]
        assert got.shape == (llm.engine.hparams["n_embd"],) and got.dtype == np.float32
        want = pooled(exact, pooling)
        bound = 2.5 * max(1 - cos(pooled(h, pooling), want) for h in emulated)
        assert 1 - cos(got, want) <= bound, (pooling, 1 - cos(got, want), bound)
        assert np.linalg.norm(got) == pytest.approx(np.linalg.norm(want), rel=0.05)
    # what the bound rejects: the neighbouring row, the mean for the last row
    assert 1 - cos(exact[-2], exact[-1]) > 0.1 and 1 - cos(exact.mean(axis=0), exact[-1]) > 0.1


def test_normalized_is_the_raw_vector_over_its_norm(alone):
    for pooling in ("last", "mean"):
        for unit, raw in zip(alone[pooling, True], alone[pooling, False]):
            assert np.linalg.norm(unit.astype(np.float64)) == pytest.approx(1.0, abs=1e-6)
            np.testing.assert_allclose(unit, raw / np.linalg.norm(raw.astype(np.float64)), rtol=1e-6, atol=1e-7)


def test_batched_equals_alone_bit_for_bit(llm, alone):
    for (pooling, normalize), want in alone.items():
        got = llm.embed(PROMPTS + [LONG_TEXT], pooling=pooling, normalize=normalize)
        assert all(np.array_equal(g, w) for g, w in zip(got, want))


def test_chunked_prefill_equals_unchunked_bit_for_bit(small, alone):
    for (pooling, normalize), want in alone.items():
        got = small.embed(PROMPTS + [LONG_TEXT], pooling=pooling, normalize=normalize)
        assert all(np.array_equal(g, w) for g, w in zip(got, want))


def test_token_ids_equal_text(llm, alone):
    ids = [{"prompt_token_ids": llm.tokenize(t)} for t in PROMPTS]
    assert all(np.array_equal(g, w) for g, w in zip(llm.embed(ids), alone["last", True]))


def test_prefill_only_and_blocks_back(llm):
    eng = llm.engine
    ids = synthetic(40, 1)
    before = eng.stats()
    llm.embed({"prompt_token_ids": ids}, pooling="mean")
    after = eng.stats()
    assert after["tokens_computed"] - before["tokens_computed"] == 40  # the prompt, nothing decoded
    assert after["steps"] - before["steps"] == 1
    assert (after["blocks_used"], after["running"], after["waiting"]) == (0, 0, 0)
    assert not eng.has_work()


def test_mean_pooling_computes_every_row_and_last_may_hit(llm):
    eng = llm.engine
    ids = synthetic(100, 2)  # 6 full blocks and 4 tokens
    first = {p: llm.embed({"prompt_token_ids": ids}, pooling=p)[0] for p in ("mean", "last")}
    s0 = eng.stats()
    mean = llm.embed({"prompt_token_ids": ids}, pooling="mean")[0]
    s1 = eng.stats()
    last = llm.embed({"prompt_token_ids": ids}, pooling="last")[0]
    s2 = eng.stats()
    assert s1["tokens_computed"] - s0["tokens_computed"] == 100  # mean: no lookup, no query, every row
    assert (s1["prefix_cache_hits"], s1["prefix_cache_queries"]) == (s0["prefix_cache_hits"], s0["prefix_cache_queries"])
    assert s2["prefix_cache_hits"] - s1["prefix_cache_hits"] == 96 and s2["tokens_computed"] - s1["tokens_computed"] == 4
    assert s2["prefix_cache_queries"] - s1["prefix_cache_queries"] == 100
    assert np.array_equal(mean, first["mean"]) and np.array_equal(last, first["last"])


def test_embeddings_beside_generation_change_nothing(llm, alone):
    greedy = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=2)
    ref = [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in llm.generate(PROMPTS[:3], greedy)]
    eng = llm.engine
    for i, text in enumerate(PROMPTS[:3]):
        eng.add(f"g{i}", llm.tokenize(text), greedy.engine_sampling(), 8, True)
    for i, text in enumerate(PROMPTS):
        eng.add_embed(f"e{i}", llm.tokenize(text), "mean", True)
    gen, vecs = {}, {}
    while eng.has_work():
        for o in eng.step():
            rid, tok, lp, top, reason, emb = o.request_id, o.token, o.logprob, o.top, o.finish_reason, o.embedding
            if rid.startswith("e"):
                assert (tok, reason) == (-1, "stop")
                vecs[rid] = emb
            else:
                entry = {tok: lp}
                entry.update({t: v for t, v in top if t not in entry})
                gen.setdefault(rid, ([], []))
                gen[rid][0].append(tok), gen[rid][1].append(entry)
    assert [gen[f"g{i}"] for i in range(3)] == ref
    assert all(np.array_equal(vecs[f"e{i}"], w) for i, w in enumerate(alone["mean", True][:len(PROMPTS)]))


def test_refused_requests_raise_before_queueing(llm):
    eng = llm.engine
    V, n_ctx = eng.hparams["n_vocab"], eng.config["n_ctx"]
    cases = [([], "last", "prompt is empty"), ([2, V], "last", "prompt: token id"),
             ([2] * (n_ctx + 1), "mean", rf"prompt \({n_ctx + 1} tokens\) exceeds the context length"),
             ([2, 3], "max", "pooling must be 'last', 'mean' or 'rank'"),
             ([2, 3], "rank", "pooling: this model is not a reranker")]
    for ids, pooling, match in cases:
        with pytest.raises(ValueError, match="^" + match):
            eng.check_embed(ids, pooling)
        with pytest.raises(ValueError, match="^" + match):
            llm.embed([{"prompt_token_ids": [2, 3]}, {"prompt_token_ids": ids}], pooling=pooling)
    assert not eng.has_work() and eng.stats()["blocks_used"] == 0


async def test_async_embed_equals_llm_embed(llm, alone):
    got = {}

    async def one(engine, i, text):
        got[i] = await engine.embed(text, pooling="mean", normalize=False)

    with trio.fail_after(120):
        async with AsyncLLM.open(llm) as engine:
            async with trio.open_nursery() as nursery:
                for i, text in enumerate(PROMPTS + [LONG_TEXT]):
                    nursery.start_soon(one, engine, i, text)
            engine.check_embed(llm.tokenize(PROMPTS[0]), "last", True)
            with pytest.raises(ValueError, match="^prompt is empty"):
                engine.check_embed([], "last", True)
            with pytest.raises(ValueError, match="^pooling must be"):
                await engine.embed(PROMPTS[0], pooling="max")
            assert engine.stats()["streams"] == 0
    assert all(np.array_equal(got[i], w) for i, w in enumerate(alone["mean", False]))


async def mid_prefill(engine, max_polls=2000):
    """Polls (bounded) until a request is running with blocks held: an embedding part-way through its prefill."""
    for _ in range(max_polls):
        s = engine.stats()
        if s["running"] == 1 and s["blocks_used"] > 0:
            return
        await trio.sleep(0.005)
    raise AssertionError(f"no request got to its prefill: {engine.stats()}")


async def test_cancel_and_abort_mid_embedding_free_the_blocks(small, alone):
    ids = synthetic(400, 3)  # 80 steps of 5 tokens
    with trio.fail_after(120):
        async with AsyncLLM.open(small) as engine:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(engine.embed, ids, "mean", True, "cancelled")
                await mid_prefill(engine)
                nursery.cancel_scope.cancel()
            await settled(engine)

            async def aborted():
                with pytest.raises(RuntimeError, match="ended: abort"):
                    await engine.embed(ids, "last", True, "aborted")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(aborted)
                await mid_prefill(engine)
                engine.abort("aborted")
            await settled(engine)
            assert np.array_equal(await engine.embed(PROMPTS[0]), alone["last", True][0])
