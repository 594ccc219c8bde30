"""Priorities in the scheduler without a model (SchedulerSim): lower values are admitted first, take a step's
tokens before worse running prompts, may preempt worse running sequences for seats and blocks, and are never
preempted for a worse one; with one priority the order is first come, first served (test_scheduler.py)."""
from pyserve import _engine


def toks(n, start=100):
    return list(range(start, start + n))


def sched(step):
    return [tuple(s[:2]) + tuple(s[3:4]) for s in step["scheduled"]]  # (id, index, n_tokens)


def ids(pairs):
    return [p[0] for p in pairs]


def test_waiting_requests_are_admitted_best_priority_first_then_in_arrival_order():
    sim = _engine.testing.SchedulerSim(64, 4, max_num_seqs=1, max_batched_tokens=64)
    sim.add("run", toks(4), 2)
    sim.step()
    for rid, prio in (("late", 5), ("b", 0), ("urgent", -3), ("c", 0)):
        sim.add(rid, toks(4, 300), 1, priority=prio)
    assert ids(sim.waiting()) == ["urgent", "b", "c", "late"]
    admitted = []
    while sim.has_work():
        admitted += [s[0] for s in sim.step()["scheduled"] if s[0] not in admitted]
    # urgent takes run's seat (run is worse); run, preempted, waits first among priority 0
    assert admitted == ["urgent", "run", "b", "c", "late"] and sim.stats()["preemptions"] == 1


def test_a_better_request_takes_the_budget_before_a_worse_running_prefill():
    """A batch job's long prompt runs chunk by chunk; an interactive request of better priority arriving
    meanwhile is admitted in the next step with its whole prompt, and the batch job's chunk gets the rest."""
    sim = _engine.testing.SchedulerSim(256, 4, max_batched_tokens=32)
    sim.add("batch", toks(400), 4, priority=10)
    assert sched(sim.step()) == [("batch", 0, 32)]
    sim.add("chat", toks(12, 900), 4)
    assert sched(sim.step()) == [("chat", 0, 12), ("batch", 0, 20)]
    assert ids(sim.running()) == ["chat", "batch"]
    assert sched(sim.step()) == [("chat", 0, 1), ("batch", 0, 31)]


def test_the_same_arrival_at_one_priority_queues_behind_the_running_prefill():
    """The control: at equal priority the running prompt keeps the budget (first come, first served)."""
    sim = _engine.testing.SchedulerSim(256, 4, max_batched_tokens=32)
    sim.add("batch", toks(400), 4)
    sim.step()
    sim.add("chat", toks(12, 900), 4)
    assert sched(sim.step()) == [("batch", 0, 32)]


def test_a_better_request_preempts_a_worse_running_one_for_its_seat():
    sim = _engine.testing.SchedulerSim(64, 4, max_num_seqs=1, max_batched_tokens=64)
    sim.add("low", toks(8), 50, priority=3)
    sim.step()
    sim.add("high", toks(8, 500), 2, priority=1)
    assert sched(sim.step()) == [("high", 0, 8)]
    assert ids(sim.running()) == ["high"] and ids(sim.waiting()) == ["low"]
    assert sim.stats()["preemptions"] == 1
    while "high" in ids(sim.running()):
        sim.step()
    step = sim.step()  # the preempted one resumes: its prompt's blocks from the cache, its token recomputed
    assert sched(step) == [("low", 0, 1)] and sim.n_computed("low") == 9


def test_a_worse_request_never_preempts_a_better_one():
    sim = _engine.testing.SchedulerSim(64, 4, max_num_seqs=1, max_batched_tokens=64)
    sim.add("high", toks(8), 5, priority=-1)
    sim.step()
    sim.add("low", toks(8, 500), 2, priority=0)
    for _ in range(3):
        assert sched(sim.step()) == [("high", 0, 1)]
    assert sim.stats()["preemptions"] == 0 and ids(sim.waiting()) == ["low"]


def test_blocks_short_the_worst_running_sequence_is_preempted_even_when_older():
    """A decode needs its third block of four as a better request's two-block prompt arrives: the newcomer is
    planned first and the older, worse decode finds no block and waits (first come, first served would keep
    the decode and leave the newcomer waiting: the control)."""
    for prio, running, waiting in ((2, ["new_high"], ["old_low"]), (0, ["old_low"], ["new_high"])):
        sim = _engine.testing.SchedulerSim(4, 4, max_batched_tokens=64)
        sim.add("old_low", toks(8), 20, priority=prio)
        sim.step()
        sim.add("new_high", toks(7, 500), 20, priority=0)
        sim.step()
        assert (ids(sim.running()), ids(sim.waiting())) == (running, waiting)
        assert sim.stats()["preemptions"] == (prio > 0)


def test_a_better_request_preempts_worse_ones_for_blocks():
    sim = _engine.testing.SchedulerSim(6, 4, max_batched_tokens=64)
    sim.add("low", toks(20), 30, priority=1)
    sim.step()
    assert sim.stats()["blocks_free"] == 1
    sim.add("high", toks(16, 500), 2)
    assert sched(sim.step()) == [("high", 0, 16)]
    assert ids(sim.running()) == ["high"] and ids(sim.waiting()) == ["low"]


def test_a_preempted_request_waits_first_among_its_priority():
    sim = _engine.testing.SchedulerSim(64, 4, max_num_seqs=1, max_batched_tokens=64)
    sim.add("low", toks(8), 50, priority=3)
    sim.step()
    sim.add("other", toks(8, 700), 2, priority=3)
    sim.add("high", toks(8, 500), 2, priority=1)
    sim.step()
    assert ids(sim.waiting()) == ["low", "other"]
