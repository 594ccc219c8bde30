"""Speculative decoding by prompt lookup, on the real model: the same outputs with it on and off, bit for bit —
tokens, text, logprobs and finish reasons — alone and batched, n > 1, stop strings and ids, max_tokens cut
inside a draft, penalties, seeded sampling and constrained requests; the prefix cache and the KV pool end the
same; sampling keeps its distribution (a chi-square test over different seeds on and off); drafts pay off
where text copies and stop where it does not or where the batch is full. The n-gram index against a
brute-force reference.

Why bit for bit: a row's logits do not depend on its batch (docs/design/kernels.md, "Batch invariance"), a
drafted row is verified by the sampler exactly as the decode that would follow it draws (same state, same
random draw), and a draft is accepted only while each draw equals it."""
from __future__ import annotations

import random

import numpy as np
import pytest

from pyserve import LLM, _engine
from pyserve.engine.sampling_params import SamplingParams
from pyserve.engine.structured import StructuredOutputsParams as S
from support.prompts import PROMPTS

K = 7

CODE = '''def mean(values):
    """The arithmetic mean of a non-empty list."""
    total = 0
    for v in values:
        total += v
    return total / len(values)


def variance(values):
    m = mean(values)
    return sum((v - m) ** 2 for v in values) / len(values)
'''
RECORD = "Name: Ada Lovelace\nBorn: 10 December 1815\nCity: London\nKnown for: the first computer program\n"
GROUNDED = [
    "Original code:\n```python\n" + CODE + "```\nThe same code with mean renamed to average:\n```python\n",
    "Record:\n" + RECORD + "\nThe record again, word for word:\n",
    "Text: The river Thames flows through London. The river Seine flows through Paris. The river Tiber "
    "flows through Rome.\nQuote the sentence about Paris: \"",
    "Settings:\nhost = localhost\nport = 8080\nworkers = 4\ntimeout = 30\n\nThe settings with port 9090:\nhost =",
]
ALL = GROUNDED + PROMPTS


@pytest.fixture(scope="module")
def on(model_path):
    """Speculation with every drafted row that fits taken: what is drafted depends on the tokens alone, not on
    the machine's timings, and every draft path is exercised."""
    return LLM(model_path, n_threads=2, speculative_ngram=K, speculative_price_drafts=False)


# The forward time of r rows (s), r = 0 … 8: the shape this machine measures for the default model (a floor
# that streams the weights, then ~3.5 ms a row), held fixed so the pricing's claims do not hang on timings.
ROW_COSTS = [0.0] + [1e-3 * (16 + 3.5 * (r - 1)) for r in range(1, 9)]


@pytest.fixture(scope="module")
def priced(model_path):
    """Speculation as served — drafted rows priced on their forward times — on a fixed cost model (ROW_COSTS)
    instead of the measured one: what is drafted depends on the tokens alone, on any machine, loaded or idle."""
    llm = LLM(model_path, n_threads=2, speculative_ngram=K)
    llm.engine.set_row_costs(ROW_COSTS)
    return llm


@pytest.fixture(scope="module")
def off(llm):
    assert llm.engine.config["speculative_ngram"] == 0
    return llm


def results(llm, prompts, params):
    """Every sample of every prompt: (token ids, text, logprobs, finish reason), in order."""
    outs = llm.generate(list(prompts), params)
    return [(c.token_ids, c.text, c.logprobs, c.finish_reason) for o in outs for c in o.outputs]


def spec_counts(llm) -> np.ndarray:
    s = llm.engine.stats()
    return np.array([s["spec_drafts"], s["spec_draft_tokens"], s["spec_accepted_tokens"]])


def assert_same(on, off, prompts, params):
    got, want = results(on, prompts, params), results(off, prompts, params)
    for g, w in zip(got, want):
        assert g == w
    assert len(got) == len(want)
    return want


# ---- the index ----

def reference_proposal(tokens: list[int], k: int) -> list[int]:
    """The latest earlier occurrence of the longest suffix (n <= 4), then a copy on from there."""
    size = len(tokens)
    for n in range(min(4, size - 1), 0, -1):
        ends = [e for e in range(n, size) if tokens[e - n:e] == tokens[size - n:]]
        if ends:
            text = list(tokens)
            for j in range(k):
                text.append(text[ends[-1] + j])
            return text[size:]
    return []


def test_ngram_index_matches_brute_force_reference():
    rng = random.Random(5)
    for trial in range(300):
        alphabet = rng.randint(2, 6)
        tokens = [rng.randrange(alphabet) for _ in range(rng.randint(1, 40))]
        grown, whole = _engine.NgramIndex(), _engine.NgramIndex()
        for i in range(1, len(tokens) + 1):  # extended a token at a time, as the engine does
            grown.extend(tokens[:i])
        whole.extend(tokens)
        for k in (1, 3, 8):
            want = reference_proposal(tokens, k)
            assert grown.propose(tokens, k) == want == whole.propose(tokens, k), (tokens, k)
    assert _engine.NgramIndex.max_ngram == 4


def test_index_proposes_what_followed_and_repeats_a_loop():
    idx = _engine.NgramIndex()
    t = [7, 1, 2, 3, 9, 1, 2]
    idx.extend(t)
    assert idx.propose(t, 2) == [3, 9]  # "1 2" was followed by "3 9"
    assert idx.propose(t, 5) == [3, 9, 1, 2, 3]  # past the text's end the copy goes on from the draft itself
    idx.extend(t := [4, 5, 6])
    assert idx.propose(t, 3) == []  # the last token never occurred before


# ---- exactness ----

def test_greedy_alone_bit_identical_and_drafts_pay(on, priced, off):
    """Every prompt alone, with every drafted row taken (on) and with rows priced as served: the same outputs
    as without speculation; priced, most drafted tokens stand and the steps are fewer than the tokens."""
    params = SamplingParams(temperature=0, max_tokens=96, logprobs=3)
    generated = sum(len(r[0]) for p in ALL for r in results(off, [p], params))
    for llm in (on, priced):
        before, steps0 = spec_counts(llm), llm.engine.stats()["steps"]
        for p in ALL:
            assert_same(llm, off, [p], params)
        drafts, drafted, accepted = spec_counts(llm) - before
        assert drafts > 50 and llm.engine.stats()["steps"] - steps0 < 0.75 * generated  # fewer steps than tokens
    assert accepted > 0.5 * drafted  # priced: these prompts copy, and most drafted tokens stand


def test_greedy_batched_bit_identical(on, off):
    params = SamplingParams(temperature=0, max_tokens=64, logprobs=2)
    before = spec_counts(on)
    assert_same(on, off, GROUNDED[:3], params)  # three decodes: rows left for drafts
    assert (spec_counts(on) - before)[2] > 0
    assert_same(on, off, ALL, params)           # twelve: full rows at first, drafts as they finish


def test_max_tokens_cut_inside_a_draft(on, off):
    for max_tokens in (1, 2, 3, 5, 8, 13, 21, 34):
        want = assert_same(on, off, GROUNDED[:2], SamplingParams(temperature=0, max_tokens=max_tokens, logprobs=1))
        assert all(len(r[0]) == max_tokens and r[3] == "length" for r in want)


def test_stop_strings_and_stop_ids(on, off):
    greedy = SamplingParams(temperature=0, max_tokens=80)
    for p in GROUNDED:
        ids, text, _, _ = results(off, [p], greedy)[0]
        stop = text[len(text) // 2:len(text) // 2 + 3]
        want = assert_same(on, off, [p], SamplingParams(temperature=0, max_tokens=80, stop=[stop]))
        assert want[0][3] == "stop" and stop not in want[0][1]
        want = assert_same(on, off, [p], SamplingParams(temperature=0, max_tokens=80, stop_token_ids=[ids[20]]))
        assert want[0][3] == "stop" and len(want[0][0]) <= 21


def test_sampling_penalties_and_n_bit_identical_with_a_seed(on, off):
    for params in (SamplingParams(n=4, temperature=0.8, top_p=0.9, seed=7, max_tokens=48, logprobs=2),
                   SamplingParams(n=2, temperature=0, max_tokens=48, repetition_penalty=1.3),
                   SamplingParams(temperature=0.7, top_k=20, seed=3, max_tokens=48, presence_penalty=0.5,
                                  frequency_penalty=0.3, logit_bias={236764: 2.0}),
                   SamplingParams(temperature=0, max_tokens=48, min_tokens=30)):
        assert_same(on, off, GROUNDED, params)


def test_constrained_bit_identical(on, off):
    schema = {"type": "object", "additionalProperties": False, "required": ["name", "city"],
              "properties": {"name": {"type": "string", "maxLength": 40}, "city": {"type": "string", "maxLength": 20}}}
    prompt = "Record:\n" + RECORD + '\nAs JSON: {"name": "Ada Lovelace", "city": "London"}\nAgain, as JSON: '
    before = spec_counts(on)
    for so in (S(json=schema), S(regex=r"Name: [A-Za-z ]{1,30}\nBorn: [0-9]{1,2} [A-Z][a-z]+ [0-9]{4}\n")):
        for params in (SamplingParams(temperature=0, max_tokens=60, structured_outputs=so),
                       SamplingParams(n=3, temperature=1.0, seed=11, max_tokens=60, structured_outputs=so)):
            for p in (prompt, GROUNDED[1]):
                assert_same(on, off, [p], params)
    assert (spec_counts(on) - before)[2] > 0  # drafts the grammar accepted were verified


def test_prefix_cache_and_kv_pool_end_the_same(model_path):
    engines = [LLM(model_path, n_threads=2, num_kv_blocks=256, speculative_ngram=k) for k in (0, K)]
    greedy = SamplingParams(temperature=0, max_tokens=70)
    for llm in engines:
        text = llm.generate([GROUNDED[0]], greedy)[0].outputs[0].text
        llm.generate([GROUNDED[0] + text], SamplingParams(temperature=0, max_tokens=4))
    stats = [llm.engine.stats() for llm in engines]
    for key in ("blocks_cached", "prefix_cache_queries", "prefix_cache_hits"):
        assert stats[0][key] == stats[1][key], key
    assert stats[0]["prefix_cache_hits"] > 0
    assert stats[1]["spec_accepted_tokens"] > 0
    assert stats[0]["blocks_used"] == stats[1]["blocks_used"] == 0


def test_full_batch_drafts_nothing(on, off):
    before = spec_counts(on)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    assert_same(on, off, (GROUNDED + PROMPTS)[:10], params)  # ten decodes every step: more than the 8 rows
    assert (spec_counts(on) - before)[0] == 0


def test_drafts_shrink_where_text_does_not_copy(priced):
    """Free text at temperature 1 rarely continues as it did before: a stream's estimate of its acceptance
    falls, and it drafts only the rows still worth their time, now and then; text that copies drafts long and
    takes fewer steps than tokens."""
    def run(prompt, params):
        before, steps0 = spec_counts(priced), priced.engine.stats()["steps"]
        n = len(priced.generate([prompt], params)[0].outputs[0].token_ids)
        return (*(spec_counts(priced) - before), priced.engine.stats()["steps"] - steps0, n)

    drafts, drafted, accepted, steps, n = run("Once upon a time, in a land far away,",
                                               SamplingParams(temperature=1.0, seed=1, max_tokens=200, ignore_eos=True))
    assert n == 200 and accepted < 0.2 * drafted  # the premise: this text does not copy
    free_rows = drafted / steps
    drafts, drafted, accepted, steps, n = run(GROUNDED[0], SamplingParams(temperature=0, max_tokens=120))
    assert accepted > 0.5 * drafted and steps < 0.5 * n
    assert free_rows < 0.5 * drafted / steps  # (how many exactly depends on the row costs)


def test_vllm_speculative_config_spelling(model_path):
    llm = LLM(model_path, n_threads=2, speculative_config={"method": "ngram", "num_speculative_tokens": 5,
                                                           "prompt_lookup_max": 4, "prompt_lookup_min": 1})
    assert llm.engine.config["speculative_ngram"] == 5
    with pytest.raises(ValueError, match="method 'eagle' is not supported"):
        LLM(model_path, speculative_config={"method": "eagle", "num_speculative_tokens": 3})
    with pytest.raises(ValueError, match="speculative_ngram must be an integer >= 0"):
        LLM(model_path, speculative_ngram=-2)


# ---- the distribution ----

def chi2_critical(df: int, z: float = 3.09) -> float:
    """The chi-square quantile at significance 0.001 (z = 3.09), Wilson–Hilferty's approximation."""
    return df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3


def test_sampling_distribution_unchanged(on, off):
    """Four tokens after a repeating prompt (drafts verified from the second on): their joint frequencies
    over 400 seeds with speculation and 400 other seeds without it are one distribution (chi-square test of
    homogeneity, significance 0.001, outcomes seen < 10 times pooled)."""
    prompt = "a b c d a b c d a b c d a b c d a b"
    n = 400
    before = spec_counts(on)

    def outcomes(llm, seeds):
        counts = {}
        for s in seeds:
            ids = tuple(llm.generate([prompt], SamplingParams(temperature=1.0, seed=s, max_tokens=4))[0]
                        .outputs[0].token_ids)
            counts[ids] = counts.get(ids, 0) + 1
        return counts

    a, b = outcomes(on, range(n)), outcomes(off, range(n, 2 * n))
    drafts, drafted, accepted = spec_counts(on) - before
    assert accepted > n, (drafts, drafted, accepted)  # draws from the drafted rows: each accepted token's next
    keys = sorted(set(a) | set(b), key=lambda k: -(a.get(k, 0) + b.get(k, 0)))
    big = [k for k in keys if a.get(k, 0) + b.get(k, 0) >= 10]
    table = np.array([[a.get(k, 0) for k in big] + [n - sum(a.get(k, 0) for k in big)],
                      [b.get(k, 0) for k in big] + [n - sum(b.get(k, 0) for k in big)]], dtype=float)
    table = table[:, table.sum(axis=0) > 0]
    expected = table.sum(axis=1, keepdims=True) * table.sum(axis=0, keepdims=True) / table.sum()
    stat = float(((table - expected) ** 2 / expected).sum())
    df = table.shape[1] - 1
    assert df >= 3
    assert stat < chi2_critical(df), (stat, df, table)


def test_fixed_row_costs_are_checked(priced, off):
    for bad in ([0.0], [1e-3, 2e-3], [0.0, 2e-3, 1e-3], [0.0] + [1e-3] * 9):
        with pytest.raises(ValueError, match="row_costs"):
            priced.engine.set_row_costs(bad)
    with pytest.raises(ValueError, match="speculation is off"):
        off.engine.set_row_costs(ROW_COSTS)
    assert priced.engine.stats()["row_costs"] == ROW_COSTS  # the last good costs stand, unfollowed
