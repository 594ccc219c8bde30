"""lm-eval-harness against `pyserve serve`: a local multiple-choice task scored by log-likelihood.

    python -m venv /tmp/lmeval && /tmp/lmeval/bin/pip install "lm-eval[api]"     # once (no torch needed)
    python scripts/eval_lm_eval.py --lm-eval /tmp/lmeval/bin/lm_eval [--model PATH] [--limit N]

Starts a server on a free loopback port (the pyserve this script imports), writes an lm-eval task around
scripts/lm_eval/mini_mc.jsonl, runs `lm_eval run --model local-completions` with `tokenizer_backend=remote`
(the server's own tokenizer through /tokenizer_info, /tokenize, /detokenize), and prints lm-eval's table
and the accuracy. Outside CI: lm-eval is not a test dependency.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from pyserve.bench.launch import ServerProcess

DATA = Path(__file__).resolve().parent / "lm_eval" / "mini_mc.jsonl"
TASK = """task: pyserve_mini_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_choice: choices
doc_to_target: answer
metric_list:
  - metric: acc
    aggregation: mean
    higher_is_better: true
"""


def run_lm_eval(lm_eval: str, url: str, model: str, limit: int, out: Path) -> subprocess.CompletedProcess:
    tasks = out / "tasks"
    tasks.mkdir()
    (tasks / "pyserve_mini_mc.yaml").write_text(TASK.format(data=DATA))
    args = [lm_eval, "run", "--model", "local-completions", "--tasks", "pyserve_mini_mc",
            "--include_path", str(tasks), "--output_path", str(out / "results"),
            "--model_args", f"base_url={url}/v1/completions,model={model},tokenizer_backend=remote,"
                            f"num_concurrent=2,max_retries=1"]
    if limit:
        args += ["--limit", str(limit)]
    return subprocess.run(args, capture_output=True, text=True, timeout=1800)


def accuracy(out: Path) -> float:
    files = sorted((out / "results").rglob("results_*.json"))
    results = json.loads(files[-1].read_text())["results"]["pyserve_mini_mc"]
    return results["acc,none"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lm-eval", default="lm_eval", help="the lm_eval command (e.g. of its own venv)")
    ap.add_argument("--model", default=None, help="a GGUF (default: the default model)")
    ap.add_argument("--limit", type=int, default=0, help="questions (0: all 20)")
    args = ap.parse_args()
    extra = ["--model", args.model] if args.model else []
    with ServerProcess(*extra, "--served-model-name", "pyserve-eval") as srv, \
            tempfile.TemporaryDirectory() as tmp:
        done = run_lm_eval(args.lm_eval, srv.url, "pyserve-eval", args.limit, Path(tmp))
        print(done.stdout[-4000:])
        if done.returncode != 0:
            print(done.stderr[-6000:], file=sys.stderr)
            return done.returncode
        print(f"pyserve_mini_mc accuracy: {accuracy(Path(tmp)):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
