"""Speculative decoding on hybrid models (Qwen3.5: Gated DeltaNet layers with a per-sequence recurrent state):
the same tokens, logprobs and top alternatives with it on and off — greedy and seeded sampling, alone, batched,
n > 1, preempted, and a second turn resumed from state checkpoints taken in drafted steps — on random-weight
qwen35 and qwen35moe files and repetitive prompts, so that drafts are proposed and both accepted and rejected;
the draft slots come from the state pool and every slot is free after a finish or an abort mid-stream.

Why bit for bit: the forward copies the state after each drafted row but the last into a draft slot
(Batch::snapshots), and verification puts back the state after the last row it keeps (Scheduler::verified):
the DeltaNet recurrence is a per-token loop, so that state is the bits a step that ran only those rows leaves.
Without the roll-back these tests fail (a rejected draft's tokens stay in the state)."""
from __future__ import annotations

import numpy as np
import pytest

from pyserve import _engine
from support import model_factory as tm
from support.spec_runs import GREEDY, SEEDED, batched_the_same, each, run, spec_counts

K = 7
SPEC_ROWS = 8  # the scheduler's rows a step drafts within: a pool of max_num_seqs + 7 slots with speculation


@pytest.fixture(scope="module", params=tm.hybrid.ARCHS + tm.lfm2.ARCHS)
def path(tmp_path_factory, request):
    # lfm2's seed-0 model hardly copies its prompt when sampling (no draft accepted); seed 2's does
    return tm.write_test_model(tmp_path_factory.mktemp("hybspec") / f"{request.param}.gguf", request.param,
                               qtype="F32", seed=2 if request.param == "lfm2" else 0)


def repetitive(seed: int, unit: int = 5, times: int = 5) -> list[int]:
    """BOS, then a random run of `unit` ids repeated: its n-grams recur, so every step can draft."""
    _, _, _, bos, _ = tm.tokenizer_vocab()
    rng = np.random.default_rng(seed)
    return [bos] + [int(t) for t in rng.integers(0, bos, unit)] * times


PROMPTS = {f"r{i}": repetitive(100 + i, unit=3 + i) for i in range(4)}


def engine(path, k: int, **kw):
    """k > 0: speculation with every drafted row that fits taken (drafts depend on the tokens alone)."""
    return _engine.Engine(str(path), n_threads=2, speculative_ngram=k, speculative_price_drafts=False, **kw)


def alone(path, sampling: dict, max_tokens: int = 40, n: int = 1, **kw) -> dict:
    return each(lambda: engine(path, 0, **kw), PROMPTS, sampling, max_tokens, n)


@pytest.mark.parametrize("sampling", [GREEDY, SEEDED], ids=["greedy", "seeded"])
def test_alone_the_same_with_drafts_accepted_and_rejected(path, sampling):
    on = engine(path, K)
    assert each(lambda: on, PROMPTS, sampling) == alone(path, sampling)
    drafts, drafted, accepted = spec_counts(on)
    assert drafted > accepted > 0 and drafts > 10


def test_batched_the_same(path):
    on = engine(path, K, max_num_batched_tokens=9, block_size=4)  # prompts in chunks beside drafted decodes
    batched_the_same(on, PROMPTS, lambda sampling: alone(path, sampling))


def test_n3_samples_the_same(path):
    """Three seeded samples per prompt: each forks its own copy of the prompt's state, then drafts on its own."""
    on = engine(path, K)  # three decodes a step: five rows left for drafts
    assert each(lambda: on, PROMPTS, SEEDED, n=3) == alone(path, SEEDED, n=3)
    _, drafted, accepted = spec_counts(on)
    assert drafted > accepted > 0


def test_preempted_the_same(path):
    """KV blocks for about two sequences: drafts take blocks too, later sequences are preempted and recompute."""
    on = engine(path, K, block_size=4, num_kv_blocks=40)
    assert run(on, PROMPTS, GREEDY, max_tokens=48) == alone(path, GREEDY, max_tokens=48)
    assert on.stats()["preemptions"] > 0 and spec_counts(on)[2] > 0


def test_second_turn_resumes_from_checkpoints_of_drafted_steps(path):
    """A drafted step crossing a block boundary checkpoints the state of the row that ends there (a draft slot):
    turn 2 resumes inside turn 1's answer with a fresh engine's tokens, and the prefix cache ends as without
    speculation (the same checkpoints, the same hits)."""
    turn1 = repetitive(7, unit=4, times=6)
    engines = [engine(path, k, block_size=4) for k in (0, K)]
    turns = []
    for eng in engines:
        answer = [t for t, _, _ in run(eng, {"t1": turn1}, GREEDY, max_tokens=30)[("t1", 0)]]
        turn2 = turn1 + answer + repetitive(8, unit=3, times=2)[1:]
        turns.append(run(eng, {"t2": turn2}, GREEDY, max_tokens=20))
    assert turns[0] == turns[1] == run(engine(path, 0, enable_prefix_caching=False), {"t2": turn2}, GREEDY, 20)
    stats = [eng.stats() for eng in engines]
    for key in ("state_checkpoints", "state_checkpoint_restores", "prefix_cache_hits", "blocks_cached"):
        assert stats[0][key] == stats[1][key], key
    assert stats[1]["prefix_cache_hits"] >= len(turn1) and spec_counts(engines[1])[2] > 0


def test_draft_slots_come_from_the_pool_and_an_abort_frees_every_slot(path):
    on = engine(path, K, max_num_seqs=2)
    s = on.stats()
    assert (s["state_slots_total"], s["state_slots_used"]) == (2 + SPEC_ROWS - 1, 0)
    on.add("a", PROMPTS["r0"], GREEDY, 300, True)
    on.add("b", PROMPTS["r1"], SEEDED, 300, True, n=2)  # waits for seats: a holds one of two
    while spec_counts(on)[0] < 5:  # a mid-stream, drafting
        assert on.step()
    assert on.stats()["state_slots_used"] == 1
    on.abort("a")
    on.step()  # b admitted: a slot per sample
    assert on.stats()["state_slots_used"] == 2
    while spec_counts(on)[0] < 15:  # b's samples mid-stream, drafting
        assert all(o.finish_reason == "" for o in on.step())
    on.abort("b")
    out = on.step()
    assert {(o.request_id, o.index, o.finish_reason) for o in out} == {("b", 0, "abort"), ("b", 1, "abort")}
    s = on.stats()
    assert (s["state_slots_used"], s["blocks_used"], s["running"], s["waiting"]) == (0, 0, 0, 0)
    assert not on.has_work()
