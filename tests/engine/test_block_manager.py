"""The KV block manager without a model: verbs, the prefix cache's hash chain, LRU eviction, copy-on-write."""
import random

import pytest

from pyserve import _engine

BS = 4


def toks(n, start=100):
    return list(range(start, start + n))


def check_invariants(bm, tables):
    """Ref counts equal the number of tables holding each block; used + free == total."""
    held = {}
    for t in tables:
        for b in bm.table(t):
            held[b] = held.get(b, 0) + 1
    for b in range(bm.num_blocks):
        assert bm.ref_count(b) == held.get(b, 0) >= 0
    assert bm.num_used == len(held)
    assert bm.num_used + bm.num_free == bm.num_blocks


def test_allocate_append_free():
    bm = _engine.testing.BlockManager(8, BS)
    assert (bm.num_free, bm.num_used, bm.num_cached) == (8, 0, 0)
    assert bm.allocate(0, toks(6), 6) == 0  # nothing cached: no hit
    assert len(bm.table(0)) == 2 and bm.num_used == 2
    assert bm.append(0, 6, 9) == []  # a third block, no copy
    assert len(bm.table(0)) == 3
    assert bm.append(0, 9, 9 * BS + 1) is None  # 10 blocks do not fit in 8: nothing changes
    assert len(bm.table(0)) == 3 and bm.num_used == 3
    check_invariants(bm, [0])
    bm.free(0)
    assert (bm.num_free, bm.num_used, bm.num_cached) == (8, 0, 0)  # nothing committed: nothing cached


def test_release_of_free_block_raises():
    bm = _engine.testing.BlockManager(2, BS)
    b = bm.allocate_block()
    assert bm.release(b) == 0
    with pytest.raises(Exception, match="release of free KV block"):
        bm.release(b)
    assert bm.ref_count(b) == 0


def test_hash_chain_hits_and_misses():
    bm = _engine.testing.BlockManager(16, BS)
    prompt = toks(11)  # blocks [0,4) [4,8) full, [8,11) partial
    bm.allocate(0, prompt, 11)
    assert bm.lookup(prompt + [1]) == []  # nothing committed yet
    bm.commit(0, prompt, 11)
    t0 = bm.table(0)
    assert bm.is_cached(t0[0]) and bm.is_cached(t0[1]) and not bm.is_cached(t0[2])
    # Same first two blocks: both hit; a different second block: only the first; a different first: none.
    assert bm.lookup(prompt[:8] + [7, 7]) == t0[:2]
    assert bm.lookup(prompt[:4] + [9, 9, 9, 9, 9]) == t0[:1]
    assert bm.lookup([1] + prompt[1:]) == []
    # The chain: the same second block after a different first block is a miss.
    assert bm.lookup([1, 2, 3, 4] + prompt[4:8] + [5]) == []
    # Never the block that holds the last token: exactly 8 tokens can reuse only the first block.
    assert bm.lookup(prompt[:8]) == t0[:1]
    assert bm.lookup(prompt[:9]) == t0[:2]
    assert bm.lookup(prompt[:4]) == []
    # Admission reuses them (shared, ref 2) and counts the hit.
    q = prompt[:8] + [50, 51, 52]
    assert bm.allocate(1, q, len(q)) == 8
    t1 = bm.table(1)
    assert t1[:2] == t0[:2] and t1[2] != t0[2]
    assert bm.ref_count(t0[0]) == 2 and bm.ref_count(t0[1]) == 2
    assert (bm.queried_tokens, bm.hit_tokens) == (11 + 11, 8)
    check_invariants(bm, [0, 1])


def test_hash_depends_on_parent_and_tokens():
    h = _engine.testing.BlockManager.hash_block
    assert h(1, [1, 2, 3, 4]) == h(1, [1, 2, 3, 4])
    assert h(1, [1, 2, 3, 4]) != h(2, [1, 2, 3, 4])
    assert h(1, [1, 2, 3, 4]) != h(1, [1, 2, 4, 3])


def test_freed_full_blocks_stay_cached_and_are_reused():
    bm = _engine.testing.BlockManager(8, BS)
    p = toks(9)
    bm.allocate(0, p, 9)
    bm.commit(0, p, 9)
    t0 = bm.table(0)
    bm.free(0)
    assert (bm.num_used, bm.num_cached, bm.num_free) == (0, 2, 8)  # two full blocks kept; all allocatable
    assert bm.ref_count(t0[0]) == 0
    assert bm.allocate(1, p, 9) == 8  # a second run of the same prompt finds both
    assert bm.table(1)[:2] == t0[:2]
    assert (bm.num_used, bm.num_cached) == (3, 0)
    check_invariants(bm, [1])


def test_lru_eviction_order():
    bm = _engine.testing.BlockManager(6, BS)
    a, b = toks(9, 100), toks(9, 200)
    for t, p in ((0, a), (1, b)):
        bm.allocate(t, p, 9)
        bm.commit(t, p, 9)
    ta, tb = bm.table(0), bm.table(1)
    bm.free(0)  # released first: evicted first, its tail block before its head
    bm.free(1)
    assert bm.num_cached == 4 and bm.num_free == 6
    # 2 never-cached blocks are free; fresh blocks take those, then evict a's tail, a's head, b's tail ...
    fresh = [bm.allocate_block() for _ in range(2)]
    assert set(fresh).isdisjoint(ta[:2] + tb[:2])
    assert bm.num_cached == 4
    assert bm.allocate_block() == ta[1]
    assert bm.lookup(a) == [ta[0]] and bm.lookup(b) == tb[:2]
    assert bm.allocate_block() == ta[0]
    assert bm.lookup(a) == []
    assert bm.allocate_block() == tb[1]
    assert bm.lookup(b) == [tb[0]]
    assert bm.num_cached == 1


def test_hit_revives_cached_block_before_eviction():
    bm = _engine.testing.BlockManager(3, BS)
    p = toks(9)
    bm.allocate(0, p, 9)
    bm.commit(0, p, 9)
    t0 = bm.table(0)
    bm.free(0)
    # 3 blocks: the 2 cached ones are reused, 1 fresh: fits exactly.
    assert bm.can_allocate(p, 9)
    assert bm.allocate(1, p, 9) == 8 and bm.table(1)[:2] == t0[:2]
    assert bm.num_free == 0
    bm.free(1)
    # A different prompt needing all 3 blocks evicts the cached ones.
    assert bm.allocate(2, toks(12, 500), 12) == 0
    assert bm.lookup(p) == [] and bm.num_cached == 0


def test_fork_and_copy_on_first_write():
    bm = _engine.testing.BlockManager(16, BS)
    p = toks(10)  # 2 full blocks + 2 tokens in the third
    bm.allocate(0, p, 10)
    bm.commit(0, p, 10)
    for child in (1, 2, 3):
        bm.fork(0, child)
    t0 = bm.table(0)
    assert [bm.ref_count(b) for b in t0] == [4, 4, 4]
    assert bm.num_used == 3
    # Each sample writes token 10 (into the shared partial block): the first three copy it, the last writes
    # in place. The full blocks stay shared.
    copies = [bm.append(t, 10, 11) for t in (1, 2, 3, 0)]
    assert [len(c) for c in copies] == [1, 1, 1, 0]
    assert all(c[0][0] == t0[2] for c in copies[:3])
    dsts = {c[0][1] for c in copies[:3]}
    assert len(dsts) == 3 and t0[2] not in dsts
    assert bm.table(0) == t0  # the last writer kept the original
    for t in (1, 2, 3):
        assert bm.table(t)[:2] == t0[:2] and bm.table(t)[2] in dsts
    assert [bm.ref_count(b) for b in t0] == [4, 4, 1]
    assert bm.num_used == 2 + 4
    check_invariants(bm, [0, 1, 2, 3])
    # Writes after that go to private blocks: no more copies.
    assert all(bm.append(t, 11, 12) == [] for t in (0, 1, 2, 3))
    for t in (0, 1, 2, 3):
        bm.free(t)
    assert bm.num_used == 0 and bm.num_cached == 2


def test_fork_without_partial_block_needs_no_copy():
    bm = _engine.testing.BlockManager(8, BS)
    p = toks(8)
    bm.allocate(0, p, 8)
    bm.commit(0, p, 8)
    bm.fork(0, 1)
    assert bm.append(0, 8, 9) == [] and bm.append(1, 8, 9) == []
    assert bm.table(0)[2] != bm.table(1)[2]
    check_invariants(bm, [0, 1])


def test_copy_on_write_is_all_or_nothing():
    bm = _engine.testing.BlockManager(3, BS)
    p = toks(6)
    bm.allocate(0, p, 6)
    bm.fork(0, 1)
    bm.allocate_block()  # the last free block
    assert bm.append(1, 6, 7) is None  # the copy does not fit
    assert bm.table(1) == bm.table(0)
    assert [bm.ref_count(b) for b in bm.table(0)] == [2, 2]


def test_random_verbs_keep_invariants():
    rng = random.Random(3)
    bm = _engine.testing.BlockManager(40, BS)
    tables, state, nxt = [], {}, 0
    prefixes = [toks(rng.randrange(4, 30), 1000 * k) for k in range(4)]
    for _ in range(2000):
        r = rng.random()
        if r < 0.3 or not tables:
            base = rng.choice(prefixes)
            tokens = base[: rng.randrange(1, len(base) + 1)] + [rng.randrange(50) for _ in range(rng.randrange(3))]
            hit = bm.allocate(nxt, tokens, len(tokens))
            if hit >= 0:
                assert hit % BS == 0 and hit < len(tokens)
                bm.commit(nxt, tokens, len(tokens))
                tables.append(nxt)
                state[nxt] = tokens
            nxt += 1
        elif r < 0.5:
            src = rng.choice(tables)
            bm.fork(src, nxt)
            tables.append(nxt)
            state[nxt] = list(state[src])
            nxt += 1
        elif r < 0.8:
            t = rng.choice(tables)
            n0 = len(state[t])
            extra = [rng.randrange(50) for _ in range(rng.randrange(1, 6))]
            if bm.append(t, n0, n0 + len(extra)) is not None:
                state[t] += extra
                bm.commit(t, state[t], len(state[t]))
        else:
            t = tables.pop(rng.randrange(len(tables)))
            bm.free(t)
            del state[t]
        check_invariants(bm, tables)
    for t in tables:
        bm.free(t)
    assert bm.num_used == 0 and bm.num_free == 40
    assert bm.hit_tokens > 0
