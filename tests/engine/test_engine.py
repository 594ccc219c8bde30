"""The engine with the real model: batch invariance, chunked prefill, preemption, abort, admission."""
import random

import pytest

from pyserve import LLM, SamplingParams, _engine
from support.prompts import PROMPTS as ALL_PROMPTS

PROMPTS = ALL_PROMPTS[:6]
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=3)


def run_all(llm, prompts, params=GREEDY):
    return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in llm.generate(prompts, params)]


@pytest.fixture(scope="module")
def alone(llm):
    return [run_all(llm, [p])[0] for p in PROMPTS]


def test_batched_equals_alone_bit_for_bit(llm, alone):
    assert run_all(llm, PROMPTS) == alone


def test_chunked_prefill_equals_alone(model_path, alone):
    small = LLM(model_path, n_threads=2, max_num_batched_tokens=5)
    assert run_all(small, PROMPTS) == alone


def test_budgets_that_change_every_step_equal_alone(model_path, alone):
    """A step-time target sizes each step's prompt chunks from the decodes beside them and the fitted cost
    model (timing-dependent: different every run and every step); outputs stay bit-identical."""
    planned = LLM(model_path, n_threads=2, max_num_batched_tokens=64, target_itl=0.004)
    long = [p * 6 for p in PROMPTS]  # prompts of ~100 tokens: several chunks each, beside running decodes
    assert run_all(planned, PROMPTS + long)[:len(PROMPTS)] == alone
    assert run_all(planned, long) == [run_all(planned, [p])[0] for p in long]
    floor, rate = planned.engine.stats()["step_cost"]  # fitted on this run's timings: any values, never negative
    assert floor >= 0 and rate >= 0


def test_preemption_keeps_outputs(model_path, alone):
    # 6 blocks of 4 tokens: two sequences of ~20 tokens cannot both fit, so the newest is preempted.
    tiny = LLM(model_path, n_threads=2, num_kv_blocks=12, block_size=4)
    assert run_all(tiny, PROMPTS) == alone
    stats = tiny.engine.stats()
    assert stats["preemptions"] > 0
    assert stats["blocks_used"] == 0


def test_random_add_abort_leaves_no_blocks(llm):
    eng = llm.engine
    rng = random.Random(7)
    live = []
    for i in range(1000):
        if live and rng.random() < 0.5:
            eng.abort(live.pop(rng.randrange(len(live))))
        else:
            rid = f"r{i}"
            eng.add(rid, [2] + [rng.randrange(100, 5000) for _ in range(rng.randrange(1, 40))],
                    {"temperature": 0.0}, rng.randrange(1, 6), True)
            live.append(rid)
        if rng.random() < 0.1:
            for o in eng.step():
                if o.finish_reason and o.request_id in live:
                    live.remove(o.request_id)
    for rid in live:
        eng.abort(rid)
    eng.abort("never-existed")
    eng.step()
    s = eng.stats()
    assert (s["blocks_used"], s["running"], s["waiting"]) == (0, 0, 0)
    assert not eng.has_work()


def test_too_long_request_refused(llm):
    n_ctx = llm.engine.config["n_ctx"]
    with pytest.raises(ValueError, match="exceeds the context length"):
        llm.engine.add("long", [2] * 10, {}, n_ctx, False)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        llm.engine.add("bad", [2, 10**7], {}, 4, False)
    with pytest.raises(ValueError, match="empty"):
        llm.engine.add("empty", [], {}, 4, False)


def test_pool_too_small_refused(model_path):
    tiny = _engine.Engine(model_path, n_threads=1, num_kv_blocks=2, block_size=4)
    with pytest.raises(ValueError, match="exceeds the KV cache"):
        tiny.add("x", [2] * 6, {}, 4, False)


def test_seeded_sampling_reproducible(llm):
    p = SamplingParams(temperature=0.9, top_p=0.95, seed=1234, max_tokens=16, ignore_eos=True, n=2)
    a = llm.generate(["Tell me a story"], p)[0]
    b = llm.generate(["Tell me a story"], p)[0]
    assert [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
    assert a.outputs[0].token_ids != a.outputs[1].token_ids


def test_logprobs_shape_and_finish(llm):
    out = llm.generate("Hello", SamplingParams(temperature=0, max_tokens=5, logprobs=4, ignore_eos=True))[0]
    c = out.outputs[0]
    assert c.finish_reason == "length" and len(c.token_ids) == 5 and len(c.logprobs) == 5
    for tok, lp in zip(c.token_ids, c.logprobs):
        assert tok in lp and len(lp) in (4, 5)
        assert max(lp.values()) == lp[tok]  # greedy: the chosen token is the most likely


def test_stop_string_cuts_text(llm):
    free = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0]
    text = free.outputs[0].text
    stop = text[8:11]
    out = llm.generate("Once upon a time", SamplingParams(temperature=0, max_tokens=30, stop=[stop]))[0]
    assert out.outputs[0].text == text[: text.index(stop)]
    assert out.outputs[0].finish_reason == "stop"
    assert llm.engine.stats()["blocks_used"] == 0


def test_token_prompt_and_detokenize(llm):
    out = llm.generate([{"prompt_token_ids": [2, 651, 6037]}], SamplingParams(max_tokens=8, ignore_eos=True))[0]
    assert out.prompt_token_ids == [2, 651, 6037] and len(out.outputs[0].token_ids) == 8
    assert llm.detokenize(llm.tokenize("héllo wörld 🙂", add_special=False)) == "héllo wörld 🙂"


def test_the_header_is_converted_once_and_read_only(llm):
    """The GGUF header (its vocabulary: 262k strings) crosses from C++ once, at load; callers cannot change it."""
    assert llm.metadata is llm.metadata and llm.hparams is llm.hparams
    assert llm.metadata["general.architecture"] == llm.hparams["arch"] == "gemma3"
    with pytest.raises(TypeError):
        llm.metadata["general.architecture"] = "llama"
