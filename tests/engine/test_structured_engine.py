"""Structured output in the engine, on the real model: every constrained sample is valid and ends with "stop"
(soundness), valid documents pass the matcher token by token (completeness), constrained requests change
nothing for their unconstrained neighbours (isolation), an abort frees matchers and blocks, and the sampler's
masking agrees with a numpy reference."""
from __future__ import annotations

import json
import re

import jsonschema
import numpy as np
import pytest
import trio

from pyserve import _engine
from pyserve.engine.async_llm import AsyncLLM
from pyserve.engine.sampling_params import SamplingParams
from pyserve.engine.structured import StructuredOutputsParams as S

CHAT = "<start_of_turn>user\n{}<end_of_turn>\n<start_of_turn>model\n"

SCHEMAS = {
    "nested": {"type": "object", "additionalProperties": False, "required": ["user", "active"],
               "properties": {"user": {"type": "object", "additionalProperties": False, "required": ["name", "age"],
                                       "properties": {"name": {"type": "string", "maxLength": 24},
                                                      "age": {"type": "integer", "minimum": 0, "maximum": 120}}},
                              "active": {"type": "boolean"}}},
    "bounded_array": {"type": "object", "additionalProperties": False, "required": ["tags"],
                      "properties": {"tags": {"type": "array", "minItems": 1, "maxItems": 3,
                                              "items": {"type": "string", "maxLength": 12}}}},
    "enum": {"type": "object", "additionalProperties": False, "required": ["colour"],
             "properties": {"colour": {"enum": ["red", "green", "blue"]}}},
    "any_of": {"type": "object", "additionalProperties": False, "required": ["value"],
               "properties": {"value": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9},
                                                  {"type": "string", "maxLength": 8}]}}},
    "refs": {"$defs": {"point": {"type": "object", "additionalProperties": False, "required": ["x", "y"],
                                 "properties": {"x": {"type": "integer", "minimum": -99, "maximum": 99},
                                                "y": {"type": "integer", "minimum": -99, "maximum": 99}}}},
             "type": "object", "additionalProperties": False, "required": ["start", "end"],
             "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}}},
    "nullable": {"type": "object", "additionalProperties": False, "required": ["note"],
                 "properties": {"note": {"type": ["string", "null"], "maxLength": 16}}},
    "pattern": {"type": "object", "additionalProperties": False, "required": ["code"],
                "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}}},
    "unbounded_integer": {"type": "object", "additionalProperties": False, "required": ["n"],
                          "properties": {"n": {"type": "integer"}}},
}
REGEXES = [r"[0-9]{3}-[0-9]{4}", r"(yes|no), because [a-z]{2,8}\.", r"[A-Z][a-z]{1,10}"]
CHOICES = [["alpha", "beta", "gamma"], ["The answer is 42", "The answer is unknown"]]


def run(llm, prompt: str, so: S, *, n: int = 4, seed: int = 0, temperature: float = 1.0, max_tokens: int = 160):
    params = SamplingParams(n=n, temperature=temperature, seed=seed, max_tokens=max_tokens, structured_outputs=so)
    return llm.generate([prompt], params)[0].outputs


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_sample_validates_against_its_schema(llm, name):
    schema = SCHEMAS[name]
    for seed in (1, 2):
        for c in run(llm, CHAT.format(f"Describe it as JSON ({name})."), S(json=schema), seed=seed):
            assert c.finish_reason == "stop", (seed, c.text)
            jsonschema.validate(json.loads(c.text), schema)


def test_unbounded_integers_stay_within_the_exact_json_range(llm):
    for seed in (3, 4):
        for c in run(llm, CHAT.format("A big number as JSON."), S(json=SCHEMAS["unbounded_integer"]), seed=seed):
            assert abs(json.loads(c.text)["n"]) <= 2**53 - 1


@pytest.mark.parametrize("pattern", REGEXES)
def test_every_sample_matches_its_regex(llm, pattern):
    for seed in (1, 2):
        for c in run(llm, "Answer: ", S(regex=pattern), seed=seed, max_tokens=40):
            assert c.finish_reason == "stop" and re.fullmatch(pattern, c.text), (seed, c.text)


@pytest.mark.parametrize("choices", CHOICES)
def test_every_sample_is_one_of_the_choices(llm, choices):
    for seed in (1, 2):
        for c in run(llm, "Pick one: ", S(choice=choices), seed=seed):
            assert c.finish_reason == "stop" and c.text in choices


def test_json_object_and_gbnf_grammar(llm):
    for c in run(llm, CHAT.format("Any JSON object."), S(json_object=True), seed=5, max_tokens=200):
        if c.finish_reason == "stop":  # free-form JSON may be long; what did finish must be an object
            assert isinstance(json.loads(c.text), dict)
    gbnf = 'root ::= "(" num ("," num)* ")"\nnum ::= [1-9] [0-9]?'
    for c in run(llm, "A tuple: ", S(grammar=gbnf), seed=6, max_tokens=60):
        if c.finish_reason == "stop":
            assert re.fullmatch(r"\([1-9][0-9]?(,[1-9][0-9]?)*\)", c.text), c.text


def test_compact_whitespace_by_default_and_whitespace_pattern(llm):
    schema = SCHEMAS["nested"]
    for c in run(llm, CHAT.format("A user as JSON."), S(json=schema), seed=7):
        assert "\n" not in c.text and "  " not in c.text
    pattern = S(json=schema, whitespace_pattern=r"[\n ]{0,2}")
    for c in run(llm, CHAT.format("A user as JSON."), pattern, seed=7):
        jsonschema.validate(json.loads(c.text), schema)


DOCUMENTS = [
    ("nested", {"user": {"name": "Ada", "age": 36}, "active": True}),
    ("bounded_array", {"tags": ["a", "bb", "ccc"]}),
    ("enum", {"colour": "green"}),
    ("any_of", {"value": "eight"}),
    ("any_of", {"value": 7}),
    ("refs", {"start": {"x": -3, "y": 4}, "end": {"x": 99, "y": -99}}),
    ("nullable", {"note": None}),
    ("pattern", {"code": "ABC-12"}),
]


@pytest.mark.parametrize("name,doc", DOCUMENTS)
def test_valid_documents_pass_the_matcher_token_by_token(llm, name, doc):
    text = json.dumps(doc)  # the default separators: ", " and ": ", the compact form the grammar allows
    g = llm.grammars.compile(S(json=SCHEMAS[name])).clone()
    for t in llm.tokenize(text, add_special=False):
        assert g.consume(t), (text, t, g.error)
    assert g.is_accepting()


def test_regex_and_choice_documents_pass_the_matcher(llm):
    for so, text in [(S(regex=REGEXES[0]), "555-1234"), (S(choice=CHOICES[1]), "The answer is unknown"),
                     (S(grammar='root ::= "x" [0-9]+'), "x2026")]:
        g = llm.grammars.compile(so).clone()
        assert all(g.consume(t) for t in llm.tokenize(text, add_special=False)) and g.is_accepting()


def test_reported_logprobs_are_the_raw_distribution(llm):
    prompt = CHAT.format("Pick a colour.")
    ids = llm.tokenize(prompt)
    out = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=1, logprobs=0,
                                                structured_outputs=S(json=SCHEMAS["enum"])))[0].outputs[0]
    row = llm.prompt_logits(ids, [len(ids) - 1])[0].astype(np.float64)
    raw = row - np.log(np.exp(row - row.max()).sum()) - row.max()
    token = out.token_ids[0]
    assert llm.detokenize([token]).startswith("{")
    assert out.logprobs[0][token] == pytest.approx(raw[token], abs=1e-3)


def test_the_sampler_masks_as_a_numpy_reference(llm):
    """Random logits through a constrained Sampler: the greedy pick is numpy's argmax over the allowed ids,
    and sampled picks are always allowed."""
    V = llm.engine.hparams["n_vocab"]
    grammar = llm.grammars.compile(S(regex=r"[a-c]{2}[0-9]"))
    rng = np.random.default_rng(0)
    for temperature in (0.0, 1.0):
        s = _engine.testing.Sampler(V, temperature=temperature, seed=11)
        s.set_grammar(grammar)
        ref, end = grammar.clone(), ""
        while end != "stop":  # 3 characters: at most 3 draws
            logits = rng.normal(size=V).astype(np.float32) * 4
            allowed = np.unpackbits(np.frombuffer(ref.mask(), dtype=np.uint8), bitorder="little")[:V].astype(bool)
            token, _lp, _top = s.sample(logits)
            end = s.grammar_end
            assert allowed[token]
            if temperature == 0:
                assert token == int(np.flatnonzero(allowed)[np.argmax(logits[allowed])])
            assert ref.consume(token) and (end == "stop") == ref.is_stopped()


# ---- batched beside other requests (AsyncLLM, one engine) ----

async def _collect(engine: AsyncLLM, prompt: str, params: SamplingParams) -> list[tuple]:
    """Per sample: its tokens, their logprobs and its finish reason (however the deltas were grouped)."""
    tokens: dict[int, list] = {}
    logprobs: dict[int, list] = {}
    finish: dict[int, str] = {}
    async for o in engine.generate(prompt, params):
        tokens.setdefault(o.index, []).extend(o.token_ids_delta)
        logprobs.setdefault(o.index, []).extend(o.logprobs_delta or ())
        finish[o.index] = o.finish_reason or finish.get(o.index)
    return [(tokens[i], logprobs[i], finish[i]) for i in sorted(tokens)]


async def test_unconstrained_outputs_are_identical_beside_constrained_ones(llm):
    free = [SamplingParams(temperature=0.8, seed=s, max_tokens=24, logprobs=2) for s in (1, 2)]
    prompts = ["The weather today is", "My favourite recipe"]
    constrained = SamplingParams(n=3, temperature=1.0, seed=9, max_tokens=60,
                                 structured_outputs=S(json=SCHEMAS["nested"]))
    async with AsyncLLM.open(llm) as engine:
        alone = [await _collect(engine, p, f) for p, f in zip(prompts, free)]
        beside: list = [None, None]
        async with trio.open_nursery() as nursery:
            for _ in range(2):
                nursery.start_soon(_collect, engine, CHAT.format("A user as JSON."), constrained)

            async def one(i):
                beside[i] = await _collect(engine, prompts[i], free[i])
            for i in range(2):
                nursery.start_soon(one, i)
    assert beside == alone


async def test_abort_frees_matchers_and_blocks(llm):
    params = SamplingParams(n=2, temperature=1.0, seed=4, max_tokens=400,
                            structured_outputs=S(json={"type": "object", "properties": {"story": {"type": "string"}}}))
    async with AsyncLLM.open(llm) as engine:
        await engine.compile_grammar(params.structured_outputs)  # the cached prototype is counted from here
        base = _engine.grammar_matchers_live()
        with trio.move_on_after(60):
            seen = 0
            async for _ in engine.generate(CHAT.format("A long story as JSON."), params):
                seen += 1
                if seen == 6:
                    assert _engine.grammar_matchers_live() == base + 2  # one per sample, cloned
                    break
        assert seen == 6
        for _ in range(200):  # the abort lands at the next step; bounded poll of the engine's own counters
            st = engine.stats()
            if st["running"] == 0 and st["waiting"] == 0 and st["blocks_used"] == 0:
                break
            await trio.sleep(0.02)
        assert st["blocks_used"] == 0 and st["running"] == 0
        assert _engine.grammar_matchers_live() == base and st["grammar_matchers"] == base


def test_bad_constraints_raise_value_errors(llm):
    cases = [S(regex="("), S(json='{"type": "strin"}'), S(json="{not json"), S(choice=[]),
             S(grammar='root ::= "x" ('), S(json={"type": "string", "format": "no-such-format"})]
    for so in cases:
        with pytest.raises(ValueError):
            llm.grammars.compile(so)
    with pytest.raises(ValueError, match="exactly one"):
        S(regex="a", choice=["b"])
