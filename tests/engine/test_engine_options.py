"""EngineOptions is the one definition of the engine's options: the C++ EngineConfig has the same fields and
defaults, every field is a flag of `pyserve serve` and `pyserve generate` and a key of `--models-config`
tables, the KV geometry a listing reports before loading is the one the loaded engine has, and bad values
are refused with the field's name. The offline and async APIs build the same engine request from a prompt."""
from __future__ import annotations

import dataclasses

import pytest

from pyserve import LLM, _engine
from pyserve.cli import engine_options
from pyserve.engine.async_llm import AsyncLLM
from pyserve.engine.options import BY_KEY, FIELDS, EngineOptions, option
from pyserve.engine.sampling_params import SamplingParams
from pyserve.server.model_options import read_models_file


def test_fields_and_defaults_are_the_engines():
    native = _engine.EngineConfig().as_dict()
    assert list(native) == list(FIELDS)
    assert EngineOptions().as_dict() == native
    served = EngineOptions.serving()
    assert (served.target_itl, served.speculative_ngram) == (0.020, 7)
    assert dataclasses.replace(served, target_itl=0.0, speculative_ngram=0) == EngineOptions()


def test_every_field_is_a_flag_with_its_value():
    values = {"n_threads": 3, "n_ctx": 256, "num_kv_blocks": 40, "block_size": 8, "max_num_seqs": 5,
              "max_num_batched_tokens": 96, "enable_prefix_caching": False, "target_itl": 0.05,
              "speculative_ngram": 3, "speculative_price_drafts": False, "speculative_method": "mtp",
              "kv_cache_dtype": "q8_0", "kv_cache_dir": "/tmp/kv-tier", "kv_cache_disk": 4096}
    argv = []
    for f in dataclasses.fields(EngineOptions):
        if f.name in values:
            v = values[f.name]
            argv += [f"--no-{option(f).flag[2:]}"] if v is False else [option(f).flag, str(v)]
    assert set(values) | {"kv_cache_memory"} == set(FIELDS)  # the one left out excludes --num-kv-blocks
    for command, base in (("serve", EngineOptions.serving()), ("generate", EngineOptions())):
        assert engine_options([command, *argv] + (["x"] if command == "generate" else [])) == base.replace(**values)
        assert engine_options([command] + (["x"] if command == "generate" else [])) == base
    assert engine_options(["serve", "--kv-cache-memory", "1.5M"]).kv_cache_memory == 3 << 19
    cfg = '{"method": "ngram", "num_speculative_tokens": 2}'
    assert engine_options(["serve", "--speculative-config", cfg]).speculative_ngram == 2
    got = engine_options(["serve", "--speculative-config", '{"method": "qwen3_next_mtp"}'])
    assert (got.speculative_ngram, got.speculative_method) == (1, "mtp")


@pytest.mark.parametrize("argv,says", [(["--ctx-size", "-4"], "n_ctx must be an integer >= 0"),
                                       (["--block-size", "0"], "block_size must be positive"),
                                       (["--target-itl", "nan"], "target_itl must be >= 0"),
                                       (["--max-num-seqs", "two"], "expected an integer"),
                                       (["--speculative-method", "eagle"], "speculative_method must be one of ngram, mtp"),
                                       (["--speculative-config", '{"method": "eagle"}'], "method 'eagle' is not supported"),
                                       (["--kv-cache-dtype", "fp8"], "kv_cache_dtype must be one of f32, f16, bf16, q8_0")])
def test_a_bad_flag_is_a_usage_error_naming_it(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        engine_options(["serve", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and argv[0] in err and says in err


def test_every_key_of_a_models_config_table(tmp_path, model_path):
    keys = {"threads": 1, "ctx_size": 128, "kv_cache_memory": "2M", "block_size": 32, "max_num_seqs": 3,
            "max_num_batched_tokens": 64, "enable_prefix_caching": False, "target_itl": 0.0, "speculative_ngram": 2,
            "speculative_price_drafts": False, "speculative_method": "ngram", "kv_cache_dtype": "bf16",
            "kv_cache_dir": "/tmp/kv-tier", "kv_cache_disk": "2G"}
    assert set(keys) | {"num_kv_blocks"} == set(BY_KEY)
    body = "\n".join(f"{k} = {str(v).lower() if isinstance(v, bool) else repr(v)}" for k, v in keys.items())
    (tmp_path / "m.toml").write_text(f'[small]\npath = "{model_path}"\n{body}\n[bad]\npath = "x.gguf"\n')
    with pytest.raises(ValueError, match=r"\[bad\]: ctx_size must be an integer >= 0"):
        (tmp_path / "bad.toml").write_text('[bad]\npath = "x.gguf"\nctx_size = -1\n')
        read_models_file(str(tmp_path / "bad.toml"))
    spec = read_models_file(str(tmp_path / "m.toml"))[0]
    assert EngineOptions().replace(**spec.engine) == EngineOptions(
        n_threads=1, n_ctx=128, kv_cache_memory=2 << 20, block_size=32, max_num_seqs=3, max_num_batched_tokens=64,
        enable_prefix_caching=False, speculative_ngram=2, speculative_price_drafts=False, kv_cache_dtype="bf16",
        kv_cache_dir="/tmp/kv-tier", kv_cache_disk=2 << 30)


@pytest.mark.parametrize("opts", [{}, {"n_ctx": 300, "kv_cache_memory": 1 << 20}, {"num_kv_blocks": 7, "block_size": 8},
                                  {"n_ctx": 100000}])
def test_geometry_before_loading_is_the_loaded_engines(model_path, opts):
    options = EngineOptions(n_threads=1, **opts)
    geo = options.kv_geometry(model_path)
    llm = LLM(model_path, options=options)
    c = llm.config
    assert (geo["n_ctx"], geo["num_kv_blocks"], geo["block_size"]) == (c["n_ctx"], c["num_kv_blocks"], c["block_size"])
    assert geo["max_model_len"] == llm.max_model_len == min(c["n_ctx"], c["num_kv_blocks"] * c["block_size"])
    assert geo["hparams"] == llm.hparams
    assert llm.options == options.replace(n_ctx=c["n_ctx"], num_kv_blocks=c["num_kv_blocks"], n_threads=c["n_threads"])


def test_llm_refuses_unknown_options_and_bad_values(model_path):
    with pytest.raises(TypeError, match="unknown engine option 'n_ctxx'"):
        LLM(model_path, n_ctxx=5)
    with pytest.raises(ValueError, match="max_num_seqs must be an integer"):
        LLM(model_path, max_num_seqs=2.5)
    with pytest.raises(ValueError, match="must be an integer >= 0"):
        _engine.kv_geometry(model_path, num_kv_blocks=-1)
    with pytest.raises(TypeError, match="unknown engine option"):
        _engine.Engine(model_path, step_target=0.1)


async def test_offline_and_async_apis_give_the_same_tokens(llm):
    """A prompt with a control token written in it is read the same by both: the token, not its letters."""
    prompt = "<start_of_turn>user\nName three colours.<end_of_turn>\n<start_of_turn>model\n"
    params = SamplingParams(temperature=0, max_tokens=12)
    offline = llm.generate(prompt, params)[0]
    async with AsyncLLM.open(llm) as engine:
        ids, streamed = None, []
        async for out in engine.generate(prompt, params):
            ids = out.prompt_token_ids
            streamed += out.token_ids_delta
    turn = llm.tokenizer.encode("<start_of_turn>", add_special=False, parse_special=True)
    assert len(turn) == 1 and offline.prompt_token_ids.count(turn[0]) == 2
    assert ids == offline.prompt_token_ids and streamed == offline.outputs[0].token_ids
    assert engine.prompt_ids(prompt) == ids
