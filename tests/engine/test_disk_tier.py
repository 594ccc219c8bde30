"""The KV cache's disk tier alone (kv/disk_tier.h: `_engine.testing.DiskTier`), over a temporary directory, with
blocks the test makes: entries survive a restart and are shared by two tiers on one directory; what fails its
checks (a flipped byte, a truncated file, another prefix under the same hash) is never served and is dropped;
the directory stays within its bound, least recently used first; a failed write is counted, never raised."""
import os
import random
import time

import pytest

from pyserve import _engine

BS, PAYLOAD, LAYOUT = 4, 1000, 0xABCDEF
FILE_BYTES = 56 + BS * 4 + PAYLOAD


def tier(path, max_bytes=1 << 30, layout=LAYOUT, **kw):
    return _engine.testing.DiskTier(str(path), max_bytes, layout, PAYLOAD, BS, **kw)


def block(seed):
    rng = random.Random(seed)
    return seed * 7919, seed * 31, [rng.randrange(1 << 20) for _ in range(BS)], bytes(rng.randrange(256)
                                                                                       for _ in range(PAYLOAD))


def entry_path(path, h, layout=LAYOUT):
    return path / f"{layout:016x}-{h:016x}.kvb"


def test_a_block_written_is_read_back_whole(tmp_path):
    t = tier(tmp_path)
    h, parent, toks, payload = block(1)
    assert t.get(h, parent, toks) is None and not t.contains(h)
    t.put(h, parent, toks, payload)
    assert t.contains(h)  # queued counts: a lookup need not wait for the disk
    assert t.get(h, parent, toks) == payload  # waits for its queued write
    s = t.stats()
    assert (s["hits"], s["misses"], s["writes"], s["entries"], s["bytes"]) == (1, 1, 1, 1, FILE_BYTES)
    assert entry_path(tmp_path, h).stat().st_size == FILE_BYTES
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_another_prefix_under_the_same_hash_is_never_served(tmp_path):
    t = tier(tmp_path)
    h, parent, toks, payload = block(2)
    t.put(h, parent, toks, payload)
    t.flush()
    assert t.get(h, parent + 1, toks) is None  # another parent: another prefix
    t.put(h, parent, toks, payload)
    t.flush()
    assert t.get(h, parent, [x + 1 for x in toks]) is None  # other tokens
    assert t.stats()["corrupt"] == 2 and not entry_path(tmp_path, h).exists()


@pytest.mark.parametrize("damage", ["flip", "truncate", "append"])
def test_a_damaged_entry_is_dropped_not_served(tmp_path, damage):
    t = tier(tmp_path)
    h, parent, toks, payload = block(3)
    t.put(h, parent, toks, payload)
    t.flush()
    p = entry_path(tmp_path, h)
    data = bytearray(p.read_bytes())
    if damage == "flip":
        data[-10] ^= 0x40
    p.write_bytes(data[:-1] if damage == "truncate" else data + b"x" if damage == "append" else data)
    assert t.get(h, parent, toks) is None
    assert t.stats()["corrupt"] == 1 and not p.exists() and t.stats()["entries"] == 0
    t.put(h, parent, toks, payload)  # recomputed and written again
    assert t.get(h, parent, toks) == payload


def test_entries_survive_a_restart_and_torn_files_do_not(tmp_path):
    t = tier(tmp_path)
    blocks = [block(s) for s in range(10, 14)]
    for h, parent, toks, payload in blocks:
        t.put(h, parent, toks, payload)
    t.close()  # writes what was queued
    torn = entry_path(tmp_path, 12345)
    torn.write_bytes(b"PSKVB01\0" + bytes(20))  # a writer killed before its rename leaves a .tmp, never this
    stale, fresh = tmp_path / f".{LAYOUT:016x}-1.9.0.tmp", tmp_path / f".{LAYOUT:016x}-2.9.1.tmp"
    stale.write_bytes(b"partial"), fresh.write_bytes(b"partial")
    old = time.time() - 2 * 3600
    os.utime(stale, (old, old))
    again = tier(tmp_path)
    assert again.stats()["entries"] == 4 and not torn.exists() and not stale.exists() and fresh.exists()
    assert [again.get(h, parent, toks) for h, parent, toks, _ in blocks] == [b[3] for b in blocks]


def test_two_tiers_on_one_directory_share_entries(tmp_path):
    a, b = tier(tmp_path), tier(tmp_path)
    h, parent, toks, payload = block(4)
    a.put(h, parent, toks, payload)
    a.flush()
    assert b.contains(h) and b.get(h, parent, toks) == payload
    b.put(h, parent, toks, payload)  # on disk already: not written twice
    b.flush()
    assert b.stats()["writes"] == 0


def test_another_layout_is_neither_read_nor_deleted(tmp_path):
    mine, other = tier(tmp_path), tier(tmp_path, layout=LAYOUT + 1)
    h, parent, toks, payload = block(5)
    other.put(h, parent, toks, payload)
    other.flush()
    assert not mine.contains(h) and mine.get(h, parent, toks) is None
    assert entry_path(tmp_path, h, LAYOUT + 1).exists() and tier(tmp_path).stats()["entries"] == 0


def test_the_directory_stays_within_its_bound_least_recently_used_first(tmp_path):
    t = tier(tmp_path, max_bytes=3 * FILE_BYTES)
    blocks = [block(s) for s in range(20, 25)]
    for i, (h, parent, toks, payload) in enumerate(blocks[:3]):
        t.put(h, parent, toks, payload)
        t.flush()
    assert t.get(*blocks[0][:3]) == blocks[0][3]  # used: the second is now the least recently used
    for h, parent, toks, payload in blocks[3:]:
        t.put(h, parent, toks, payload)
        t.flush()
    kept = sorted(p.name for p in tmp_path.iterdir())
    assert kept == sorted(entry_path(tmp_path, b[0]).name for b in (blocks[0], blocks[3], blocks[4]))
    s = t.stats()
    assert (s["entries"], s["bytes"], s["evicted"]) == (3, 3 * FILE_BYTES, 2)


def test_a_failed_write_is_counted_not_raised(tmp_path):
    d = tmp_path / "tier"
    t = tier(d)
    d.rmdir()
    d.write_text("not a directory any more")  # every write now fails, as on a full disk
    h, parent, toks, payload = block(6)
    t.put(h, parent, toks, payload)
    t.flush()
    assert t.stats()["write_errors"] == 1 and t.get(h, parent, toks) is None and not t.contains(h)


def test_a_full_queue_drops_writes(tmp_path):
    t = tier(tmp_path, max_queue_bytes=PAYLOAD)  # room for one block waiting
    puts = [block(s) for s in range(30, 40)]
    for h, parent, toks, payload in puts:
        t.put(h, parent, toks, payload)
    t.flush()
    s = t.stats()
    assert s["writes"] + s["dropped"] == 10 and s["writes"] >= 1


def test_bad_arguments_name_what_is_wrong(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValueError, match="kv cache dir .*file.*cannot create"):
        tier(tmp_path / "file")
    with pytest.raises(ValueError, match="max_bytes"):
        tier(tmp_path, max_bytes=0)
    t = tier(tmp_path)
    with pytest.raises(ValueError, match="block_size tokens"):
        t.put(1, 2, [1, 2], bytes(PAYLOAD))
