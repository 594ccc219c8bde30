"""A deeper GGUF file for benchmarks: a file's blocks repeated until it has N layers, everything else copied.

    python3 scripts/gguf_repeat_layers.py IN.gguf OUT.gguf --layers 36

tests/support/model_factory.py holds a model's tensors in f32 while it writes them, so it cannot write a Qwen3-4B-shaped
file of all 36 layers in 24 GB; it can write one of 12. This copies that file's quantized tensors byte for byte
(gguf-py's reader maps the input, the writer streams each tensor out) with layer i of the output the input's
layer i mod n, and `<arch>.block_count` set to N: a file of the real model's size and shape, for speed and
start-up figures (random weights run at the speed of real ones). Only for architectures whose per-layer keys
are scalars (a per-layer array such as head_count_kv of a hybrid is refused).
"""
from __future__ import annotations

import argparse
import re

import gguf

BLOCK = re.compile(r"blk\.(\d+)\.(.*)")


def copy_keys(r: gguf.GGUFReader, w: gguf.GGUFWriter, arch: str, n_in: int, n_out: int) -> None:
    for key, field in r.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = field.contents()
        if key == f"{arch}.block_count":
            value = n_out
        elif key.startswith(arch + ".") and sub is not None and len(value) == n_in:
            raise SystemExit(f"{key} is per layer: not supported")
        w.add_key_value(key, value, vtype, sub_type=sub)


def tensors_out(r: gguf.GGUFReader, n_in: int, n_out: int) -> list[tuple[str, object]]:
    """(name, reader tensor) in the output's order: the non-block tensors, then layer 0..n_out-1."""
    blocks: dict[int, list] = {}
    rest = []
    for t in r.tensors:
        m = BLOCK.fullmatch(t.name)
        (blocks.setdefault(int(m.group(1)), []) if m else rest).append(t)
    out = [(t.name, t) for t in rest]
    for il in range(n_out):
        out += [(f"blk.{il}.{BLOCK.fullmatch(t.name).group(2)}", t) for t in blocks[il % n_in]]
    return out


def repeat_layers(src: str, dst: str, layers: int) -> str:
    """Writes dst: src with its blocks repeated (or cut) to `layers`; returns a line saying what it wrote."""
    r = gguf.GGUFReader(src)
    arch = r.fields["general.architecture"].contents()
    n_in = r.fields[f"{arch}.block_count"].contents()
    w = gguf.GGUFWriter(dst, arch)
    copy_keys(r, w, arch, n_in, layers)
    plan = tensors_out(r, n_in, layers)
    for name, t in plan:
        w.add_tensor_info(name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for _, t in plan:
        w.write_tensor_data(t.data)
    w.close()
    return f"{dst}: {arch}, {layers} layers (from {n_in}), {len(plan)} tensors"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    ap.add_argument("--layers", type=int, required=True)
    args = ap.parse_args()
    print(repeat_layers(args.src, args.dst, args.layers))


if __name__ == "__main__":
    main()
