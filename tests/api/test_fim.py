"""Fill-in-the-middle: `suffix` on /v1/completions and llama.cpp's /infill, on random-weight models with real
coder vocabularies (llama.cpp's StarCoder and DeepSeek-Coder test vocabularies; its Qwen2 one with
Qwen2.5-Coder's FIM tokens at their ids), served by one real server beside the default model (no FIM tokens).

The layout is checked to the token: each FIM request's greedy text and prompt length equal a plain
/v1/completions request whose prompt is the expected token ids, built here from /tokenize of each part.
"""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from pyserve.bench.launch import ServerProcess
from pyserve.engine.fim_tokens import FimTokens
from pyserve.engine.model_source import resolve_model
from pyserve.engine.tokenizer import Tokenizer
from support import model_factory as tm
from support.gguf_vocab import vocab_meta, vocab_tokenizer

# Qwen2.5-Coder's FIM tokens (its GGUFs: control tokens at these ids)
QWEN_FIM = {151659: "<|fim_prefix|>", 151660: "<|fim_middle|>", 151661: "<|fim_suffix|>", 151662: "<|fim_pad|>",
            151663: "<|repo_name|>", 151664: "<|file_sep|>"}
# (pre, suf, mid, rep, sep, bos when the vocabulary adds one) per served model
LAYOUTS = {"qwen": (151659, 151661, 151660, 151663, 151664, None), "starcoder": (1, 3, 2, None, None, None),
           "deepseek": (32016, 32015, 32017, None, None, 32013)}
PREFIX, SUFFIX = "def add(a, b):\n    ", "\n    return c\n"
N = 8


def _qwen_coder_vocab() -> dict:
    meta = dict(vocab_meta("qwen2"))
    tokens, types = list(meta["tokenizer.ggml.tokens"]), list(meta["tokenizer.ggml.token_type"])
    for i, text in QWEN_FIM.items():
        tokens[i], types[i] = text, 3
    return dict(meta, **{"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types})


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    d = tmp_path_factory.mktemp("fim")
    models = {"qwen": tm.write_test_model(d / "qwen.gguf", "qwen2", vocab=_qwen_coder_vocab()),
              "starcoder": tm.write_test_model(d / "sc.gguf", "llama", vocab=vocab_meta("starcoder")),
              "deepseek": tm.write_test_model(d / "ds.gguf", "llama", vocab=vocab_meta("deepseek-coder"))}
    args = [a for name, path in models.items() for a in ("--model", f"{name}={path}")]
    s = ServerProcess(*args, "--model", f"gemma={resolve_model(None)}").wait_ready()
    yield s
    assert s.stop() == 0, "".join(s.stderr)


@pytest.fixture(scope="module")
def sdk(srv) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0)


def post(srv, path: str, **body) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=60)


def ids(srv, model: str, text: str) -> list[int]:
    r = post(srv, "/tokenize", model=model, prompt=text, add_special_tokens=False)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def expected(srv, model: str, prefix: str, suffix: str, extra=(), prompt: str = "") -> list[int]:
    """llama.cpp's PSM layout, written out: the repository and files, BOS, prefix, prompt, suffix, middle."""
    pre, suf, mid, rep, sep, bos = LAYOUTS[model]
    head = [rep] + ids(srv, model, "myproject\n") if rep is not None else []
    for name, text in extra:
        head += [sep] + ids(srv, model, name + "\n") if sep is not None else ids(srv, model, "\n\n--- snippet ---\n\n")
        head += ids(srv, model, text)
    head += [sep] + ids(srv, model, "filename\n") if sep is not None else []
    return (head + ([bos] if bos is not None else []) + [pre] + ids(srv, model, prefix) + ids(srv, model, prompt)
            + [suf] + ids(srv, model, suffix) + [mid])


def plain(sdk, model: str, prompt_ids: list[int]):
    return sdk.completions.create(model=model, prompt=prompt_ids, max_tokens=N, temperature=0)


def test_fim_tokens_come_from_the_keys_else_the_texts():
    """llama.cpp's finding of FIM tokens on its test vocabularies: by text (StarCoder, Refact's <reponame>,
    DeepSeek-Coder's user-defined ones, made control so text never spells them), none in a vocabulary
    without them, and a GGUF key before any text; pad / repo tokens also end generation."""
    assert vocab_tokenizer("starcoder").fim_tokens() == FimTokens(pre=1, suf=3, mid=2, pad=4)
    assert vocab_tokenizer("refact").fim_tokens() == FimTokens(pre=1, suf=3, mid=2, pad=4, rep=18)
    assert 4 in vocab_tokenizer("starcoder").eos_ids and 18 in vocab_tokenizer("refact").eos_ids
    ds = vocab_tokenizer("deepseek-coder")
    assert ds.fim_tokens() == FimTokens(pre=32016, suf=32015, mid=32017)
    assert 32016 not in ds.encode("<｜fim▁begin｜>", add_special=False)
    assert not vocab_tokenizer("llama-spm").fim_tokens().complete
    keyed = Tokenizer.from_gguf_metadata(dict(vocab_meta("starcoder"), **{"tokenizer.ggml.fim_pre_token_id": 7}))
    assert keyed.fim_tokens().pre == 7 and keyed.fim_tokens().suf == 3


@pytest.mark.parametrize("model", sorted(LAYOUTS))
def test_suffix_on_completions_is_the_models_fim_layout(srv, sdk, model):
    out = sdk.completions.create(model=model, prompt=PREFIX, suffix=SUFFIX, max_tokens=N, temperature=0)
    want = expected(srv, model, PREFIX, SUFFIX)
    ref = plain(sdk, model, want)
    assert out.usage.prompt_tokens == len(want) == ref.usage.prompt_tokens
    assert out.choices[0].text == ref.choices[0].text and out.choices[0].finish_reason == ref.choices[0].finish_reason


@pytest.mark.parametrize("model", ["qwen", "starcoder"])
def test_infill_puts_extra_files_and_the_prompt_in_place(srv, sdk, model):
    extra = [("utils.py", "def sub(a, b):\n    return a - b\n"), ("main.py", "print(add(1, 2))\n")]
    body = dict(model=model, input_prefix=PREFIX, input_suffix=SUFFIX, prompt="c =", n_predict=N, temperature=0,
                return_tokens=True, input_extra=[{"filename": f, "text": t} for f, t in extra])
    r = post(srv, "/infill", **body)
    assert r.status_code == 200, r.text
    got = r.json()
    want = expected(srv, model, PREFIX, SUFFIX, extra, prompt="c =")
    ref = plain(sdk, model, want)
    assert got["tokens_evaluated"] == len(want) and got["content"] == ref.choices[0].text
    assert got["stop"] is True and got["tokens_predicted"] == len(got["tokens"]) == ref.usage.completion_tokens
    assert got["stop_type"] == {"length": "limit", "stop": "eos"}[ref.choices[0].finish_reason]
    assert got["model"] == model and got["has_new_line"] == ("\n" in got["content"])


def test_a_long_prefix_keeps_its_end(srv, sdk):
    """The prefix keeps its last 3/4 of the batch (context 512: batch 256, so 192 tokens)."""
    prefix = "x = 1\n" * 200
    got = post(srv, "/infill", model="starcoder", input_prefix=prefix, input_suffix=SUFFIX, n_predict=N,
               temperature=0).json()
    pre, suf, mid = LAYOUTS["starcoder"][:3]
    want = [pre] + ids(srv, "starcoder", prefix)[-192:] + [suf] + ids(srv, "starcoder", SUFFIX) + [mid]
    assert got["tokens_evaluated"] == len(want) and got["content"] == plain(sdk, "starcoder", want).choices[0].text


def test_infill_streams_llama_cpp_objects(srv):
    body = dict(model="qwen", input_prefix=PREFIX, input_suffix=SUFFIX, n_predict=N, temperature=0)
    whole = post(srv, "/infill", **body).json()
    with httpx.stream("POST", srv.url + "/infill", json=dict(body, stream=True), timeout=60) as r:
        assert r.status_code == 200
        lines = [ln for ln in r.iter_lines() if ln]
    assert all(ln.startswith("data: ") for ln in lines) and "data: [DONE]" not in lines
    events = [json.loads(ln[6:]) for ln in lines]
    steps, final = events[:-1], events[-1]
    assert all(e["stop"] is False for e in steps) and final["stop"] is True and final["content"] == ""
    assert "".join(e["content"] for e in steps) == whole["content"]
    assert final["tokens_predicted"] == whole["tokens_predicted"] and final["stop_type"] == whole["stop_type"]


def test_infill_n_probs_are_the_completions_logprobs(srv, sdk):
    """llama.cpp's completion_probabilities: each generated token with its logprob and the n_probs most likely,
    the same numbers /v1/completions gives for the same FIM prompt; streamed steps carry their tokens' share."""
    body = dict(model="qwen", input_prefix=PREFIX, input_suffix=SUFFIX, n_predict=N, temperature=0, n_probs=3,
                return_tokens=True)
    whole = post(srv, "/infill", **body).json()
    probs = whole["completion_probabilities"]
    assert [p["id"] for p in probs] == whole["tokens"] and len(probs) == whole["tokens_predicted"]
    ref = sdk.completions.create(model="qwen", prompt=PREFIX, suffix=SUFFIX, max_tokens=N, temperature=0,
                                 logprobs=3).choices[0].logprobs
    for p, lp, top in zip(probs, ref.token_logprobs, ref.top_logprobs):
        assert len(p["top_logprobs"]) == 3 and p["top_logprobs"][0]["id"] == p["id"]  # greedy: the top one
        assert abs(p["logprob"] - lp) < 1e-6 and bytes(p["bytes"]).decode("utf-8", "ignore") == p["token"]
        assert sorted(round(t["logprob"], 5) for t in p["top_logprobs"]) == sorted(round(v, 5) for v in top.values())
    with httpx.stream("POST", srv.url + "/infill", json=dict(body, stream=True), timeout=60) as r:
        events = [json.loads(ln[6:]) for ln in r.iter_lines() if ln]
    streamed = [p for e in events[:-1] for p in e["completion_probabilities"]]
    assert streamed == probs and "completion_probabilities" not in events[-1]


def test_a_model_without_fim_tokens_is_refused(srv, sdk):
    with pytest.raises(openai.BadRequestError) as ei:
        sdk.completions.create(model="gemma", prompt=PREFIX, suffix=SUFFIX, max_tokens=N)
    assert ei.value.body["param"] == "suffix" and "fill-in-the-middle" in ei.value.body["message"]
    r = post(srv, "/infill", model="gemma", input_prefix=PREFIX, input_suffix=SUFFIX)
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_suffix"
    out = sdk.completions.create(model="gemma", prompt=PREFIX, suffix="", max_tokens=2)  # "": no FIM, as before
    assert out.usage.completion_tokens >= 1


@pytest.mark.parametrize("body,param", [
    ({"input_prefix": "a"}, "input_suffix"),
    ({"input_suffix": "a"}, "input_prefix"),
    ({"input_prefix": "a", "input_suffix": "b", "input_extra": [{"filename": "f"}]}, "input_extra"),
    ({"input_prefix": "a", "input_suffix": "b", "input_extra": {"text": "t"}}, "input_extra"),
    ({"input_prefix": "a", "input_suffix": "b", "prompt": 5}, "prompt"),
    ({"input_prefix": "a", "input_suffix": "b", "n_predict": 0}, "n_predict"),
    ({"input_prefix": "a", "input_suffix": "b", "n_probs": 21}, "n_probs"),
    ({"input_prefix": "a", "input_suffix": "b", "n_probs": 2, "post_sampling_probs": True}, "post_sampling_probs"),
    ({"input_prefix": "a", "input_suffix": "b", "temperature": "hot"}, "temperature"),
])
def test_bad_infill_bodies_name_the_field(srv, body, param):
    r = post(srv, "/infill", model="qwen", **body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_echo_with_suffix_is_refused(sdk):
    with pytest.raises(openai.BadRequestError) as ei:
        sdk.completions.create(model="qwen", prompt=PREFIX, suffix=SUFFIX, echo=True, max_tokens=N)
    assert ei.value.body["param"] == "echo"


def test_suffix_streams_the_same_middle(sdk):
    whole = sdk.completions.create(model="qwen", prompt=PREFIX, suffix=SUFFIX, max_tokens=N, temperature=0)
    chunks = sdk.completions.create(model="qwen", prompt=PREFIX, suffix=SUFFIX, max_tokens=N, temperature=0,
                                    stream=True, stream_options={"include_usage": True})
    parts = list(chunks)
    assert "".join(c.text for p in parts for c in p.choices) == whole.choices[0].text
    assert parts[-1].usage.prompt_tokens == whole.usage.prompt_tokens
