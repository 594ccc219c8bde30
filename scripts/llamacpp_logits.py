"""llama.cpp's prompt logits for a list of files (run by scripts/llamacpp_reference.py in the peer's venv, the
one ../shared/tools/build_peer.sh makes: llama-cpp-python over the same llama.cpp build as llama-server).

Usage: $VENV_PEER/bin/python scripts/llamacpp_logits.py JOBS.json
JOBS.json: {"settings": [{n_batch, n_ubatch, flash_attn}, ...], "jobs": [{"path", "prompts": [[ids]], "out"}]}.
Writes each job's `out` (.npz): "s{i}_p{j}" = float32 [len(prompt j), n_vocab], the logits of every position
under setting i. Two threads, as the benchmarks run llama.cpp; weights in plain CPU buffers (_plain_buffers).
"""
import json
import sys

import llama_cpp.llama_cpp as llama_cpp
import numpy as np
from llama_cpp import Llama

_default_params = llama_cpp.llama_model_default_params


def _plain_buffers():
    """Weights in plain CPU buffers: this machine's AMX extra buffer crashes (SIGSEGV in
    ggml_backend_amx_mul_mat) on these files' small quantized matrices; the plain path is ggml's own vec_dot
    kernels, the ones its repacked and AMX paths are tested against."""
    p = _default_params()
    p.use_extra_bufts = False
    return p


llama_cpp.llama_model_default_params = _plain_buffers


def logits(path: str, prompts: list, setting: dict) -> list:
    llm = Llama(model_path=path, n_ctx=0, logits_all=True, n_threads=2, verbose=False, seed=0, **setting)
    out = []
    for toks in prompts:
        llm.reset()
        llm.eval(toks)
        out.append(np.array(llm.scores[: len(toks)], dtype=np.float32))
    del llm
    return out


def main(jobs_file: str) -> None:
    spec = json.load(open(jobs_file))
    for job in spec["jobs"]:
        arrays = {}
        try:
            for i, setting in enumerate(spec["settings"]):
                for j, a in enumerate(logits(job["path"], job["prompts"], setting)):
                    arrays[f"s{i}_p{j}"] = a
        except ValueError as e:  # llama.cpp refused the file: the caller reports it
            print("failed", job["path"], e, flush=True)
            continue
        np.savez(job["out"], **arrays)
        print("done", job["path"], flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
