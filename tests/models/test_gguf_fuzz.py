"""Malformed model files: the GGUF loader and the model loader only ever fail with a clear error.

A bounded run of scripts/fuzz_gguf.py (structure-aware mutations of a small valid GGUF, small random
llama / qwen2 / gemma3 models and the head of the real Gemma 3 file) in a subprocess, so that a hard crash
is caught too; plus deterministic sweeps (every truncation, every single-byte flip of the header) and the
cases the fuzzer found.
"""
from __future__ import annotations

import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from pyserve import _engine
from support.model_factory import write_test_model
from support.paths import SCRIPTS

FUZZ_SECONDS = float(os.environ.get("PYSERVE_FUZZ_SECONDS", "15"))
CLEAR = (_engine.GGUFError, _engine.ModelError)


def load_fuzz():
    sys.path.insert(0, str(SCRIPTS))
    try:
        import fuzz_gguf
    finally:
        sys.path.pop(0)
    return fuzz_gguf


def test_fuzz_bounded_run(tmp_path):
    """Both targets (read_gguf, Engine load + 2 tokens) for a bounded time: no crash, no unclear error."""
    import pyserve

    here = str(Path(pyserve.__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=here + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, str(SCRIPTS / "fuzz_gguf.py"), "--seconds", str(FUZZ_SECONDS),
                           "--seed", "12345", "--crash-dir", str(tmp_path / "crashes")],
                          capture_output=True, text=True, timeout=FUZZ_SECONDS + 120, env=env)
    out = proc.stdout + proc.stderr
    print(out)
    assert proc.returncode == 0, out  # a signal (negative) or 1 (a finding)
    assert "findings 0" in out
    summary = next(line for line in out.splitlines() if " inputs in " in line)
    n = int(summary.split(" inputs in ")[0].rsplit(" ", 1)[1])
    assert n >= 200, summary  # it did run


def test_every_truncation_fails_cleanly(tmp_path):
    fuzz = load_fuzz()
    data = fuzz.small_valid_gguf(tmp_path / "v.gguf")
    p = tmp_path / "cut.gguf"
    end_of_table = max(at + w for at, w in fuzz.field_offsets(data))
    _, tensors, _ = _engine.read_gguf(str(tmp_path / "v.gguf"))
    end_of_data = (end_of_table + 31) // 32 * 32 + max(t["offset"] + t["nbytes"] for t in tensors)
    assert end_of_data <= len(data)  # (the rest is alignment padding: cutting it is fine)
    for n in list(range(0, end_of_table + 40)) + list(range(end_of_table + 40, end_of_data, 7)):
        p.write_bytes(data[:n])
        with pytest.raises(_engine.GGUFError) as e:
            _engine.read_gguf(str(p))
        assert str(p) in str(e.value)


def test_every_header_byte_flip(tmp_path):
    """Each byte of the metadata and tensor table of a small model, flipped: it loads or fails clearly."""
    fuzz = load_fuzz()
    model = write_test_model(tmp_path / "m.gguf", "llama", qtype="Q8_0", n_ctx=32, n_layer=1)
    data = model.read_bytes()
    end_of_table = max(at + w for at, w in fuzz.field_offsets(data))
    p = tmp_path / "flip.gguf"
    for i in range(0, end_of_table, 3):
        bad = bytearray(data)
        bad[i] ^= 0xFF
        p.write_bytes(bad)
        try:
            _engine.read_gguf(str(p))
        except CLEAR:
            pass


# ---- what the fuzzer found ----

def _with_kv(tmp_path, arch="llama", **kv):
    """A small model with some metadata values replaced (same type, patched in place)."""
    fuzz = load_fuzz()
    path = write_test_model(tmp_path / "m.gguf", arch, qtype="F32", n_ctx=32)
    data = bytearray(path.read_bytes())
    for key, value in kv.items():
        k = key.replace("__", ".").encode()
        at = data.index(struct.pack("<Q", len(k)) + k) + 8 + len(k)
        t = struct.unpack_from("<I", data, at)[0]
        if t in (4, 5) and not -(2**31) <= value < 2**32:
            # widen the u32 to a u64 and keep the tensor data where it was (aligned to 32)
            table_end = max(a + w for a, w in fuzz.field_offsets(bytes(data)))
            pad = (table_end + 31) // 32 * 32 - table_end
            struct.pack_into("<I", data, at, 10)
            data[at + 4:at + 4] = b"\0" * 4
            if pad >= 4:
                del data[table_end + 4:table_end + 8]
            else:
                data[table_end + 4:table_end + 4] = b"\0" * 28
            t = 10
        fmt = {4: "<I", 5: "<i", 10: "<Q", 11: "<q"}[t]
        struct.pack_into(fmt, data, at + 4, value)
    path.write_bytes(bytes(data))
    _engine.read_gguf(str(path))  # still a well-formed file
    return path


@pytest.mark.parametrize("key,value", [
    ("llama__block_count", 2**31 - 1),      # was std::bad_alloc (MemoryError) sizing the layer table
    ("llama__block_count", 2**32 + 2),      # wrapped to 2 as an int
    ("llama__embedding_length", 2**32 + 64),
    ("llama__attention__head_count", 2**31 - 1),
    ("llama__context_length", 0),
    ("llama__context_length", 2**32 - 1),
])
def test_out_of_range_hparams(tmp_path, key, value):
    path = _with_kv(tmp_path, **{key: value})
    with pytest.raises(_engine.GGUFError, match=key.replace("__", r"\.")) as e:
        _engine.Engine(str(path), n_threads=1)
    assert str(path) in str(e.value)


def test_invalid_utf8_strings_and_names(tmp_path):
    """Bytes that are not UTF-8 in a key, a string value or a tensor name: read_gguf gives them back as
    surrogate escapes (it raised UnicodeDecodeError), tensor_data takes such a name back, and an error
    message naming one is printable."""
    fuzz = load_fuzz()
    data = bytearray(fuzz.small_valid_gguf(tmp_path / "v.gguf"))
    for old, new in ((b"t.str", b"t.\xff\xfe\x01"), (b"h\xc3\xa9llo", b"h\xe9\xc3llo"), (b"second", b"s\xffcond")):
        at = data.index(old)
        data[at:at + len(old)] = new
    p = tmp_path / "u.gguf"
    p.write_bytes(bytes(data))
    meta, tensors, _ = _engine.read_gguf(str(p))
    assert meta["t.\udcff\udcfe\x01"] == "h\udce9\udcc3llo ▁ world"
    name = "s\udcffcond"
    assert name in [t["name"] for t in tensors]
    assert len(_engine.tensor_data(str(p), name)) == 16
    # a duplicate name made of such bytes: the message escapes them
    data2 = bytearray(data)
    at = data2.index(b"blk.0.attn_q.weight")
    data2[at:at + 19] = b"s\xffcond".ljust(19, b"\x00")
    struct.pack_into("<Q", data2, at - 8, 6)
    del data2[at + 6:at + 19]
    p.write_bytes(bytes(data2))
    with pytest.raises(_engine.GGUFError) as e:
        _engine.read_gguf(str(p))
    assert "\\xff" in str(e.value) or "outside" in str(e.value) or "truncated" in str(e.value)


def test_unsupported_arch_name_not_utf8(tmp_path):
    fuzz = load_fuzz()
    data = bytearray(fuzz.small_valid_gguf(tmp_path / "v.gguf"))
    at = data.index(b"llama")
    data[at:at + 5] = b"ll\xffma"
    p = tmp_path / "a.gguf"
    p.write_bytes(bytes(data))
    with pytest.raises(_engine.ModelError, match=r"ll\\xffma"):
        _engine.Engine(str(p), n_threads=1)
