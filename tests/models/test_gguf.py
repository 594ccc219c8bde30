"""GGUF loading: every metadata type round-trips; every malformed file is a GGUFError naming what is wrong."""
import struct

import gguf
import numpy as np
import pytest

from pyserve import _engine
from support.model_factory import patch_tensor_type, write_all_types_gguf, write_test_model

TENSOR = "blk.0.attn_q.weight"


def write_valid(path, version=3):
    write_all_types_gguf(path)
    data = bytearray(path.read_bytes())
    struct.pack_into("<I", data, 4, version)
    path.write_bytes(bytes(data))
    return path


@pytest.fixture
def valid(tmp_path):
    return write_valid(tmp_path / "valid.gguf")


def tensor_info_at(data: bytes, name: str) -> int:
    """Offset just past the name of tensor `name` in the tensor table (n_dims follows)."""
    key = struct.pack("<Q", len(name)) + name.encode()
    return data.rindex(key) + len(key)


@pytest.mark.parametrize("version", [2, 3])
def test_metadata_round_trip(tmp_path, version):
    path = write_valid(tmp_path / "v.gguf", version)
    meta, tensors, ver = _engine.read_gguf(str(path))
    assert ver == version
    assert meta["t.u8"] == 200 and meta["t.i8"] == -100 and meta["t.u16"] == 60000 and meta["t.i16"] == -30000
    assert meta["t.u32"] == 4_000_000_000 and meta["t.i32"] == -2_000_000_000
    assert meta["t.f32"] == 1.5 and meta["t.bool"] is True and meta["t.str"] == "héllo ▁ world"
    assert meta["t.u64"] == 2**63 + 5 and meta["t.i64"] == -(2**62) and meta["t.f64"] == 0.1
    assert meta["t.arr_i"] == [1, 2, 3] and meta["t.arr_s"] == ["a", "bc", ""] and meta["t.arr_f"] == [0.5, -2.0]
    assert meta["general.architecture"] == "llama"
    by_name = {t["name"]: t for t in tensors}
    assert by_name[TENSOR]["shape"] == [32, 2] and by_name[TENSOR]["type_name"] == "F32"
    raw = _engine.tensor_data(str(path), TENSOR)
    assert np.array_equal(np.frombuffer(raw, dtype=np.float32), np.arange(64, dtype=np.float32))


def expect_error(path, *fragments):
    with pytest.raises(_engine.GGUFError) as e:
        _engine.read_gguf(str(path))
    msg = str(e.value)
    assert str(path) in msg
    for f in fragments:
        assert f in msg, msg
    return msg


def patched(tmp_path, data: bytes, name="bad.gguf"):
    p = tmp_path / name
    p.write_bytes(bytes(data))
    return p


def test_bad_magic(tmp_path, valid):
    data = bytearray(valid.read_bytes())
    data[0:4] = b"GGML"
    expect_error(patched(tmp_path, data), "bad magic")


@pytest.mark.parametrize("version", [1, 4, 0xFFFFFFFF])
def test_bad_version(tmp_path, valid, version):
    data = bytearray(valid.read_bytes())
    struct.pack_into("<I", data, 4, version)
    expect_error(patched(tmp_path, data), "unsupported GGUF version")


@pytest.mark.parametrize("frac", [0.0, 0.01, 0.1, 0.3, 0.6, 0.9])
def test_truncated(tmp_path, valid, frac):
    data = valid.read_bytes()
    cut = data[: int(len(data) * frac)]
    msg = expect_error(patched(tmp_path, cut))
    assert "truncated" in msg or "outside the file" in msg or "exceeds the file size" in msg


def test_truncated_inside_tensor_data(tmp_path, valid):
    data = valid.read_bytes()
    start = data.index(np.arange(64, dtype=np.float32).tobytes())
    expect_error(patched(tmp_path, data[: start + 100]), "outside the file")


def test_tensor_data_outside_file(tmp_path, valid):
    data = bytearray(valid.read_bytes())
    at = tensor_info_at(data, "second") + 4 + 8 + 4  # n_dims, one dim, type → offset
    struct.pack_into("<Q", data, at, 1 << 40)
    expect_error(patched(tmp_path, data), "'second'", "outside the file")


def _engine_lacks(t) -> bool:
    try:
        _engine.testing.type_info(int(t))
        return False
    except ValueError:
        return True


# every GGML type gguf-py knows that the engine does not support, and two ids no GGML type has
UNSUPPORTED_IDS = [int(t) for t in gguf.GGMLQuantizationType if _engine_lacks(t)] + [4, 99]


@pytest.mark.parametrize("type_id", UNSUPPORTED_IDS)
def test_unknown_tensor_type(valid, type_id):
    """The error names the tensor, the type id and, for a real GGML type the engine lacks, its name."""
    patch_tensor_type(valid, TENSOR, type_id)
    known = {t.value: t.name for t in gguf.GGMLQuantizationType}.get(type_id)
    want = f"unsupported tensor type {type_id}" + (f" ({known})" if known else " at")
    expect_error(valid, TENSOR, want, "offset")


@pytest.mark.parametrize("dims", [(1 << 62, 1 << 62), (0, 2), (1 << 63, 1)])
def test_overflowing_dimensions(tmp_path, valid, dims):
    data = bytearray(valid.read_bytes())
    at = tensor_info_at(data, TENSOR) + 4
    struct.pack_into("<QQ", data, at, *dims)
    expect_error(patched(tmp_path, data), TENSOR)


def test_too_many_dimensions(tmp_path, valid):
    data = bytearray(valid.read_bytes())
    struct.pack_into("<I", data, tensor_info_at(data, TENSOR), 7)
    expect_error(patched(tmp_path, data), TENSOR, "dimensions")


def test_unknown_metadata_type(tmp_path, valid):
    data = bytearray(valid.read_bytes())
    key = b"t.f32"
    at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key)
    struct.pack_into("<I", data, at, 77)
    expect_error(patched(tmp_path, data), "'t.f32'", "unknown value type 77")


def test_huge_string_length(tmp_path, valid):
    data = bytearray(valid.read_bytes())
    key = b"t.str"
    at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key) + 4
    struct.pack_into("<Q", data, at, 1 << 60)
    expect_error(patched(tmp_path, data), "truncated")


def test_huge_array_length(tmp_path, valid):
    data = bytearray(valid.read_bytes())
    key = b"t.arr_i"
    at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key) + 4 + 4
    struct.pack_into("<Q", data, at, 1 << 61)
    expect_error(patched(tmp_path, data), "'t.arr_i'", "past the end")


def test_missing_file(tmp_path):
    with pytest.raises(_engine.GGUFError, match="cannot open"):
        _engine.read_gguf(str(tmp_path / "nope.gguf"))


def write_stub_model(path, arch, **strings):
    w = gguf.GGUFWriter(str(path), arch=arch)
    for key, value in strings.items():
        w.add_string(key.replace("__", "."), value)
    w.add_tensor("token_embd.weight", np.zeros((8, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_wrong_metadata_type_for_model(tmp_path):
    """A model whose hyper-parameter has the wrong type: the error names the key and both types."""
    path = write_stub_model(tmp_path / "m.gguf", "llama", llama__embedding_length="sixty-four")
    with pytest.raises(_engine.GGUFError, match="'llama.embedding_length' has type string, expected an integer"):
        _engine.Engine(str(path), n_threads=1)


def test_unsupported_architecture_lists_supported(tmp_path):
    path = write_stub_model(tmp_path / "m.gguf", "mamba")
    with pytest.raises(_engine.ModelError, match="'mamba'.*gemma2, gemma3, gemma4, glm4moe, gpt-oss, granite, lfm2, lfm2moe, llama, mistral3, olmo2, phi3, qwen2, qwen3, qwen3moe, qwen35, qwen35moe, smollm3"):
        _engine.Engine(str(path), n_threads=1)


def test_moe_hyper_parameters_out_of_range_name_the_key(tmp_path):
    """More experts per token than the layer has, or an unknown gating function: the error names the key."""
    path = write_test_model(tmp_path / "a.gguf", "qwen3moe", moe={"n_used": 9})
    with pytest.raises(_engine.GGUFError, match=r"'qwen3moe.expert_used_count' is 9, outside \[1, 8\]"):
        _engine.Engine(str(path), n_threads=1)
    path = write_test_model(tmp_path / "b.gguf", "qwen3moe", moe={"gating": 7})
    with pytest.raises(_engine.GGUFError, match=r"'qwen3moe.expert_gating_func' is 7, outside \[1, 3\]"):
        _engine.Engine(str(path), n_threads=1)


def test_an_unknown_rope_scaling_names_the_key_and_the_choices(tmp_path):
    path = write_test_model(tmp_path / "m.gguf", "llama", rope_scaling={"type": "dynamic", "factor": 2.0})
    with pytest.raises(_engine.GGUFError, match="unsupported rope.scaling.type 'dynamic'.*none, linear, yarn, longrope"):
        _engine.Engine(str(path), n_threads=1)


@pytest.mark.parametrize("arch", ["qwen3moe", "glm4moe", "gpt-oss", "qwen35moe", "lfm2moe"])
def test_a_moe_architecture_without_its_expert_count_names_the_key(tmp_path, arch):
    path = write_test_model(tmp_path / "m.gguf", arch, drop=[f"{arch}.expert_count"])
    with pytest.raises(_engine.GGUFError, match=rf"missing metadata key '{arch}.expert_count'"):
        _engine.Engine(str(path), n_threads=1)


@pytest.mark.parametrize("key,value,message", [
    ("qwen3moe.expert_count", 16, r"tensor 'blk.0.ffn_gate_inp.weight' has shape \[64, 8\], expected \[64, 16\]"),
    ("qwen3moe.expert_feed_forward_length", 32,
     r"tensor 'blk.0.ffn_gate_exps.weight' has shape \[64, 64, 8\], expected \[64, 32, 8\]"),
    ("qwen3moe.embedding_length", 48, r"tensor 'token_embd.weight' has shape \[64, 300\], expected \[48, 300\]"),
])
def test_hyper_parameters_that_do_not_match_the_tensors_name_the_tensor(tmp_path, key, value, message):
    """The expert count, an expert's width or the model width in the header against the tensors' shapes."""
    from support.llamacpp_cases import Control

    path = Control("qwen3moe-F32", key, keys={key: value}).write(
        write_test_model(tmp_path / "a.gguf", "qwen3moe"), tmp_path / "b.gguf")
    with pytest.raises(_engine.GGUFError, match=message):
        _engine.Engine(str(path), n_threads=1)
