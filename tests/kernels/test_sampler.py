"""The sampler (csrc/sampling/sampler.cpp) through pyserve._engine.testing.Sampler, on hand-built logits.

Every random draw uses a fixed seed, so these tests are deterministic; the statistical bounds are loose enough
that a correct sampler passes them for any seed, and tight enough that a wrong distribution does not.
"""

import math

import numpy as np
import pytest

from pyserve import _engine

Sampler = _engine.testing.Sampler


def log_softmax(logits):
    x = np.asarray(logits, dtype=np.float64)
    m = x.max()
    return x - m - math.log(np.exp(x - m).sum())


def draw(n_vocab, logits, n, **params):
    s = Sampler(n_vocab, **params)
    row = np.asarray(logits, dtype=np.float32)
    return np.array([s.sample(row)[0] for _ in range(n)])


def kept_prefix(logits, temperature=1.0, top_k=0, top_p=1.0, min_p=0.0):
    """Reference support: ids kept by top-k → top-p → min-p, in (logit desc, id asc) order."""
    x = np.asarray(logits, dtype=np.float64) / temperature
    order = np.lexsort((np.arange(len(x)), -x))  # value desc, id asc
    p = np.exp(x[order] - x.max())
    keep = len(x) if top_k <= 0 else min(top_k, len(x))
    if top_p < 1.0:
        cum = np.cumsum(p[:keep])
        keep = int(np.searchsorted(cum, top_p * cum[-1]) + 1)  # first prefix with mass >= top_p
    keep = min(keep, int(np.sum(p[:keep] >= min_p * p[0])))
    return order[:keep]


def check_frequencies(tokens, logits, support, temperature=1.0):
    """Drawn set == support, and counts match the renormalised distribution (chi-square, generous bound)."""
    assert set(tokens.tolist()) == set(support.tolist())
    x = np.asarray(logits, dtype=np.float64)[support] / temperature
    p = np.exp(x - x.max())
    expected = p / p.sum() * len(tokens)
    observed = np.array([(tokens == t).sum() for t in support])
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    df = max(len(support) - 1, 1)
    assert chi2 < df + 8 * math.sqrt(2 * df) + 10, (chi2, df)


# ---- greedy ----

def test_greedy_is_argmax_ties_to_lowest_id():
    logits = np.array([0.5, 3.0, -1.0, 3.0, 2.9], dtype=np.float32)
    tok, lp, top = Sampler(5, temperature=0.0).sample(logits)
    assert tok == 1
    assert top == []
    rng = np.random.default_rng(1)
    s = Sampler(1000, temperature=0.0)
    for _ in range(20):
        row = rng.standard_normal(1000).astype(np.float32)
        assert s.sample(row)[0] == int(np.argmax(row))


def test_tiny_temperature_is_greedy():
    logits = np.array([1.0, 1.0 - 1e-6, 0.0], dtype=np.float32)  # vLLM: temperature < 1e-5 samples greedily
    assert set(draw(3, logits, 50, temperature=1e-6, seed=0).tolist()) == {0}


def test_greedy_ignores_nan():
    logits = np.array([1.0, np.nan, 2.0, np.nan], dtype=np.float32)
    assert Sampler(4, temperature=0.0).sample(logits)[0] == 2
    assert set(draw(4, logits, 200, temperature=1.0, seed=0).tolist()) == {0, 2}


def test_top_k_1_is_greedy():
    rng = np.random.default_rng(2)
    s = Sampler(300, temperature=1.5, top_k=1, seed=3)
    for _ in range(20):
        row = rng.standard_normal(300).astype(np.float32)
        assert s.sample(row)[0] == int(np.argmax(row))
    tied = np.array([1.0, 4.0, 4.0, 0.0], dtype=np.float32)
    assert Sampler(4, temperature=1.0, top_k=1, seed=0).sample(tied)[0] == 1


# ---- logit bias and penalties ----

def test_logit_bias_forces_and_bans():
    logits = np.array([5.0, 1.0, 0.0, -2.0], dtype=np.float32)
    assert Sampler(4, temperature=0.0, logit_bias={3: 100.0}).sample(logits)[0] == 3
    assert Sampler(4, temperature=0.0, logit_bias={0: -100.0}).sample(logits)[0] == 1
    banned = draw(4, logits, 300, temperature=1.0, seed=1, logit_bias={0: -math.inf, 1: -math.inf})
    assert set(banned.tolist()) == {2, 3}


def test_repetition_penalty_prompt_and_output():
    pos = np.array([2.0, 1.9, 0.0], dtype=np.float32)
    s = Sampler(3, temperature=0.0, repetition_penalty=1.2)
    s.set_prompt([0, 0, 2])
    assert s.sample(pos)[0] == 1  # 2.0 / 1.2 < 1.9
    neg = np.array([-1.0, -1.1, -5.0], dtype=np.float32)
    s = Sampler(3, temperature=0.0, repetition_penalty=1.2)
    s.set_prompt([0])
    assert s.sample(neg)[0] == 1  # -1.0 * 1.2 < -1.1
    s = Sampler(3, temperature=0.0, repetition_penalty=1.2)  # no prompt: the output counts
    assert [s.sample(pos)[0] for _ in range(2)] == [0, 1]
    s = Sampler(3, temperature=0.0, repetition_penalty=1.2)  # once per token, however often it occurs
    s.set_prompt([0] * 10)
    assert s.sample(np.array([2.0, 1.6, 0.0], dtype=np.float32))[0] == 0  # 2.0 / 1.2 > 1.6


def test_presence_penalty_output_only():
    logits = np.array([2.0, 1.9, 0.0], dtype=np.float32)
    s = Sampler(3, temperature=0.0, presence_penalty=0.5)
    s.set_prompt([0])  # the prompt is not penalised
    # 0; then 0 is penalised (1.5 < 1.9); then both are (1.5 > 1.4), and stay so
    assert [s.sample(logits)[0] for _ in range(4)] == [0, 1, 0, 0]


def test_frequency_penalty_counts():
    logits = np.array([2.0, 1.75, 0.0], dtype=np.float32)
    s = Sampler(3, temperature=0.0, frequency_penalty=0.1)
    # 0 is drawn while 2.0 - 0.1·count > 1.75 - 0.1·count(1)
    assert [s.sample(logits)[0] for _ in range(4)] == [0, 0, 0, 1]
    s = Sampler(3, temperature=0.0, presence_penalty=0.1)  # flat: only the first occurrence counts
    assert [s.sample(logits)[0] for _ in range(4)] == [0, 0, 0, 0]


def test_set_prompt_replaces():
    logits = np.array([2.0, 1.9, 0.0], dtype=np.float32)
    s = Sampler(3, temperature=0.0, repetition_penalty=1.5)
    s.set_prompt([0])
    s.set_prompt([2])
    assert s.sample(logits)[0] == 0


# ---- truncation: support and frequencies ----

SMALL = np.array([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -3.0], dtype=np.float32)
PERM = np.array([5, 2, 7, 0, 3, 6, 1, 4])  # ids shuffled so order isn't id order
SMALL_P = SMALL[np.argsort(PERM)]


@pytest.mark.parametrize("params", [
    dict(temperature=1.0),
    dict(temperature=0.7, top_k=3),
    dict(temperature=1.0, top_p=0.8),
    dict(temperature=1.3, top_p=0.5),
    dict(temperature=1.0, min_p=0.2),
    dict(temperature=1.0, top_k=5, top_p=0.9),
    dict(temperature=2.0, top_k=6, top_p=0.95, min_p=0.3),
])
def test_support_and_frequencies(params):
    support = kept_prefix(SMALL_P, **params)
    tokens = draw(8, SMALL_P, 20000, seed=11, **params)
    check_frequencies(tokens, SMALL_P, support, params["temperature"])


def test_top_p_is_relative_to_top_k():
    logits = np.log(np.array([0.4, 0.3, 0.2, 0.1], dtype=np.float64)).astype(np.float32)
    # top_k=2 leaves (0.4, 0.3) → 0.571, 0.429; top_p=0.5 keeps only the first
    assert set(draw(4, logits, 300, seed=0, top_k=2, top_p=0.5).tolist()) == {0}
    # without top_k, 0.4 < 0.5: two tokens
    assert set(draw(4, logits, 300, seed=0, top_p=0.5).tolist()) == {0, 1}


def test_top_p_ties_keep_lowest_ids():
    flat = np.zeros(1000, dtype=np.float32)
    tokens = draw(1000, flat, 3000, seed=5, top_p=0.25)  # exactly 250 of equal mass
    assert tokens.max() == 249 and tokens.min() == 0 and len(set(tokens.tolist())) > 240


def _near_flat(n, seed):
    rng = np.random.default_rng(seed)
    return (rng.permutation(n) * (-1.0 / n)).astype(np.float32)  # distinct, within 1 of each other


@pytest.mark.parametrize("n_vocab", [2000, 20000])
def test_large_top_p_exact_cut(n_vocab):
    """Kept sets beyond the first 256 candidates (the counting refinement); the cut falls mid-way between two
    tokens' cumulative masses, so rounding can't move it."""
    logits = _near_flat(n_vocab, 0)
    x = np.sort(logits.astype(np.float64))[::-1]
    cum = np.cumsum(np.exp(x - x[0]))
    top_p = float((cum[299] + cum[300]) / 2 / cum[-1])  # keeps 301
    support = kept_prefix(logits, top_p=top_p)
    assert len(support) == 301
    tokens = draw(n_vocab, logits, 4000, seed=2, top_p=top_p)
    assert set(tokens.tolist()) == set(support.tolist())


@pytest.mark.parametrize("n_vocab", [2000, 20000])
def test_large_top_k_exact_cut(n_vocab):
    logits = _near_flat(n_vocab, 1)
    support = kept_prefix(logits, top_k=300)
    tokens = draw(n_vocab, logits, 4000, seed=3, top_k=300)
    assert set(tokens.tolist()) == set(support.tolist())


def test_large_top_k_ties():
    tokens = draw(5000, np.zeros(5000, dtype=np.float32), 4000, seed=4, top_k=300)
    assert set(tokens.tolist()) == set(range(300))


def test_top_k_beyond_finite_logits():
    logits = np.full(1000, -np.inf, dtype=np.float32)
    logits[[10, 500, 999]] = [0.0, 1.0, 2.0]
    assert set(draw(1000, logits, 500, seed=0, top_k=400).tolist()) == {10, 500, 999}
    assert set(draw(1000, logits, 500, seed=0, top_p=0.9999).tolist()) == {10, 500, 999}


def test_default_vocab_size_smoke():
    n = 262144
    rng = np.random.default_rng(0)
    row = (rng.standard_normal(n) * 3).astype(np.float32)
    s = Sampler(n, temperature=0.8, top_p=0.9, top_k=0, seed=1, logprobs=3)
    support = set(kept_prefix(row, temperature=0.8, top_p=0.9).tolist())
    for _ in range(5):
        tok, lp, top = s.sample(row)
        assert tok in support
    assert [t for t, _ in top] == np.argsort(-row, kind="stable")[:3].tolist()
    assert Sampler(n, temperature=0.0).sample(row)[0] == int(np.argmax(row))


# ---- seeds ----

def test_seed_reproducible_and_distinct():
    logits = np.zeros(100, dtype=np.float32)
    a = draw(100, logits, 50, seed=42).tolist()
    assert a == draw(100, logits, 50, seed=42).tolist()
    assert a != draw(100, logits, 50, seed=43).tolist()
    assert len(set(draw(100, logits, 50).tolist())) > 1  # seed None: random_device
    # the same seed over a changing logits sequence
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((20, 500)).astype(np.float32)
    s1, s2 = Sampler(500, seed=7, top_p=0.9), Sampler(500, seed=7, top_p=0.9)
    assert [s1.sample(r)[0] for r in rows] == [s2.sample(r)[0] for r in rows]


# ---- log-probabilities: always of the raw logits ----

@pytest.mark.parametrize("params", [
    dict(temperature=0.0),
    dict(temperature=1.0),
    dict(temperature=0.3, top_k=5, top_p=0.7, min_p=0.1),
    dict(temperature=1.7, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.7,
         logit_bias={3: 5.0, 7: -2.0}),
])
def test_logprobs_are_raw_log_softmax(params):
    rng = np.random.default_rng(9)
    s = Sampler(1000, seed=0, logprobs=7, **params)
    s.set_prompt([3, 4, 5])
    for _ in range(5):
        row = (rng.standard_normal(1000) * 4).astype(np.float32)
        ref = log_softmax(row)
        tok, lp, top = s.sample(row)
        assert abs(lp - ref[tok]) < 1e-4
        ids = [t for t, _ in top]
        assert ids == np.argsort(-ref, kind="stable")[:7].tolist()
        assert np.allclose([v for _, v in top], ref[ids], atol=1e-4)


def test_logprobs_top_ties_and_counts():
    row = np.array([1.0, 3.0, 1.0, 3.0, 2.0], dtype=np.float32)
    ref = log_softmax(row)
    tok, lp, top = Sampler(5, temperature=0.0, logprobs=5).sample(row)
    assert [t for t, _ in top] == [1, 3, 4, 0, 2]
    assert abs(lp - ref[1]) < 1e-6
    assert Sampler(5, temperature=0.0, logprobs=0).sample(row)[2] == []
    assert Sampler(5, temperature=0.0, logprobs=None).sample(row)[2] == []
    assert len(Sampler(5, temperature=0.0, logprobs=2).sample(row)[2]) == 2


def test_logprobs_extreme_logits():
    row = np.array([1000.0, 0.0, -1000.0, -np.inf], dtype=np.float32)
    tok, lp, top = Sampler(4, temperature=1.0, seed=0, logprobs=4).sample(row)
    assert tok == 0 and abs(lp) < 1e-6
    assert [t for t, _ in top] == [0, 1, 2, 3]
    assert abs(top[1][1] + 1000.0) < 1e-3 and top[3][1] == -math.inf


# ---- validation ----

@pytest.mark.parametrize("params, name", [
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=math.nan), "temperature"),
    (dict(top_k=-2), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.01), "top_p"),
    (dict(min_p=-0.01), "min_p"),
    (dict(min_p=1.5), "min_p"),
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(presence_penalty=2.5), "presence_penalty"),
    (dict(frequency_penalty=-2.5), "frequency_penalty"),
    (dict(logprobs=11), "logprobs"),
    (dict(logit_bias={10: 1.0}), "logit_bias"),
    (dict(logit_bias={-1: 1.0}), "logit_bias"),
    (dict(logit_bias={1: math.nan}), "logit_bias"),
    (dict(bogus=1), "bogus"),
])
def test_validation(params, name):
    with pytest.raises(ValueError, match=name):
        Sampler(10, **params)


def test_validation_values_named():
    with pytest.raises(ValueError, match=r"top_p.*1\.5"):
        Sampler(10, top_p=1.5)
    with pytest.raises(ValueError, match="n_vocab"):
        Sampler(0)
    s = Sampler(10, repetition_penalty=1.1)
    with pytest.raises(ValueError, match="prompt"):
        s.set_prompt([1, 10])
    with pytest.raises(ValueError):
        s.sample(np.zeros(9, dtype=np.float32))
    Sampler(10, top_k=-1, top_p=1.0, min_p=1.0, logprobs=10, presence_penalty=-2.0)  # edges are fine
