"""scripts/gguf_repeat_layers.py, the benchmarks' deeper files: layer i of the output is the input's layer
i mod n byte for byte, the other tensors and every key are copied, and a copy at the same depth is the same
model (the same tokens and logprobs)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np

from pyserve import LLM, SamplingParams
from support import model_factory as tm
from support.paths import SCRIPTS

SCRIPT = SCRIPTS / "gguf_repeat_layers.py"
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, logprobs=2, seed=0)


def _repeat(src: Path, dst: Path, layers: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(src), str(dst), "--layers", str(layers)],
                          capture_output=True, text=True, timeout=120)


def _tensors(path: Path) -> dict[str, np.ndarray]:
    return {t.name: np.array(t.data) for t in gguf.GGUFReader(str(path)).tensors}


def test_layers_repeated_byte_for_byte(tmp_path):
    src = tm.write_test_model(tmp_path / "a.gguf", "llama", qtype="Q4_K", n_layer=2)
    assert _repeat(src, tmp_path / "b.gguf", 5).returncode == 0
    a, b = _tensors(src), _tensors(tmp_path / "b.gguf")
    r = gguf.GGUFReader(str(tmp_path / "b.gguf"))
    assert r.fields["llama.block_count"].contents() == 5
    per_layer = sorted(n.split(".", 2)[2] for n in a if n.startswith("blk.0."))
    assert len(b) == len(a) - 2 * len(per_layer) + 5 * len(per_layer)
    for il in range(5):
        for name in per_layer:
            assert np.array_equal(b[f"blk.{il}.{name}"], a[f"blk.{il % 2}.{name}"])
    for name in (n for n in a if not n.startswith("blk.")):
        assert np.array_equal(b[name], a[name])
    assert LLM(str(tmp_path / "b.gguf"), n_threads=1).engine.hparams["n_layer"] == 5


def test_same_depth_is_the_same_model(tmp_path):
    src = tm.write_test_model(tmp_path / "a.gguf", "qwen3", qtype="Q8_0", n_layer=2)
    assert _repeat(src, tmp_path / "b.gguf", 2).returncode == 0
    prompt = ["The quick brown fox"]
    before, after = (LLM(str(p), n_threads=1).generate(prompt, GREEDY)[0].outputs[0] for p in (src, tmp_path / "b.gguf"))
    assert (after.token_ids, after.logprobs) == (before.token_ids, before.logprobs)
    assert len(before.token_ids) == 8


def test_per_layer_keys_are_refused(tmp_path):
    src = tm.write_test_model(tmp_path / "h.gguf", "lfm2")  # head_count_kv: one entry per layer
    proc = _repeat(src, tmp_path / "out.gguf", 8)
    assert proc.returncode != 0 and "is per layer: not supported" in proc.stderr
