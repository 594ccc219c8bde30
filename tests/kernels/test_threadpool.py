"""The engine's thread team: each chunk of a job runs exactly once whichever thread claims it, and a job
finishes without the share of a thread that stalls (one the kernel descheduled on a busy machine): the
threads that run take over its chunks instead of waiting at a barrier for it."""
from __future__ import annotations

import pytest

from pyserve import _engine


@pytest.mark.parametrize("threads, chunks", [(1, 5), (2, 1), (2, 7), (3, 64), (4, 1000)])
def test_every_chunk_runs_once_per_job(threads, chunks):
    assert _engine.testing.pool_chunk_runs(threads, chunks, 100) == [100] * chunks


def test_a_stalled_thread_holds_back_only_the_chunk_it_claimed():
    """Rounds of 200 jobs of 8 chunks on a team of 2 whose worker stalls in every chunk it claims, until the
    worker has taken part in enough jobs to show the takeover (a worker that never got a chunk would show
    nothing): in each, the caller ran the other seven chunks and the job finished without the worker."""
    joined = 0
    for _ in range(20):  # bounded: a busy machine may keep the worker off the cores for a round or more
        most, took_part, gave_up = _engine.testing.pool_takeover(8, 200)
        assert not gave_up  # no job waited for the stalled thread to do more than the chunk it held
        assert most <= 1  # the stalled worker ran at most one chunk a job: the caller ran the other seven
        joined += took_part
        if joined >= 20:
            break
    assert joined >= 20, f"the worker took part in {joined} jobs of 4000: the takeover was not exercised"
