"""The model families at the shapes users run, pyserve beside llama.cpp on the same files, in one run.

    python3 scripts/bench_families.py [--llama-bench BIN/llama-bench [--llama-lib DIR]] [--families ...] [--rounds 2]
        [--folder DIR]

Each family's file is written by tests/support/model_factory.py with random weights (they run at the speed of real
ones) at the real model's widths, the real vocabulary (tests/data/vocab's: Qwen's 151,936 tokens, Llama 3's
128,256), the real tied or separate head and, for the mixtures of experts, their real expert counts and sizes
but fewer layers, quantized as Q4_K_M files are (Q4_K; Q6_K for attn_v, ffn_down and the output head, which
a tied embedding is), as Q8_0 files are (names ending in q8_0) or, for gpt-oss, with MXFP4 experts beside
Q8_0. pyserve's offline engine (scripts/bench_moe.py's bench: 512-token prefill, one decoded
stream, 8 streams) and `llama-bench -t N -p 512 -n 64` alternate `--rounds` times; each keeps its best.
Decode is reported as the weight bytes a token reads (everything but the embedding table unless it is the
head too, the chosen experts' share of the expert tensors) × tokens/s, against --bandwidth (scripts/bench_bandwidth.py);
prefill as the weight multiply-adds a prompt token costs (every matrix but the embedding table and the output
head, which a prompt's last row alone needs; the chosen experts' share) × tokens/s, against the int8 peak of
the instructions the prefill kernels use (vpdpbusd on 256-bit vectors, and AMX's TDPBSSD where the engine
uses it), measured at the start (csrc/kernels/machine_limits.h). Without --llama-bench the llama.cpp figures are left out.
--llama-lib puts a folder first on llama-bench's library path: on a CPU with AMX, a libggml-cpu.so built
without it (ggml's AMX matmul crashes on these files there; docs/BENCHMARKS.md says how it was built).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from typing import NamedTuple

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from support import gguf_vocab  # noqa: E402
from support import model_factory as tm  # noqa: E402
from bench_bandwidth import read_bandwidth  # noqa: E402
from bench_engine import best_of  # noqa: E402
from bench_moe import bench  # noqa: E402
from gguf_repeat_layers import repeat_layers  # noqa: E402

Q4_K_M = {"default": "Q4_K", "attn_v": "Q6_K", "ffn_down": "Q6_K", "ffn_down_exps": "Q6_K", "output": "Q6_K"}
Q4_K_M_TIED = {**Q4_K_M, "token_embd": "Q6_K"}  # a tied head is quantized as the output (llama-quant.cpp)
MXFP4 = {"default": "Q8_0", "ffn_gate_exps": "MXFP4", "ffn_up_exps": "MXFP4", "ffn_down_exps": "MXFP4"}
Q8_0 = {"default": "Q8_0"}


class Family(NamedTuple):
    arch: str
    qtype: dict
    dims: dict            # widths from each model's config.json, layers fewer where the name says so
    moe: dict | None = None
    vocab: str = "qwen2"  # tests/data/vocab's: its size sets the embedding's and the head's rows
    tied: bool = False    # the head is the embedding table (Llama-3.2-1B and Qwen3-4B are)
    # Layers the factory writes, repeated to dims' n_layer by gguf_repeat_layers.py: a file the factory cannot
    # hold whole in memory (a whole Qwen3-4B was killed for memory on a 24 GB machine). None: written whole.
    written_layers: int | None = None


LLAMA_1B = dict(n_embd=2048, n_layer=16, n_head=32, n_head_kv=8, head_dim=64, n_ff=8192)
QWEN3_1_7B = dict(n_embd=2048, n_layer=28, n_head=16, n_head_kv=8, head_dim=128, n_ff=6144)
QWEN3_4B = dict(n_embd=2560, n_layer=36, n_head=32, n_head_kv=8, head_dim=128, n_ff=9728)
QWEN35_2B = dict(n_embd=2048, n_layer=24, n_head=8, n_head_kv=2, head_dim=256, n_ff=6144, ssm_state=128,
                 ssm_groups=16, ssm_v_heads=16)  # a guess at Qwen3.5-2B: 18 DeltaNet and 6 attention layers
# Qwen3.6-35B-A3B's widths (its config.json: 40 layers, every 4th full attention), 3 DeltaNet layers and 1 attention
QWEN36_35B = dict(n_embd=2048, n_layer=4, n_head=16, n_head_kv=2, head_dim=256, n_ff=512, ssm_state=128,
                  ssm_groups=16, ssm_v_heads=32)
QWEN36_MOE = {"n_expert": 256, "n_used": 8, "n_ff": 512}  # and one shared expert of 512, qwen35moe's
FAMILIES = {
    "qwen3-1.7b": Family("qwen3", Q4_K_M, QWEN3_1_7B),
    "qwen3-30b-a3b (2 of 48 layers)": Family("qwen3moe", Q4_K_M, dict(n_embd=2048, n_layer=2, n_head=32,
                                                                        n_head_kv=4, head_dim=128, n_ff=6144),
                                              {"n_expert": 128, "n_used": 8, "n_ff": 768}),
    "gpt-oss-20b (2 of 24 layers)": Family("gpt-oss", MXFP4, dict(n_embd=2880, n_layer=2, n_head=64, n_head_kv=8,
                                                                  head_dim=64, n_ff=2880, sliding_window=128),
                                           {"n_expert": 32, "n_used": 4, "n_ff": 2880}),
    "qwen3.5-2b-like": Family("qwen35", Q4_K_M, QWEN35_2B),
    "llama-3.2-1b": Family("llama", Q4_K_M_TIED, LLAMA_1B, vocab="llama-bpe", tied=True),
    "qwen3-4b": Family("qwen3", Q4_K_M_TIED, QWEN3_4B, tied=True, written_layers=6),
    "llama-3.2-1b q8_0": Family("llama", Q8_0, LLAMA_1B, vocab="llama-bpe", tied=True),
    "qwen3-1.7b q8_0": Family("qwen3", Q8_0, QWEN3_1_7B),
    "qwen3-4b q8_0": Family("qwen3", Q8_0, QWEN3_4B, tied=True, written_layers=6),
    "qwen3.5-2b-like q8_0": Family("qwen35", Q8_0, QWEN35_2B),
    "qwen3.6-35b-a3b (4 of 40 layers)": Family("qwen35moe", Q4_K_M, QWEN36_35B, QWEN36_MOE),
    "qwen3.6-35b-a3b q8_0 (4 of 40 layers)": Family("qwen35moe", Q8_0, QWEN36_35B, QWEN36_MOE),
}


def write(folder: str, name: str) -> str:
    """The family's file in `folder`, written unless a previous run left it there."""
    f = FAMILIES[name]
    path = os.path.join(folder, re.sub(r"[^\w.-]+", "_", name.split(" (")[0]) + ".gguf")
    if os.path.exists(path):
        return path
    layers = f.written_layers or f.dims["n_layer"]
    part = path + ".part" if layers != f.dims["n_layer"] else path
    tm.write_test_model(part, f.arch, qtype=f.qtype, moe=f.moe, tied=f.tied, vocab=gguf_vocab.vocab_meta(f.vocab),
                        n_ctx=4096, **dict(f.dims, n_layer=layers))
    if part != path:
        repeat_layers(part, path, f.dims["n_layer"])
        os.remove(part)
    return path


def active_bytes(path: str) -> float:
    """Weight bytes one decoded token reads: all tensors but the embedding table (unless it is the head too);
    of the experts' tensors the n_used / n_expert share."""
    return per_token(path)[0]


def per_token(path: str) -> tuple[float, float]:
    """(weight bytes a decoded token reads, weight multiply-adds a prompt token costs): bytes as active_bytes
    says; multiply-adds over the matrices but the embedding table and the output head (a prompt needs the
    head for its last row alone), the experts' by the same share."""
    from gguf import GGUFReader

    r = GGUFReader(path)
    arch = str(bytes(r.fields["general.architecture"].parts[-1]), "utf-8")
    used = r.fields.get(f"{arch}.expert_used_count")
    count = r.fields.get(f"{arch}.expert_count")
    share = float(used.parts[-1][0]) / float(count.parts[-1][0]) if used and count else 1.0
    tied = not any(t.name == "output.weight" for t in r.tensors)
    read = macs = 0.0
    for t in r.tensors:
        part = share if "_exps" in t.name else 1.0
        if t.name != "token_embd.weight" or tied:
            read += t.n_bytes * part
        if t.name not in ("token_embd.weight", "output.weight") and len(t.shape) >= 2:
            macs += int(t.n_elements) * part
    return read, macs


def int8_peaks(threads: int) -> dict:
    """{instruction: multiply-adds/s of `threads` threads}: vpdpbusd, and AMX's TDPBSSD where the engine uses it."""
    from pyserve._engine import testing

    peaks = {"vpdpbusd": testing.int8_peak_macs(threads)}
    if testing.simd().get("amx"):
        peaks["AMX"] = testing.int8_peak_macs(threads, amx=True)
    return peaks


def decode_share(path: str, threads: int, rounds: int = 8, tokens: int = 16) -> float:
    """Decode's share of the read bandwidth measured in the same seconds: `rounds` times, a read (bench_bandwidth.py's
    loop, the best of 3 passes over 1 GiB), `tokens` decoded tokens, another read; the median over the rounds
    of the weight bytes read per second over the mean of its two reads. On a shared machine whose bandwidth
    swings 2x from one minute to the next, the best decode over the best read mixes different minutes."""
    import statistics

    from bench_engine import one_stream_decode, synthetic_prompt
    from pyserve import _engine

    eng = _engine.Engine(path, n_threads=threads, enable_prefix_caching=False)
    vocab, per_tok = eng.hparams["n_vocab"], per_token(path)[0]
    one_stream_decode(eng, synthetic_prompt(8, vocab, 2), 4, "warm")  # the weights touched once
    shares = []
    for r in range(rounds):
        before = read_bandwidth(threads, 1024, 3)
        tok_s = one_stream_decode(eng, synthetic_prompt(8, vocab, 3 + r), tokens, f"share{r}")
        shares.append(tok_s * per_tok / ((before + read_bandwidth(threads, 1024, 3)) / 2))
    return statistics.median(shares)


def llama_bench(binary: str, lib: str | None, path: str, threads: int) -> dict:
    """llama-bench's prefill and decode tokens/s on `path`; {} if it fails (its error printed)."""
    cmd = [binary, "-m", path, "-t", str(threads), "-p", "512", "-n", "64", "-r", "1", "-o", "json"]
    env = {**os.environ, "LD_LIBRARY_PATH": lib} if lib else None
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        print(f"llama-bench failed on {path} (rc {p.returncode}): {p.stderr[-300:]}", flush=True)
        return {}
    rows = json.loads(p.stdout)
    return {("prefill_tok_s" if row["n_prompt"] else "decode_tok_s"): row["avg_ts"] for row in rows}


def peak_shares(macs_per_s: float, peaks: dict) -> str:
    """What share of each int8 peak (int8_peaks) a rate of multiply-adds is."""
    return ", ".join(f"{100 * macs_per_s / p:.1f} % of {k}'s {p / 1e9:,.0f} GMAC/s" for k, p in peaks.items())


def side_by_side(path: str, threads: int, rounds: int, binary: str | None, lib: str | None) -> tuple[dict, dict]:
    """(pyserve's figures, llama-bench's) on `path`, alternated `rounds` times, each one's best kept (load from
    elsewhere hits both); llama-bench's {} without a binary."""
    ours: dict = {}
    theirs: dict = {}
    for _ in range(rounds):
        best_of(ours, bench(path, threads))
        if binary:
            best_of(theirs, llama_bench(binary, lib, path, threads))
    return ours, theirs


def beside(ours: float, theirs: float | None) -> str:
    """"ours / theirs (ratio×)", or "ours / —" without a llama.cpp figure."""
    return f"{ours:.1f} / {theirs:.1f} (**{ours / theirs:.2f}×**)" if theirs else f"{ours:.1f} / —"


def report(name: str, path: str, ours: dict, theirs: dict, bandwidth: float, peaks: dict) -> None:
    per_tok, macs = per_token(path)
    dec, pre = ours["decode_tok_s"], ours["prefill_tok_s"]
    print(f"| {name} | {os.path.getsize(path) / 2**20:,.0f} MiB | {per_tok / 2**20:,.0f} MiB | "
          f"{beside(dec, theirs.get('decode_tok_s'))} | {dec * per_tok / 1e9:.1f} GB/s "
          f"({100 * dec * per_tok / 1e9 / bandwidth:.0f} %) | {beside(pre, theirs.get('prefill_tok_s'))} | "
          f"{pre * macs / 1e9:,.0f} GMAC/s ({peak_shares(pre * macs, peaks)}) | {ours['batch8_tok_s']:.1f} |",
          flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--llama-bench", default=None, help="llama-bench from ../shared/tools/build_peer.sh")
    ap.add_argument("--llama-lib", default=None, help="a folder put first on llama-bench's library path")
    ap.add_argument("--families", default=",".join(FAMILIES), help="comma-separated names of FAMILIES")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--bandwidth", type=float, default=None,
                    help="GB/s read with --threads (default: bench_bandwidth.py's, measured at the start)")
    ap.add_argument("--folder", default=None, help="write the files here and reuse them (default: a temporary one)")
    args = ap.parse_args()
    if args.bandwidth is None:
        args.bandwidth = read_bandwidth(args.threads, 2048, 5) / 1e9
        print(f"read bandwidth, {args.threads} threads: {args.bandwidth:.1f} GB/s (bench_bandwidth.py)")
    peaks = int8_peaks(args.threads)
    print(f"int8 peak, {args.threads} threads: " + ", ".join(f"{k} {p / 1e9:,.0f} GMAC/s" for k, p in peaks.items()))
    print("| family | file | read per token | decode tok/s pyserve / llama.cpp | pyserve read | "
          "512-token prefill tok/s pyserve / llama.cpp | pyserve prefill (of the int8 peak) | "
          "pyserve 8 streams tok/s |\n|---|---|---|---|---|---|---|---|")
    for name in args.families.split(","):
        with tempfile.TemporaryDirectory() as tmp:
            path = write(args.folder or tmp, name)
            ours, theirs = side_by_side(path, args.threads, args.rounds, args.llama_bench, args.llama_lib)
            report(name, path, ours, theirs, args.bandwidth, peaks)


if __name__ == "__main__":
    main()
