"""n > 1 with the real model: the prompt is computed once and its blocks shared by the n samples."""
import random

import pytest

from pyserve import SamplingParams, _engine


def synthetic(n, seed):
    rng = random.Random(seed)
    return [2] + [rng.randrange(1000, 20000) for _ in range(n - 1)]


def run(eng, rid, prompt, max_tokens, sampling, n, watch=None):
    """Adds one request of n samples; steps until every sample ends. -> {index: (tokens, logprobs)}."""
    eng.add(rid, prompt, sampling, max_tokens, True, n=n)
    outs = {i: ([], []) for i in range(n)}
    done = set()
    while len(done) < n:
        for o in eng.step():
            r, tok, lp, reason, n_prompt, idx = o.request_id, o.token, o.logprob, o.finish_reason, o.n_prompt, o.index
            assert r == rid and n_prompt == len(prompt) and idx not in done
            if tok >= 0:
                outs[idx][0].append(tok), outs[idx][1].append(lp)
            if reason:
                done.add(idx)
        if watch is not None:
            watch(eng.stats())
    return outs


@pytest.fixture(scope="module")
def eng(model_path):
    return _engine.Engine(model_path, n_threads=2)


PROMPT = synthetic(1000, 5)  # 62 full blocks of 16 and 8 tokens in a 63rd


def test_n4_shares_the_prompt_kv(eng):
    peak = []
    before = eng.stats()["tokens_computed"]
    outs = run(eng, "g", PROMPT, 24, {"temperature": 0.0}, 4, watch=lambda s: peak.append(s["blocks_used"]))
    # The 62 full prompt blocks are shared; each sample holds a copy of the partial 63rd (copy on write at its
    # first token) and one block more for tokens 1008..1022: 62 + 4 × 2, where 4 separate requests hold 4 × 64.
    print(f"\nn=4 over a 1000-token prompt, 24 tokens each: peak blocks_used {max(peak)} "
          f"(one prompt = 63 blocks; 4 unshared copies would hold {4 * 64})")
    assert max(peak) == 62 + 4 * 2
    assert peak[0] == 32  # the first prefill chunk (512 tokens)
    # Computed: the prompt once, then 23 tokens per sample.
    assert eng.stats()["tokens_computed"] - before == 1000 + 4 * 23
    assert eng.stats()["blocks_used"] == 0
    # Greedy: four identical samples, each the same as n = 1.
    assert outs[0] == outs[1] == outs[2] == outs[3]
    assert run(eng, "g1", PROMPT, 24, {"temperature": 0.0}, 1)[0] == outs[0]


def test_seeded_n4_is_reproducible_and_seed_plus_index(eng):
    p = synthetic(40, 9)
    sampling = {"temperature": 1.0, "seed": 1234}
    a = run(eng, "s1", p, 16, sampling, 4)
    b = run(eng, "s2", p, 16, sampling, 4)
    assert a == b
    assert len({tuple(a[i][0]) for i in range(4)}) > 1
    # Sample i draws with seed + i: the same as a single request seeded 1234 + i.
    assert run(eng, "s3", p, 16, {"temperature": 1.0, "seed": 1236}, 1)[0] == a[2]


def test_abort_n4_frees_everything(eng):
    eng.add("ab", PROMPT, {"temperature": 0.7}, 64, True, n=4)
    outs = []
    while len(outs) < 4 * 3:  # the prompt, then a few tokens per sample
        outs += [o for o in eng.step() if o.token >= 0]
    assert eng.stats()["running"] == 4 and eng.stats()["blocks_used"] > 63
    eng.abort("ab")
    ends = eng.step()
    assert sorted((o.request_id, o.finish_reason, o.index) for o in ends) == [("ab", "abort", i) for i in range(4)]
    s = eng.stats()
    assert (s["blocks_used"], s["running"], s["waiting"]) == (0, 0, 0)
    assert not eng.has_work()


def test_abort_before_the_fork_and_of_one_sample(eng):
    eng.add("w", PROMPT, {"temperature": 0.0}, 8, True, n=3)
    eng.abort("w", 1)  # still one sequence for the three samples: sample 1 ends, 0 and 2 go on
    ends = eng.step()
    assert (ends[0].request_id, ends[0].token, ends[0].finish_reason, ends[0].index) == ("w", -1, "abort", 1)
    got, outs = {}, ends[1:]  # the prompt may be cached already: then the samples drew in that step too
    while True:
        for o in outs:
            tok, idx = o.token, o.index
            got.setdefault(idx, []).append(tok)
            if idx == 2 and len(got[2]) == 3:
                eng.abort("w", 2)
        if not eng.has_work():
            break
        outs = eng.step()
    assert sorted(got) == [0, 2] and len(got[0]) == 8 and len(got[2]) == 4 and got[2][-1] == -1
    assert eng.stats()["blocks_used"] == 0


def test_the_simulator_forks_and_frees_as_the_engine(model_path):
    # SchedulerSim runs the engine's fork / abort / finish (SequenceGroups): the same requests, aborts and
    # steps leave the same sequences and blocks, the model's tokens or the made-up ones.
    eng = _engine.Engine(model_path, n_threads=1, num_kv_blocks=32, block_size=4)
    sim = _engine.testing.SchedulerSim(32, 4)
    prompt = synthetic(9, 3)  # blocks of 4, 4 and 1: no generated block fills up before the end
    eng.add("s", prompt, {"temperature": 1.0, "seed": 7}, 8, True, n=4)
    sim.add("s", prompt, 8, n=4)
    keys = ("running", "waiting", "blocks_used", "blocks_cached", "preemptions")

    def step():
        drew = sorted(o.index for o in eng.step() if o.token >= 0)
        assert drew == sorted(t[1] for t in sim.step()["tokens"])
        e, s = eng.stats(), sim.stats()
        assert {k: e[k] for k in keys} == {k: s[k] for k in keys}
        return drew

    eng.abort("s", 1), sim.abort("s", 1)  # before the fork
    assert step() == [0, 2, 3]  # the prompt, the fork, a first token each
    assert step() == [0, 2, 3]  # copy on write of the partial block
    eng.abort("s", 2), sim.abort("s", 2)
    assert step() == [0, 3]
    eng.abort("s"), sim.abort("s")
    assert step() == []
    assert (eng.stats()["blocks_used"], eng.stats()["blocks_cached"]) == (0, 2)  # the prompt's full blocks
    assert not eng.has_work() and not sim.has_work()


def test_admission_counts_n_times_max_tokens(model_path):
    tiny = _engine.Engine(model_path, n_threads=1, num_kv_blocks=10, block_size=4)
    tiny.add("ok", [2] * 6, {}, 4, False, n=4)  # 1 shared block + 4 × 2
    with pytest.raises(ValueError, match="exceeds the KV cache"):
        tiny.add("x", [2] * 6, {}, 4, False, n=5)  # 1 + 5 × 2 = 11 > 10
    with pytest.raises(ValueError, match="n must be"):
        tiny.add("y", [2] * 6, {}, 4, False, n=0)


def test_llm_generate_n(llm):
    p = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, n=3)
    out = llm.generate("The capital of France is", p)[0]
    assert [c.index for c in out.outputs] == [0, 1, 2]
    assert out.outputs[0].token_ids == out.outputs[1].token_ids == out.outputs[2].token_ids
    assert out.finished and all(c.finish_reason == "length" for c in out.outputs)
    # A stop string ends each sample on its own (engine.abort(id, index)); nothing is left behind.
    text = out.outputs[0].text
    stopped = llm.generate("The capital of France is",
                           SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, n=3, stop=[text[3:6]]))[0]
    assert all(c.text == text[: text.index(text[3:6])] and c.finish_reason == "stop" for c in stopped.outputs)
    assert llm.engine.stats()["blocks_used"] == 0 and not llm.engine.has_work()
