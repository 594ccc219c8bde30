"""The packed-weights cache (csrc/gguf/packed_file.h, pyserve/engine/weights_cache.py): a load that maps the packed
weights a past load wrote gives the same tokens and logprobs, bit for bit, as one that packs them; a file that
does not fit the model (damaged, another model's, another layout) is not used, and is written again; the
folder keeps the entries used last."""
from __future__ import annotations

import shutil

import pytest

from pyserve import LLM, SamplingParams, _engine
from pyserve.engine import weights_cache
from pyserve.engine.user_cache import ENV
from support import model_factory as tm

GREEDY = SamplingParams(temperature=0.0, max_tokens=12, logprobs=3, seed=0)
PROMPTS = ["The quick brown fox", "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20"]
# packable types in every role: experts (qwen35moe), a tied and an untied head, K-quants and legacy ones
MODELS = [("llama", dict(qtype="Q4_K", tied=False)), ("gemma3", dict(qtype="Q8_0")),
          ("qwen35moe", dict(qtype="Q4_K")), ("qwen3", dict(qtype="Q5_0"))]


@pytest.fixture
def cache(monkeypatch, tmp_path):
    """A cache folder of this test's own, and every model big enough to be kept in it."""
    monkeypatch.setenv(ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(weights_cache, "MIN_BYTES", 0)
    return tmp_path / "cache" / "weights"


WRITTEN = "packed, writing the cache"  # weights_cache.keep_in_background


def _run(path) -> tuple[str, list]:
    llm = LLM(str(path), n_threads=2)
    outs = [o.outputs[0] for o in llm.generate(PROMPTS, GREEDY)]
    weights_cache.wait_writes()
    return llm.weights_source, [(o.token_ids, o.logprobs) for o in outs]


@pytest.mark.parametrize("arch,kw", MODELS, ids=[a for a, _ in MODELS])
def test_mapped_equals_packed(arch, kw, cache, tmp_path):
    path = tm.write_test_model(tmp_path / f"{arch}.gguf", arch, **kw)
    first, second = _run(path), _run(path)
    assert (first[0], second[0]) == (WRITTEN, "mapped")
    assert second[1] == first[1]
    assert len(list(cache.glob("*.packed"))) == 1


def test_engine_save_and_map(tmp_path):
    """The engine's own verbs: save_packed_weights, then packed_weights= maps it; a file of another model's
    weights, or of another layout, is packed over instead."""
    a = str(tm.write_test_model(tmp_path / "a.gguf", "llama", qtype="Q4_K"))
    b = str(tm.write_test_model(tmp_path / "b.gguf", "llama", qtype="Q4_K", n_ff=768))
    packed = tmp_path / "a.packed"
    e = _engine.Engine(a, calibrate=False, n_threads=1)
    assert not e.packed_from_file and e.packed_bytes > 0
    e.save_packed_weights(str(packed))
    assert _engine.Engine(a, calibrate=False, packed_weights=str(packed), n_threads=1).packed_from_file
    assert not _engine.Engine(b, calibrate=False, packed_weights=str(packed), n_threads=1).packed_from_file
    data = bytearray(packed.read_bytes())
    data[16:24] = b"packed/0"  # the header's layout: another build's
    packed.write_bytes(bytes(data))
    assert not _engine.Engine(a, calibrate=False, packed_weights=str(packed), n_threads=1).packed_from_file
    assert not _engine.Engine(a, calibrate=False, packed_weights=str(tmp_path / "none"), n_threads=1).packed_from_file
    with pytest.raises(RuntimeError, match="no-such-folder"):
        e.save_packed_weights(str(tmp_path / "no-such-folder" / "x.packed"))


@pytest.mark.parametrize("damage", ["truncated", "another model's", "empty"])
def test_entry_that_does_not_fit_is_written_again(damage, cache, tmp_path):
    path = tm.write_test_model(tmp_path / "m.gguf", "llama", qtype="Q4_K")
    fresh = _run(path)
    (entry,) = cache.glob("*.packed")
    if damage == "truncated":
        entry.write_bytes(entry.read_bytes()[:-4096])
    elif damage == "empty":
        entry.write_bytes(b"")
    else:
        other = tm.write_test_model(tmp_path / "o.gguf", "llama", qtype="Q4_K", n_layer=3)
        _run(other)
        shutil.copy(next(p for p in cache.glob("*.packed") if p != entry), entry)
    again = _run(path)
    assert again[0] == WRITTEN and again[1] == fresh[1]
    assert _run(path) == ("mapped", fresh[1])


def test_changed_file_misses(cache, tmp_path):
    path = tm.write_test_model(tmp_path / "m.gguf", "llama", qtype="Q4_K")
    assert _run(path)[0] == WRITTEN
    tm.write_test_model(path, "llama", qtype="Q4_K", seed=1)  # the same name, other weights
    changed = _run(path)
    assert changed[0] == WRITTEN and changed[1] == _run(path)[1]


def test_folder_keeps_the_entries_used_last(cache, tmp_path, monkeypatch):
    monkeypatch.setattr(weights_cache, "MAX_ENTRIES", 2)
    paths = [tm.write_test_model(tmp_path / f"m{i}.gguf", "llama", qtype="Q4_K", seed=i) for i in range(3)]
    assert [_run(p)[0] for p in paths[:2]] == [WRITTEN, WRITTEN]
    assert _run(paths[0])[0] == "mapped"  # used last: m1's entry is now the oldest
    assert _run(paths[2])[0] == WRITTEN  # and goes
    assert len(list(cache.glob("*.packed"))) == 2
    # m0 mapped (used last), m1 written again (m2's entry, now the oldest, goes), m2 written again
    assert [_run(p)[0] for p in paths] == ["mapped", WRITTEN, WRITTEN]


def test_small_models_and_no_cache_are_packed(monkeypatch, tmp_path):
    path = tm.write_test_model(tmp_path / "m.gguf", "llama", qtype="Q4_K")
    monkeypatch.setenv(ENV, str(tmp_path / "cache"))
    assert _run(path)[0] == "packed" and not (tmp_path / "cache" / "weights").exists()  # under MIN_BYTES
    monkeypatch.setenv(ENV, "off")
    monkeypatch.setattr(weights_cache, "MIN_BYTES", 0)
    assert _run(path)[0] == "packed"
