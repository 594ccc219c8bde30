"""Hybrid models (Qwen3.5: Gated DeltaNet layers between full-attention ones; LFM2: gated short convs between
attention ones) in the engine: the recurrent state as a resource (a slot per running sequence, freed on finish, abort and preemption, copied on an n > 1 fork),
chunked prefill and batching giving the same tokens, prefix caching through state checkpoints at block
boundaries (a restored run's tokens and logprobs a cold run's), and a control that must differ (a file with one
feature changed). Speculative decoding on them: test_hybrid_spec.py."""
from __future__ import annotations

import numpy as np
import pytest

from pyserve import _engine
from pyserve.engine.options import EngineOptions
from support import model_factory as tm
from support import numpy_ref as nr

GREEDY = {"temperature": 0.0}


def _tokens(n: int, seed: int) -> list[int]:
    _, _, _, bos, _ = tm.tokenizer_vocab()
    rng = np.random.default_rng(seed)
    return [bos] + [int(t) for t in rng.integers(0, bos, n - 1)]


HYBRIDS = tm.hybrid.ARCHS + tm.lfm2.ARCHS
# one slot's state bytes: qwen35's 3 DeltaNet layers (conv taps - 1 over the conv channels, then the matrices),
# lfm2's 3 conv layers (L_cache - 1 over n_embd)
SLOT_BYTES = {"qwen35": 3 * 4 * (3 * 128 + 4 * 16 * 16), "lfm2": 3 * 4 * (2 * 64)}


@pytest.fixture(scope="module", params=HYBRIDS)
def path(tmp_path_factory, request):
    return tm.write_test_model(tmp_path_factory.mktemp("hybrid") / f"{request.param}.gguf", request.param, qtype="F32")


def run(eng, requests: dict, max_tokens: int = 8, n: int = 1, watch=None, logprobs: bool = False) -> dict:
    """Adds {id: prompt} and steps until all end -> {(id, index): tokens} (logprobs: [(token, logprob, top)])."""
    for rid, prompt in requests.items():
        eng.add(rid, prompt, {**GREEDY, "logprobs": 3} if logprobs else GREEDY, max_tokens, True, n=n)
    out: dict = {}
    while eng.has_work():
        for o in eng.step():
            toks = out.setdefault((o.request_id, o.index), [])
            if o.token >= 0:
                toks.append((o.token, o.logprob, tuple(o.top)) if logprobs else o.token)
        if watch is not None:
            watch(eng.stats())
    return out


def test_long_prompt_in_many_chunks_matches_the_reference(path):
    """A 150-token prompt cut into chunks of 16 (the state carried across ten steps), then greedy decoding:
    every generated token is the reference's argmax over the whole text (its top-2 gap is far over f32 noise)."""
    eng = _engine.Engine(str(path), n_threads=1, max_num_batched_tokens=16, block_size=4)
    prompt = _tokens(150, 11)
    gen = run(eng, {"a": prompt}, max_tokens=6)[("a", 0)]
    text = prompt + gen
    ref = nr.ref_logits(path, text[:-1], rows=range(len(prompt) - 1, len(text) - 1))
    assert ref.argmax(axis=1).tolist() == gen
    srt = np.sort(ref, axis=1)
    assert (srt[:, -1] - srt[:, -2]).min() > 0.01
    # and the chunked scheduler's prompt equals one prefill's logits (prompt_logits: the whole prompt at once)
    whole = eng.prompt_logits(prompt)
    np.testing.assert_allclose(whole, nr.ref_logits(path, prompt), atol=0.01)


def test_batched_chunked_and_alone_give_the_same_tokens(path):
    prompts = {f"r{i}": _tokens(9 + 13 * i, 20 + i) for i in range(4)}
    alone = {}
    for rid, p in prompts.items():
        alone.update(run(_engine.Engine(str(path), n_threads=1), {rid: p}))
    batched = run(_engine.Engine(str(path), n_threads=2, max_num_batched_tokens=7, block_size=4), prompts)
    assert batched == alone


def test_state_slots_are_taken_and_freed(path):
    eng = _engine.Engine(str(path), n_threads=1, max_num_seqs=3)
    s = eng.stats()
    assert (s["state_slots_total"], s["state_slots_used"]) == (3, 0)
    assert s["state_slot_bytes"] == SLOT_BYTES[eng.hparams["arch"].removesuffix("moe")]
    peak = []
    out = run(eng, {f"r{i}": _tokens(10, 40 + i) for i in range(5)}, watch=lambda st: peak.append(st["state_slots_used"]))
    assert len(out) == 5 and all(len(t) == 8 for t in out.values())
    assert max(peak) == 3  # five requests through three slots: the last two waited for a free one
    assert eng.stats()["state_slots_used"] == 0


def test_abort_frees_the_slot(path):
    eng = _engine.Engine(str(path), n_threads=1, max_num_seqs=2)
    eng.add("x", _tokens(12, 50), GREEDY, 100, True)
    eng.add("y", _tokens(12, 51), GREEDY, 4, True, n=2)
    eng.step()
    assert eng.stats()["state_slots_used"] == 1  # y's two samples (two seats, two slots) wait beside x
    eng.abort("x")
    eng.step()
    assert eng.stats()["state_slots_used"] == 2  # x's slot freed: y holds a slot per sample
    while eng.has_work():
        eng.step()
    assert eng.stats()["state_slots_used"] == 0


def test_n2_fork_copies_the_state(path):
    """Greedy n=2: both samples are the n=1 continuation (each decodes from its own copy of the prompt's state)."""
    prompt = _tokens(23, 60)
    one = run(_engine.Engine(str(path), n_threads=1), {"a": prompt}, max_tokens=10)[("a", 0)]
    eng = _engine.Engine(str(path), n_threads=1)
    two = run(eng, {"a": prompt}, max_tokens=10, n=2)
    assert two == {("a", 0): one, ("a", 1): one}
    assert eng.stats()["state_slots_used"] == 0


def test_preemption_recomputes_from_a_fresh_state(path):
    """KV blocks for about two sequences: later ones preempt and recompute, the tokens unchanged."""
    prompts = {f"p{i}": _tokens(20, 70 + i) for i in range(4)}
    alone = {}
    for rid, p in prompts.items():
        alone.update(run(_engine.Engine(str(path), n_threads=1), {rid: p}, max_tokens=12))
    eng = _engine.Engine(str(path), n_threads=1, block_size=4, num_kv_blocks=18)
    assert run(eng, prompts, max_tokens=12) == alone
    assert eng.stats()["preemptions"] > 0
    assert eng.stats()["state_slots_used"] == 0


def _prompt_steps(eng, prompt: list) -> int:
    """Steps until the prompt's first token is drawn."""
    eng.add("p", prompt, GREEDY, 1, True)
    steps = 0
    while eng.has_work():
        eng.step()
        steps += 1
    return steps


@pytest.mark.parametrize("max_num_seqs", [4, 1])
def test_a_repeated_prompt_resumes_from_a_state_checkpoint(path, max_num_seqs):
    """The first run's prompt checkpoints its state at its last full block (36 of 40 tokens); the same prompt
    again resumes there: 36 tokens hit, the same tokens. With a state slot free the checkpoint is copied within
    the prompt's one step; with none (one sequence, one slot) the chunk stops at the boundary: two steps."""
    eng = _engine.Engine(str(path), n_threads=1, block_size=4, max_num_seqs=max_num_seqs)
    prompt = _tokens(40, 80)
    assert _prompt_steps(eng, prompt) == (1 if max_num_seqs > 1 else 2)
    assert eng.stats()["state_checkpoints"] == 2 and eng.stats()["state_slots_used"] == 0  # at 36 and 40
    first = run(_engine.Engine(str(path), n_threads=1, block_size=4), {"a": prompt})
    second = run(eng, {"a": prompt})
    s = eng.stats()
    assert first == second and (s["prefix_cache_hits"], s["state_checkpoint_restores"]) == (36, 1)


def test_a_checkpoint_is_its_cache_salts_own(path):
    """A state checkpoint is saved under its request's cache salt: the same prompt under another salt finds
    neither the blocks nor the state (computed whole), under the same salt it resumes; the tokens are the same."""
    eng = _engine.Engine(str(path), n_threads=1, block_size=4)
    prompt = _tokens(40, 80)
    got = []
    for rid, salt in (("a", "x"), ("b", "y"), ("c", "x")):
        eng.add(rid, prompt, GREEDY, 4, True, cache_salt=salt)
        toks = []
        while eng.has_work():
            toks += [o.token for o in eng.step() if o.token >= 0]
        s = eng.stats()
        got.append((toks, s["prefix_cache_hits"], s["state_checkpoint_restores"]))
    assert [g[1:] for g in got] == [(0, 0), (0, 0), (36, 1)]
    assert got[0][0] == got[1][0] == got[2][0] and len(got[0][0]) == 4


def test_a_checkpoint_within_a_chunk_is_a_boundary_steps_state(path):
    """The state copied mid-chunk at a prompt's last full block is bit for bit the state a chunk ending there
    leaves: a run restored from each gives the same tokens and logprobs."""
    prompt = _tokens(40, 84)
    out = []
    for chunk in (64, 36):  # one chunk over the boundary; a chunk that ends on it
        eng = _engine.Engine(str(path), n_threads=1, block_size=4, max_num_batched_tokens=chunk)
        run(eng, {"a": prompt[:39] + [prompt[7]]})
        out.append(run(eng, {"b": prompt}, max_tokens=6, logprobs=True))
        assert eng.stats()["state_checkpoint_restores"] == 1 and eng.stats()["prefix_cache_hits"] == 36
    assert out[0] == out[1]


def test_a_checkpoint_restore_gives_a_cold_runs_logprobs(path):
    """Restored from the checkpoint after 36 tokens, the continuation's tokens and logprobs (the top 3 too) are
    bit for bit those of an engine without prefix caching (the state restored is the state computed)."""
    eng = _engine.Engine(str(path), n_threads=1, block_size=4)
    prompt = _tokens(40, 83)
    run(eng, {"a": prompt[:38] + [prompt[5]]})  # another tail: its blocks and checkpoints cover prompt[:36]
    warm = run(eng, {"b": prompt}, max_tokens=10, logprobs=True)
    assert eng.stats()["state_checkpoint_restores"] == 1 and eng.stats()["prefix_cache_hits"] == 36
    cold = run(_engine.Engine(str(path), n_threads=1, enable_prefix_caching=False), {"b": prompt}, max_tokens=10,
               logprobs=True)
    assert warm == cold and len(warm[("b", 0)]) == 10


def test_a_second_turn_resumes_past_the_first_turns_text(path):
    """Turn 2 = turn 1's prompt and answer and more: the hit reaches into the answer (decode steps checkpoint
    every block boundary), and the tokens are a fresh engine's."""
    eng = _engine.Engine(str(path), n_threads=1, block_size=4)
    turn1 = _tokens(30, 81)
    answer = run(eng, {"t1": turn1}, max_tokens=12)[("t1", 0)]
    turn2 = turn1 + answer + _tokens(9, 82)[1:]
    before = eng.stats()["prefix_cache_hits"]
    got = run(eng, {"t2": turn2})
    assert eng.stats()["prefix_cache_hits"] - before >= len(turn1) + 4
    assert got == run(_engine.Engine(str(path), n_threads=1, enable_prefix_caching=False), {"t2": turn2})


def test_without_prefix_caching_nothing_is_checkpointed(path):
    eng = _engine.Engine(str(path), n_threads=1, block_size=4, enable_prefix_caching=False)
    prompt = _tokens(40, 80)
    assert run(eng, {"a": prompt}) == run(eng, {"a": prompt})
    s = eng.stats()
    assert (s["state_checkpoints_total"], s["prefix_cache_hits"]) == (0, 0)


@pytest.mark.parametrize("speculative", [0, 7])
def test_kv_cache_memory_covers_the_state(path, speculative):
    """--kv-cache-memory holds the state's slots, its checkpoints and the KV blocks together; /metrics and
    /server_info report the state's bytes beside the KV pool's (engine stats: state_bytes, kv_cache_bytes)."""
    memory = 1 << 20
    opts = EngineOptions(kv_cache_memory=memory, block_size=4, max_num_seqs=8, speculative_ngram=speculative)
    geo = opts.kv_geometry(str(path))
    slot = SLOT_BYTES[_engine.Engine(str(path), n_threads=1).hparams["arch"].removesuffix("moe")]
    assert geo["state_slots"] == opts.max_num_seqs + (7 if speculative else 0)
    assert geo["state_bytes"] == (geo["state_slots"] + geo["state_checkpoints"]) * slot
    used = geo["state_bytes"] + geo["num_kv_blocks"] * geo["bytes_per_block"]
    assert memory - geo["bytes_per_block"] < used <= memory
    assert 0 < geo["state_checkpoints"] * slot <= geo["num_kv_blocks"] * geo["bytes_per_block"] / 4
    s = _engine.Engine(str(path), **opts.replace(n_threads=1).as_dict()).stats()
    assert (s["state_bytes"], s["kv_cache_bytes"]) == (geo["state_bytes"], geo["num_kv_blocks"] * geo["bytes_per_block"])


def test_too_little_memory_for_the_state_is_refused_by_name(path):
    with pytest.raises(ValueError, match=r"kv_cache_memory \(--kv-cache-memory\) of 4096 bytes does not hold the "
                                         r"recurrent state of 64 slots"):
        EngineOptions(kv_cache_memory=4096).kv_geometry(str(path))


def test_attention_only_models_hold_no_state(tmp_path):
    eng = _engine.Engine(str(tm.write_test_model(tmp_path / "q3.gguf", "qwen3")), n_threads=1)
    s = eng.stats()
    assert (s["state_slots_total"], s["state_checkpoints_total"]) == (0, 0)


CHANGES = [(a, c) for a in tm.hybrid.ARCHS for c in ({"full_attention_interval": 2}, {"ssm_groups": 4}, {"d_conv": 2})]
CHANGES += [(a, c) for a in tm.lfm2.ARCHS for c in ({"conv_flip": True}, {"l_cache": 4}, {"attn_layers": (1,)})]


@pytest.mark.parametrize("arch,change", CHANGES, ids=[f"{a}-{next(iter(c))}" for a, c in CHANGES])
def test_a_changed_feature_changes_the_logits(tmp_path, arch, change):
    """The control: the same seed with one recurrent feature changed (lfm2: each conv's taps reversed, a wider
    L_cache, the attention layer moved) must not match the original's reference (so the match above is no accident
    of features the engine could ignore)."""
    path = tm.write_test_model(tmp_path / "orig.gguf", arch, qtype="F32")
    other = tm.write_test_model(tmp_path / "other.gguf", arch, qtype="F32", **change)
    toks = _tokens(24, 1)
    got = _engine.Engine(str(other), n_threads=1).prompt_logits(toks)
    np.testing.assert_allclose(got, nr.ref_logits(other, toks), atol=0.01)  # the changed file is still right
    assert np.abs(got - nr.ref_logits(path, toks)).max() > 1.0
