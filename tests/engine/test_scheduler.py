"""The scheduler without a model (SchedulerSim: the real Scheduler and BlockManager, fake sequences whose step
marks the scheduled tokens computed and draws a made-up token)."""
import random

from pyserve import _engine


def toks(n, start=100):
    return list(range(start, start + n))


def sched(step):
    return [tuple(s) for s in step["scheduled"]]


def test_chunked_prefill_under_the_budget_then_decode():
    sim = _engine.testing.SchedulerSim(64, 4, max_batched_tokens=8)
    sim.add("a", toks(20), 3)
    assert sched(sim.step()) == [("a", 0, 0, 8, False)]
    assert sched(sim.step()) == [("a", 0, 8, 8, False)]
    s = sim.step()
    assert sched(s) == [("a", 0, 16, 4, True)] and [tuple(t) for t in s["tokens"]] == [("a", 0, 1000)]
    assert sched(sim.step()) == [("a", 0, 20, 1, True)]
    s = sim.step()
    assert sched(s) == [("a", 0, 21, 1, True)] and [tuple(f) for f in s["finished"]] == [("a", 0)]
    assert not sim.has_work() and sim.step()["scheduled"] == []
    assert sim.stats()["blocks_used"] == 0


def test_running_first_then_admission_with_the_rest_of_the_budget():
    sim = _engine.testing.SchedulerSim(64, 4, max_batched_tokens=8)
    sim.add("a", toks(4), 10)
    assert sched(sim.step()) == [("a", 0, 0, 4, True)]
    sim.add("b", toks(20, 500), 10)
    assert sched(sim.step()) == [("a", 0, 4, 1, True), ("b", 0, 0, 7, False)]
    assert sched(sim.step()) == [("a", 0, 5, 1, True), ("b", 0, 7, 7, False)]
    assert sched(sim.step()) == [("a", 0, 6, 1, True), ("b", 0, 14, 6, True)]
    assert sched(sim.step()) == [("a", 0, 7, 1, True), ("b", 0, 20, 1, True)]


def test_sequence_cap():
    sim = _engine.testing.SchedulerSim(64, 4, max_num_seqs=2)
    for r in "abc":
        sim.add(r, toks(3, ord(r) * 10), 2)
    assert [s[0] for s in sched(sim.step())] == ["a", "b"]
    assert [tuple(w) for w in sim.waiting()] == [("c", 0)]
    sim.step()  # a and b finish
    assert [s[0] for s in sched(sim.step())] == ["c"]


def test_preemption_takes_the_newest_and_recomputes_it():
    # 4 blocks of 4 tokens. a and b (4-token prompts) need a second block at their first decode; c (2 tokens)
    # does not, but it is the newest: b's need preempts it.
    sim = _engine.testing.SchedulerSim(4, 4)
    sim.add("a", toks(4, 100), 2)
    sim.add("b", toks(4, 200), 2)
    sim.add("c", toks(2, 300), 4)
    assert [s[:2] for s in sched(sim.step())] == [("a", 0), ("b", 0), ("c", 0)]
    assert sched(sim.step()) == [("a", 0, 4, 1, True), ("b", 0, 4, 1, True)]
    st = sim.stats()
    assert st["preemptions"] == 1 and [tuple(w) for w in sim.waiting()] == [("c", 0)]
    assert sim.n_computed("c") == 0 and sim.tokens("c") == toks(2, 300) + [1000]  # its token is kept
    # a and b finished; c comes back and recomputes its prompt and its token in one go.
    assert sched(sim.step()) == [("c", 0, 0, 3, True)]
    assert sim.tokens("c") == toks(2, 300) + [1000, 1001]
    while sim.has_work():
        sim.step()
    assert sim.stats()["blocks_used"] == 0


def test_preemption_order_is_newest_first():
    # Every sequence needs a new block at the same step; only the oldest ones get one.
    sim = _engine.testing.SchedulerSim(5, 4)
    for r in "abcd":
        sim.add(r, toks(4, ord(r) * 10), 8)
    sim.step()
    assert sched(sim.step()) == [("a", 0, 4, 1, True), ("b", 0, 4, 1, True)]
    assert [tuple(w) for w in sim.waiting()] == [("c", 0), ("d", 0)]  # d went first, then c (front)
    assert sim.stats()["preemptions"] == 2


def test_readmission_reuses_the_cached_prefix():
    sim = _engine.testing.SchedulerSim(4, 4)
    sim.add("a", toks(4, 100), 3)
    sim.add("b", toks(9, 200), 3)  # 3 blocks
    sim.step()
    s = sim.step()  # a needs a 2nd block: b (newest) is preempted; its 2 full blocks stay cached
    assert sched(s) == [("a", 0, 4, 1, True)]
    assert sim.stats()["blocks_cached"] == 2
    while ("b", 0) not in [tuple(r) for r in sim.running()]:
        s = sim.step()
    # b came back with its two full blocks found: only its last prompt token and its token are recomputed.
    assert ("b", 0, 8, 2, True) in sched(s)
    assert sim.stats()["prefix_cache_hits"] == 8


def test_prefix_hit_sets_computed_tokens():
    sim = _engine.testing.SchedulerSim(32, 4)
    a = toks(10)
    sim.add("a", a, 1)
    sim.step()
    assert sim.stats()["blocks_cached"] == 2  # [0,4) [4,8); the partial third is not kept
    sim.add("b", a[:8] + [7, 7, 7], 1)
    assert sched(sim.step()) == [("b", 0, 8, 3, True)]
    sim.add("c", a, 1)  # the same prompt: 8 hit, the last block computed
    assert sched(sim.step()) == [("c", 0, 8, 2, True)]
    sim.add("d", [1] + a[1:], 1)  # first block differs: no hit
    assert sched(sim.step()) == [("d", 0, 0, 10, True)]
    st = sim.stats()
    assert (st["prefix_cache_queries"], st["prefix_cache_hits"]) == (10 + 11 + 10 + 10, 16)


def test_prefix_caching_off():
    sim = _engine.testing.SchedulerSim(32, 4, prefix_caching=False)
    sim.add("a", toks(10), 1)
    sim.step()
    sim.add("b", toks(10), 1)
    assert sched(sim.step()) == [("b", 0, 0, 10, True)]
    assert sim.stats()["blocks_cached"] == 0 and sim.stats()["prefix_cache_hits"] == 0


def test_shared_prefix_blocks_are_not_duplicated():
    sim = _engine.testing.SchedulerSim(64, 4)
    sim.add("a", toks(17), 5)
    sim.step()
    for r in "bcd":
        sim.add(r, toks(17) + [ord(r)], 5)
    sim.step()
    ta = sim.table("a")
    for r in "bcd":
        assert sim.table(r)[:4] == ta[:4]
    assert [sim.ref_count(b) for b in ta[:4]] == [4, 4, 4, 4]
    # 4 shared + a's 5th block (tokens 16..19) + one 5th block each for b, c, d
    assert sim.stats()["blocks_used"] == 4 + 4


def test_n_samples_fork_and_copy_on_write():
    sim = _engine.testing.SchedulerSim(32, 4)
    sim.add("s", toks(10), 3, n=4)
    s = sim.step()
    assert sched(s) == [("s", 0, 0, 10, True)]  # the prompt once
    assert sorted(tuple(t) for t in s["tokens"]) == [("s", i, 1000 * (i + 1)) for i in range(4)]
    assert [tuple(r) for r in sim.running()] == [("s", i) for i in range(4)]
    t0 = sim.table("s", 0)
    assert all(sim.table("s", i) == t0 for i in range(4))
    assert [sim.ref_count(b) for b in t0] == [4, 4, 4]
    assert sim.stats()["blocks_used"] == 3
    s = sim.step()  # each sample writes position 10, in the shared partial block: three copies
    assert sched(s) == [("s", i, 10, 1, True) for i in range(4)]
    copies = [tuple(c) for c in s["copies"]]
    assert len(copies) == 3 and all(src == t0[2] for src, _ in copies)
    assert [sim.ref_count(b) for b in t0] == [4, 4, 1]
    tables = [sim.table("s", i) for i in range(4)]
    assert all(t[:2] == t0[:2] for t in tables) and len({t[2] for t in tables}) == 4
    assert sim.stats()["blocks_used"] == 2 + 4
    s = sim.step()
    assert sorted(tuple(f) for f in s["finished"]) == [("s", i) for i in range(4)]
    st = sim.stats()
    # Nothing held; the prompt's 2 full blocks and each sample's now full third block stay cached.
    assert (st["blocks_used"], st["blocks_cached"], st["running"]) == (0, 6, 0)


def test_n_samples_abort_frees_everything():
    sim = _engine.testing.SchedulerSim(32, 4)
    sim.add("s", toks(10), 8, n=4)
    sim.step()
    sim.step()
    assert sim.stats()["running"] == 4
    sim.abort("s")
    st = sim.stats()
    assert (st["blocks_used"], st["running"], st["waiting"]) == (0, 0, 0)
    assert not sim.has_work()


def test_n_samples_abort_of_one_sample_before_and_after_the_fork():
    # The engine's own abort (SequenceGroups): before the fork the one sequence stops standing for the sample;
    # after it, the sample's blocks go and the shared ones lose a reference.
    sim = _engine.testing.SchedulerSim(32, 4)
    sim.add("s", toks(10), 8, n=4)
    sim.abort("s", 1)
    assert [tuple(r) for r in sim.waiting()] == [("s", 0)]
    s = sim.step()
    assert sorted(tuple(t) for t in s["tokens"]) == [("s", i, 1000 * (i + 1)) for i in (0, 2, 3)]
    t0 = sim.table("s", 0)
    assert [sim.ref_count(b) for b in t0] == [3, 3, 3]
    sim.step()  # copy on write of the shared partial block
    assert [sim.ref_count(b) for b in t0] == [3, 3, 1] and sim.stats()["blocks_used"] == 2 + 3
    own = sim.table("s", 2)[2]
    sim.abort("s", 2)
    assert [sim.ref_count(b) for b in t0[:2]] == [2, 2] and sim.ref_count(own) == 0
    assert [tuple(r) for r in sim.running()] == [("s", 0), ("s", 3)] and sim.stats()["blocks_used"] == 2 + 2
    sim.abort("s", 7)  # no such sample
    assert sim.stats()["running"] == 2
    sim.abort("s")
    st = sim.stats()
    assert (st["blocks_used"], st["running"], st["waiting"]) == (0, 0, 0)
    assert not sim.has_work()


def test_random_add_abort_leaves_no_blocks():
    rng = random.Random(11)
    sim = _engine.testing.SchedulerSim(24, 4, max_num_seqs=8, max_batched_tokens=16)
    live = set()
    prefixes = [toks(rng.randrange(5, 40), 1000 * k) for k in range(5)]
    for i in range(1500):
        r = rng.random()
        if live and r < 0.3:
            rid = rng.choice(sorted(live))
            sim.abort(rid)
            live.discard(rid)
        elif r < 0.6:
            p = rng.choice(prefixes)
            sim.add(f"r{i}", p[: rng.randrange(1, len(p) + 1)] + [rng.randrange(50)], rng.randrange(1, 12),
                    n=rng.choice([1, 1, 2, 3]))
            live.add(f"r{i}")
        else:
            st = sim.step()
            assert sum(s[3] for s in st["scheduled"]) <= 16
            done = {f[0] for f in st["finished"]}
            live -= {rid for rid in done if not any(rid == r[0] for r in sim.running() + sim.waiting())}
            s = sim.stats()
            assert 0 <= s["blocks_used"] <= 24 and s["running"] <= 8  # n samples take n seats from admission
    for rid in list(live):
        sim.abort(rid)
    s = sim.stats()
    assert (s["blocks_used"], s["running"], s["waiting"]) == (0, 0, 0)
    assert s["prefix_cache_hits"] > 0 and s["preemptions"] > 0


# ---- a step-time target (Sarathi-Serve's stall-free batching) with a fixed cost model ----
# MACs per row, per sampled row, per context position: with 1 s per GMAC a row costs 1 ms, a sampled row 2 ms
# more, attention nothing
MACS = (1e6, 2e6, 0.0)


def test_a_step_beside_decodes_takes_the_prompt_tokens_the_target_leaves():
    sim = _engine.testing.SchedulerSim(256, 4, max_batched_tokens=64)
    sim.set_step_target(0.010, MACS, 0.001, 1.0)  # 1 s per GMAC: 1 ms a row, 2 ms more a sampled row
    sim.add("a", toks(40), 50)
    assert sched(sim.step()) == [("a", 0, 0, 40, True)]  # nothing streams: the token budget alone
    sim.add("b", toks(30, 500), 5)
    # a's decode: 1 ms floor + 1 ms row + 2 ms sampled = 4 ms; 6 ms left: 6 prompt rows... but at least 16
    assert sched(sim.step()) == [("a", 0, 40, 1, True), ("b", 0, 0, 16, False)]
    sim.set_step_target(0.030, MACS, 0.001, 1.0)  # 26 ms left: b's last 14 rows (+ 2 ms, sampled) fit
    assert sched(sim.step()) == [("a", 0, 41, 1, True), ("b", 0, 16, 14, True)]


def test_the_floor_keeps_prompts_moving_when_decodes_fill_the_target():
    sim = _engine.testing.SchedulerSim(256, 4, max_batched_tokens=64)
    sim.set_step_target(0.002, MACS, 0.001, 1.0)  # one decode alone (4 ms) exceeds the target
    sim.add("a", toks(8), 50)
    sim.step()
    sim.add("b", toks(40, 500), 5)
    sim.add("c", toks(40, 900), 5)
    # b gets the floor (16); c waits: the floor is given once a step
    assert sched(sim.step()) == [("a", 0, 8, 1, True), ("b", 0, 0, 16, False)]
    assert sched(sim.step()) == [("a", 0, 9, 1, True), ("b", 0, 16, 16, False)]


def test_without_a_target_the_budget_rules_as_before():
    sim = _engine.testing.SchedulerSim(256, 4, max_batched_tokens=16)
    sim.set_step_target(0.0, MACS, 0.001, 1.0)
    sim.add("a", toks(8), 50)
    sim.step()
    sim.add("b", toks(40, 500), 5)
    assert sched(sim.step()) == [("a", 0, 8, 1, True), ("b", 0, 0, 15, False)]


# ---- speculative decoding: drafted rows, their verification, the rollback ----

def decoding(sim, rid, prompt_len, max_tokens, start=100):
    """Adds rid and runs its prefill: it then decodes (its first made-up token drawn)."""
    sim.add(rid, toks(prompt_len, start), max_tokens)
    sim.step()


def test_an_accepted_draft_keeps_its_rows():
    sim = _engine.testing.SchedulerSim(64, 4)
    decoding(sim, "a", 4, 10)
    s = sim.step({("a", 0): [1001, 1002, 1003]})  # what the sim draws next: all accepted, plus one
    assert sched(s) == [("a", 0, 4, 4, True)]
    assert [t[2] for t in s["tokens"]] == [1001, 1002, 1003, 1004]
    assert sim.n_computed("a") == 8 and len(sim.tokens("a")) == 9
    assert len(sim.table("a")) == 2 and sim.stats()["blocks_used"] == 2


def test_a_rejected_draft_rolls_back_its_blocks():
    sim = _engine.testing.SchedulerSim(64, 4)
    decoding(sim, "a", 4, 10)
    s = sim.step({("a", 0): [1001, 9, 9, 9, 9]})  # rows for positions 4 … 9: three blocks while verifying
    assert sched(s) == [("a", 0, 4, 6, True)]
    assert [t[2] for t in s["tokens"]] == [1001, 1002]  # the first agrees; the second draw differs from 9
    assert sim.n_computed("a") == 6 and sim.tokens("a")[-2:] == [1001, 1002]
    assert len(sim.table("a")) == 2 and sim.stats()["blocks_used"] == 2  # the third block went back
    assert sched(sim.step()) == [("a", 0, 6, 1, True)]  # and decoding goes on from the kept rows


def test_drafts_fill_only_the_rows_left_and_the_budget():
    sim = _engine.testing.SchedulerSim(64, 4, spec_rows=5)
    for i, rid in enumerate("abc"):
        decoding(sim, rid, 4, 20, start=100 * (i + 1))
    drafts = {(rid, 0): [1, 2, 3] for rid in "abc"}  # three decodes leave two rows
    # all alike (p = 1/2): a's first drafted row, then b's (1/2) before a's second (1/4)
    assert sched(sim.step(drafts)) == [("a", 0, 6, 2, True), ("b", 0, 5, 2, True), ("c", 0, 4, 1, True)]
    sim = _engine.testing.SchedulerSim(64, 4, max_batched_tokens=2)
    decoding(sim, "a", 2, 20)
    assert sched(sim.step({("a", 0): [1001, 1002, 1003]})) == [("a", 0, 2, 2, True)]


def test_a_draft_never_preempts():
    sim = _engine.testing.SchedulerSim(4, 4)  # 16 tokens of KV
    decoding(sim, "a", 4, 8)
    decoding(sim, "b", 4, 8, start=500)
    s = sim.step({("a", 0): [1, 2, 3, 4]})  # the decodes take the last free block; a's draft would need another
    assert sched(s) == [("a", 0, 5, 1, True), ("b", 0, 4, 1, True)]
    assert sim.stats()["preemptions"] == 0


def test_drafts_beside_decodes_fit_the_step_target():
    sim = _engine.testing.SchedulerSim(64, 4)
    sim.set_step_target(0.0035, (1e9, 0.0, 0.0), 0.0, 1e-3)  # 1 ms a row: the decode, then two drafted rows
    decoding(sim, "a", 4, 20)
    assert sched(sim.step({("a", 0): [1001, 1002, 1003, 1004]})) == [("a", 0, 4, 3, True)]


def test_drafted_runs_leave_the_prefix_cache_as_plain_decoding():
    rng = random.Random(3)
    plan = [rng.choice([[], [1, 2, 3], None]) for _ in range(30)]  # no draft, a wrong one, a right one (None)

    def run(drafting):
        sim = _engine.testing.SchedulerSim(64, 4)
        decoding(sim, "a", 6, 25)
        for step in plan:
            if not sim.has_work():
                break
            n = len(sim.tokens("a")) - 6  # generated so far: the sim's next draws are 1000 + n, …
            draft = [1000 + n + j for j in range(3)] if step is None else step
            sim.step({("a", 0): draft} if drafting else {})
        while sim.has_work():
            sim.step()
        return sim.stats()

    plain, drafted = run(False), run(True)
    assert plain["blocks_cached"] == drafted["blocks_cached"] > 0
    assert plain["blocks_used"] == drafted["blocks_used"] == 0


def test_drafted_rows_are_the_ones_worth_their_time():
    ms = [0.0, 5.4, 5.6, 5.8, 5.9, 6.1, 6.6, 7.0, 7.5]  # a step of r rows, ms (this machine's shape)
    sim = _engine.testing.SchedulerSim(64, 4)
    sim.set_row_costs([t * 1e-3 for t in ms])
    decoding(sim, "a", 4, 400)
    # p = 1/2: rows of 1/2, 1/4, 1/8 expected tokens pay (with RowCosts' margin, 1.25) for 0.2, 0.2, 0.1 ms;
    # the 4th (1/16) not for 0.2 ms
    assert sched(sim.step({("a", 0): [1, 2, 3, 4, 5, 6, 7]})) == [("a", 0, 4, 4, True)]
    for _ in range(3):  # drafts that keep missing: p falls, and the rows stop paying
        sim.step({("a", 0): [1, 2, 3, 4, 5, 6, 7]})
    assert sched(sim.step({("a", 0): [1, 2, 3]}))[0][3] < 4
    rows = []
    for _ in range(30):  # drafts that are right: p climbs, and more rows pay
        n = len(sim.tokens("a")) - 4  # generated so far: the sim draws 1000 + n, 1000 + n + 1, …
        rows.append(sched(sim.step({("a", 0): [1000 + n + j for j in range(7)]}))[0][3])
    assert rows == sorted(rows) and rows[0] <= 3 and rows[-1] >= 7  # the 8th row (+0.5 ms) pays only near p = 1


def test_more_streams_draft_fewer_rows():
    """The same drafts (p = 1/2 each): one stream takes three rows; of four, one row in all — a slower step is
    waited for by every stream in it, the gain is the drafting one's (RowCosts' margin grows as √streams)."""
    ms = [0.0, 5.4, 5.6, 5.8, 5.9, 6.1, 6.6, 7.0, 7.5]
    sim = _engine.testing.SchedulerSim(64, 4)
    sim.set_row_costs([t * 1e-3 for t in ms])
    for i, rid in enumerate("abcd"):
        decoding(sim, rid, 4, 40, start=100 * (i + 1))
    s = sched(sim.step({(rid, 0): [1, 2, 3, 4, 5, 6, 7] for rid in "abcd"}))
    assert len(s) == 4 and sum(n for _, _, _, n, _ in s) == 4 + 1
