"""The prefix cache's disk tier with the real model (`kv_cache_dir`): blocks the pool evicts are read back
instead of recomputed, across a restart and between two engines on one directory, within their cache salt and
their layout; a damaged entry or a failing disk costs a recomputation, never a wrong token. Every run's tokens
are a cold engine's."""
import random

import pytest

from pyserve import _engine
from support.engine_runs import greedy_run as run
from support.live_server import poll

POOL = 40  # blocks of 16: one 400-token prompt's 25 and little more, so the next prompt evicts it


def prompt(seed, n=400):
    rng = random.Random(seed)
    return [2] + [rng.randrange(1000, 20000) for _ in range(n - 1)]


A, B = prompt(1), prompt(2)
FULL = (len(A) - 1) // 16 * 16  # the prompt's tokens a hit can give: never the last token's block


@pytest.fixture(scope="module")
def cold(model_path):
    eng = _engine.Engine(model_path, n_threads=2, enable_prefix_caching=False)
    return {name: run(eng, name, p)[0] for name, p in (("A", A), ("B", B))}


def disk_engine(model_path, d, **kw):
    return _engine.Engine(model_path, n_threads=2, num_kv_blocks=POOL, kv_cache_dir=str(d), **kw)


def test_an_evicted_prefix_is_read_back_not_recomputed(model_path, tmp_path, cold):
    eng = disk_engine(model_path, tmp_path)
    assert run(eng, "a", A) == (cold["A"], 0)
    assert run(eng, "b", B) == (cold["B"], 0)  # takes the pool: A's blocks go to disk
    before = eng.stats()  # A's tail was evicted first (a table is freed last block first); its head is cached
    assert before["disk_entries"] > 0 and before["disk_write_errors"] == 0
    assert run(eng, "a2", A) == (cold["A"], FULL)
    s = eng.stats()
    assert 0 < s["disk_hits"] <= before["disk_entries"]  # A's evicted blocks (its last token's never is)
    assert s["tokens_computed"] - before["tokens_computed"] == len(A) - FULL + 3  # the last block, 3 decodes


def test_a_restart_finds_the_cache_and_a_second_engine_shares_it(model_path, tmp_path, cold):
    first, second = disk_engine(model_path, tmp_path), disk_engine(model_path, tmp_path)
    assert run(first, "a", A) == (cold["A"], 0)
    first.persist_kv_cache()  # as a server's shutdown does: what the pool holds goes to disk
    assert run(second, "a", A) == (cold["A"], FULL)  # another engine (a replica) on the same directory
    del first, second
    again = disk_engine(model_path, tmp_path)
    assert again.stats()["disk_entries"] >= FULL // 16
    assert run(again, "a", A) == (cold["A"], FULL)


def test_a_damaged_entry_is_recomputed_and_dropped(model_path, tmp_path, cold):
    eng = disk_engine(model_path, tmp_path)
    run(eng, "a", A)
    eng.persist_kv_cache()
    del eng
    files = sorted(tmp_path.glob("*.kvb"))
    for f in files:  # every entry's last payload byte flipped
        data = bytearray(f.read_bytes())
        data[-1] ^= 1
        f.write_bytes(data)
    eng = disk_engine(model_path, tmp_path)
    assert run(eng, "a", A) == (cold["A"], 0)
    s = eng.stats()
    assert s["disk_corrupt"] == 1 and s["disk_hits"] == 0  # the first block failed: the chain stops there
    assert run(eng, "a2", A)[1] == FULL  # computed again, then cached in memory


def test_salts_and_layouts_keep_their_own_entries(model_path, tmp_path, cold):
    eng = disk_engine(model_path, tmp_path)
    run(eng, "a", A, salt="x")
    eng.persist_kv_cache()
    assert run(disk_engine(model_path, tmp_path), "a", A, salt="y") == (cold["A"], 0)
    assert run(disk_engine(model_path, tmp_path), "a", A, salt="x") == (cold["A"], FULL)
    other = disk_engine(model_path, tmp_path, block_size=32)  # another layout: the entries are not its own
    assert other.stats()["disk_entries"] == 0 and run(other, "a", A, salt="x")[1] == 0


def test_a_failing_disk_costs_recomputation_only(model_path, tmp_path, cold):
    d = tmp_path / "tier"
    eng = disk_engine(model_path, d)
    d.rmdir()
    d.write_text("the disk is gone")  # every write fails from now on, as on a full disk
    run(eng, "a", A)
    run(eng, "b", B)
    assert eng.stats()["disk_write_errors"] > 0
    out, cached = run(eng, "a2", A)  # what the pool kept of A, the rest computed
    assert out == cold["A"] and cached < FULL and eng.stats()["disk_hits"] == 0


def test_the_tier_stays_within_its_bound(model_path, tmp_path):
    eng = disk_engine(model_path, tmp_path, kv_cache_disk=10 * 1024 * 1024)
    for i in range(4):
        run(eng, f"p{i}", prompt(10 + i))
    eng.persist_kv_cache()
    s = eng.stats()
    entry = next(tmp_path.glob("*.kvb")).stat().st_size
    assert 0 < s["disk_bytes"] <= 10 * 1024 * 1024 and s["disk_bytes"] == s["disk_entries"] * entry
    assert sum(f.stat().st_size for f in tmp_path.glob("*.kvb")) == s["disk_bytes"]


def test_a_bad_directory_is_refused_at_load(model_path, tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="kv cache dir .*cannot create"):
        disk_engine(model_path, tmp_path / "file")


def test_a_marked_prompt_is_written_through_at_once(model_path, tmp_path, cold):
    """A pool large enough that nothing is evicted: an unmarked prompt writes nothing, a marked one its 25
    full blocks (the last token's too) as they are computed — files another engine then reads."""
    eng = _engine.Engine(model_path, n_threads=2, kv_cache_dir=str(tmp_path))
    assert run(eng, "b", B) == (cold["B"], 0)
    assert eng.stats()["disk_bytes_written"] == 0 and not list(tmp_path.glob("*.kvb"))
    eng.add("a", A, {"temperature": 0.0}, 4, True, write_through=True)
    while eng.has_work():
        eng.step()
    poll(lambda: len(list(tmp_path.glob("*.kvb"))) == len(A) // 16, what="the prompt's blocks on disk")
    assert run(disk_engine(model_path, tmp_path), "a", A) == (cold["A"], FULL)  # another engine finds them
