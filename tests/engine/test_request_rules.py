"""The engine's request rules live in C++ once: Engine.check_request raises exactly what add raises and
queues nothing; _engine.check_sampling is what SamplingParams and the Sampler apply to sampler fields."""
import copy
import math
import select

import pytest

from pyserve import SamplingParams, _engine
from pyserve.engine.engine_request import EngineRequest

N_CTX, BLOCKS, BLOCK, MAX_SEQS = 64, 10, 4, 8


@pytest.fixture(scope="module")
def tiny(model_path):
    return _engine.Engine(model_path, n_threads=1, n_ctx=N_CTX, num_kv_blocks=BLOCKS, block_size=BLOCK,
                          max_num_seqs=MAX_SEQS)


def bad_requests(V):
    """(prompt, sampling, max_tokens, extra kwargs, the message's start) for each rule."""
    oov = rf"token id {V} is outside the vocabulary \[0, {V}\)"
    return [
        ([], {}, 4, {}, "prompt is empty"),
        ([2, V], {}, 4, {}, "prompt: " + oov),
        ([2, -1], {}, 4, {}, r"prompt: token id -1 is outside"),
        ([2, 3], {}, 0, {}, "max_tokens must be at least 1"),
        ([2, 3], {}, 4, {"n": 0}, r"n must be in \[1, max_num_seqs = 8\], got 0"),
        ([2, 3], {}, 4, {"n": MAX_SEQS + 1}, "n must be in"),
        ([2] * 10, {}, N_CTX, {}, r"prompt \(10 tokens\) \+ max_tokens \(64\) exceeds the context length 64"),
        ([2] * 6, {}, 4, {"n": 5}, r"prompt \+ 5 × max_tokens .* exceeds the KV cache \(40 tokens\)"),  # 1 + 5 × 2 > 10
        ([2, 3], {"temperature": -0.5}, 4, {}, "temperature must be >= 0"),
        ([2, 3], {"top_p": 0.0}, 4, {}, "top_p must be in"),
        ([2, 3], {"temperature": "hot"}, 4, {}, "temperature has the wrong type"),
        ([2, 3], {"logit_bias": {V: 1.0}}, 4, {}, "logit_bias: " + oov),
        ([2, 3], {"logit_bias": {-1: 1.0}}, 4, {}, "logit_bias: token id -1 is outside"),
        ([2, 3], {"logit_bias": {5: math.nan}}, 4, {}, "logit_bias value must be finite"),
        ([2, 3], {"logprobs": V + 1}, 4, {}, rf"logprobs must be <= n_vocab \({V}\)"),
        ([2, 3], {}, 4, {"stop_token_ids": [1, V]}, "stop_token_ids: " + oov),
        ([2, 3], {}, 4, {"stop_token_ids": [-5]}, "stop_token_ids: token id -5 is outside"),
        ([2, 3], {}, 4, {"prompt_logprobs": V + 1}, rf"prompt_logprobs must be <= n_vocab \({V}\)"),
        ([2, 3], {}, 4, {"prompt_logprobs": -1}, "prompt_logprobs must be >= 0 or None"),
        ([2, 3], {}, -1, {"prompt_logprobs": 0}, "max_tokens must be at least 0, got -1"),
        ([2] * 41, {}, 0, {"prompt_logprobs": 0}, r"prompt \(41 tokens\) exceeds the KV cache \(40 tokens\)"),
        ([2] * 65, {}, 0, {"prompt_logprobs": 0}, r"prompt \(65 tokens\) exceeds the context length 64"),
    ]


def queue_state(eng):
    s = eng.stats()
    return eng.has_work(), s["running"], s["waiting"], s["blocks_used"]


def test_check_request_raises_what_add_raises_and_queues_nothing(tiny):
    V = tiny.hparams["n_vocab"]
    loop = _engine.EngineLoop(tiny)  # not started: check_request needs no thread
    before = queue_state(tiny)
    for prompt, sampling, max_tokens, kw, match in bad_requests(V):
        args = ("r", prompt, sampling, max_tokens)
        with pytest.raises(ValueError, match="^" + match) as checked:
            tiny.check_request(*args, **kw)
        with pytest.raises(ValueError) as via_loop:
            loop.check_request(*args, **kw)
        with pytest.raises(ValueError) as added:
            tiny.add(*args, **kw)
        assert str(checked.value) == str(via_loop.value) == str(added.value)
        # the field's name comes first: callers name OpenAI's `param` after it
        assert str(checked.value).split(" ", 1)[0].rstrip(":") in {"prompt", "max_tokens", "n", "temperature",
                                                                    "top_p", "logit_bias", "logprobs",
                                                                    "stop_token_ids", "prompt_logprobs"}
        assert queue_state(tiny) == before


def test_a_valid_request_passes_the_check_and_is_not_queued(tiny):
    before = queue_state(tiny)
    tiny.check_request("ok", [2] * 6, {"temperature": 0.0, "logit_bias": {7: -1.0}}, 4, True, [1, 2], n=4)
    assert queue_state(tiny) == before == (False, 0, 0, 0)
    # check_request takes no id: the same id is still free to add
    tiny.add("ok", [2] * 6, {"temperature": 0.0}, 4, True, n=4)
    while tiny.has_work():
        tiny.step()
    assert queue_state(tiny) == before
    # scoring the prompt alone: max_tokens 0 with prompt_logprobs; an embedding
    tiny.check_request("ok", [2] * 40, {}, 0, prompt_logprobs=0, n=2)
    tiny.check_embed([2] * 40, "mean", False)
    assert queue_state(tiny) == before


def test_check_request_is_thread_safe_while_the_loop_steps(tiny):
    """check_request on the caller's thread while the engine thread steps: the answers and the generated
    tokens are those of a quiet engine."""
    greedy = {"temperature": 0.0}
    alone = []
    tiny.add("a", [2, 651, 6037], greedy, 12, True)
    while tiny.has_work():
        alone += [o.token for o in tiny.step()]
    loop = _engine.EngineLoop(tiny)
    loop.start()
    try:
        loop.add("a", [2, 651, 6037], greedy, 12, True)
        got, done, checks = [], False, 0
        for _ in range(10_000):  # bounded (≤ 10 ms a turn): 12 tokens come long before
            for prompt, sampling, max_tokens, kw, match in bad_requests(tiny.hparams["n_vocab"])[:3]:
                with pytest.raises(ValueError, match="^" + match):
                    loop.check_request("c", prompt, sampling, max_tokens, **kw)
            loop.check_request("c", [2, 3], greedy, 4)
            checks += 1
            if select.select([loop.fd], [], [], 0.01)[0]:
                for o in loop.drain():
                    got.append(o.token)
                    done = done or bool(o.finish_reason)
            if done:
                break
        assert done and got == alone and checks > 0
    finally:
        loop.stop()
    assert queue_state(tiny) == (False, 0, 0, 0)


def test_prompt_logits_checks_its_token_ids(tiny):
    V = tiny.hparams["n_vocab"]
    with pytest.raises(ValueError, match=rf"^tokens: token id {V} is outside the vocabulary"):
        tiny.prompt_logits([2, V])
    with pytest.raises(ValueError, match="^tokens: token id -3 is outside"):
        tiny.prompt_logits([-3])
    assert queue_state(tiny) == (False, 0, 0, 0)


SAMPLER_BAD = [
    dict(temperature=-0.1), dict(temperature=math.nan), dict(temperature=math.inf), dict(top_k=-2),
    dict(top_p=0.0), dict(top_p=1.01), dict(min_p=-0.01), dict(min_p=1.5), dict(repetition_penalty=0.0),
    dict(repetition_penalty=math.inf), dict(presence_penalty=2.5), dict(frequency_penalty=-2.5),
    dict(logit_bias={3: math.nan}), dict(logit_bias={3: math.inf}), dict(top_k=2**40), dict(seed=2**70),
]


@pytest.mark.parametrize("kw", SAMPLER_BAD, ids=repr)
def test_check_sampling_is_what_sampling_params_and_the_sampler_apply(kw):
    with pytest.raises(ValueError) as engine_rule:
        _engine.check_sampling(kw)
    with pytest.raises(ValueError) as params:
        SamplingParams(**kw)
    with pytest.raises(ValueError) as sampler:
        _engine.testing.Sampler(10, **kw)
    assert str(params.value) == str(engine_rule.value) == str(sampler.value)
    assert str(params.value).startswith(next(iter(kw)))


def test_edges_pass_everywhere():
    edges = dict(temperature=0.0, top_k=-1, top_p=1.0, min_p=1.0, repetition_penalty=1e-3, presence_penalty=-2.0,
                 frequency_penalty=2.0, logit_bias={3: -math.inf, 4: 100.0}, seed=2**62)
    _engine.check_sampling(edges)
    _engine.testing.Sampler(10, **edges)
    assert SamplingParams(**edges).engine_sampling()["top_p"] == 1.0


def test_what_only_the_python_layer_uses_is_checked_there():
    with pytest.raises(ValueError, match=r"^logprobs must be in \[0, 20\], got 21"):
        SamplingParams(logprobs=21)
    with pytest.raises(ValueError, match="^stop must be non-empty strings"):
        SamplingParams(stop=[""])
    # n and max_tokens depend on the engine's limits: Engine.check_request / add refuse them
    assert SamplingParams(n=0, max_tokens=0).n == 0


def test_sampling_params_build_the_engines_config_once():
    """The request's sampler parameters cross into C++ once (SamplingParams keeps the engine's SamplingConfig);
    a field changed afterwards makes it again, checked as at construction."""
    p = SamplingParams(temperature=0.5, top_k=7, logit_bias={"12": 3}, logprobs=2)
    config = p.engine_config()
    assert p.engine_config() is config
    assert (config.temperature, config.top_k, config.logprobs, config.logit_bias) == (0.5, 7, 2, [(12, 3.0)])
    p.top_k = 3
    assert p.engine_config() is not config and p.engine_config().top_k == 3
    p.logit_bias[13] = -4.0  # in place
    assert sorted(p.engine_config().logit_bias) == [(12, 3.0), (13, -4.0)]
    p.top_p = 0.0
    with pytest.raises(ValueError, match=r"^top_p must be in \(0, 1\], got 0"):
        p.engine_config()
    q = copy.deepcopy(SamplingParams(seed=5))
    assert q.engine_config().seed == 5
    with pytest.raises(ValueError, match="^logit_bias has the wrong type"):
        SamplingParams(logit_bias={"x": 1})


def _inside_and_outside(b: dict, kind: type) -> tuple[list, list]:
    """Values at and beside a bound: the first list must pass its check, the second fail."""
    step = 1 if kind is int else 1e-3
    inside, outside = [], [b["lo"] - step]
    (outside if b["lo_open"] else inside).append(b["lo"])
    inside.append(b["lo"] + step)
    if not math.isinf(b["hi"]):
        (outside if b["hi_open"] else inside).append(b["hi"])
        outside.append(b["hi"] + step)
    return [kind(v) for v in inside], [kind(v) for v in outside]


@pytest.mark.parametrize("name", ["temperature", "top_k", "top_p", "min_p", "repetition_penalty",
                                  "presence_penalty", "frequency_penalty", "min_tokens"])
def test_the_http_fields_take_the_engines_ranges(name):
    """One statement of each sampler range (the engine's): its check and the HTTP request model accept and
    refuse the same values at its edges (the API's own caps aside: temperature and repetition_penalty <= 2)."""
    from pydantic import ValidationError

    from pyserve.api.completions.protocol import CompletionRequest
    from pyserve.engine.limits import sampling_bounds

    kind = int if name in ("top_k", "min_tokens") else float
    inside, outside = _inside_and_outside(sampling_bounds()[name], kind)
    for v in inside:
        _engine.check_sampling({name: v})
        CompletionRequest.model_validate({"prompt": "x", name: v})
    for v in outside:
        with pytest.raises(ValueError, match=f"^{name} must be"):
            _engine.check_sampling({name: v})
        with pytest.raises(ValidationError):
            CompletionRequest.model_validate({"prompt": "x", name: v})


def test_a_request_past_the_models_length_carries_its_numbers(tiny):
    with pytest.raises(_engine.ContextLengthError) as e:
        tiny.check_request("r", [2] * 30, {}, 20)
    assert (e.value.max_len, e.value.n_prompt, e.value.max_tokens) == (40, 30, 20)  # 10 blocks of 4 < n_ctx 64
    assert str(e.value) == "prompt (30 tokens) + max_tokens (20) exceeds the KV cache (40 tokens)"
    with pytest.raises(_engine.ContextLengthError, match="exceeds the context length 64$"):
        tiny.check_request("r", [2] * 65, {}, 0, prompt_logprobs=0)
    with pytest.raises(_engine.ContextLengthError):  # past an int32 (a TypeError at the binding before)
        EngineRequest(None, [2] * 3, SamplingParams(max_tokens=43746783618)).check(tiny)
    with pytest.raises(ValueError) as n_copies:  # n copies that do not fit: the pool, not one sequence's length
        tiny.check_request("r", [2] * 6, {}, 4, n=5)
    assert not isinstance(n_copies.value, _engine.ContextLengthError)
