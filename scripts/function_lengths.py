"""Functions in a Python tree longer than a bound, longest first (the house rule: none over 60 in pyserve/).

    python scripts/function_lengths.py [--over 40] [PATH ...]     (default PATH: pyserve)

A function's length is its source lines, decorators and docstring included, nested functions counted in
their parent too (a closure is part of the function that defines it). Exits 1 when any exceeds --fail.
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path


def lengths(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            yield node.end_lineno - start + 1, f"{path}:{node.lineno} {node.name}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="*", default=["pyserve"])
    ap.add_argument("--over", type=int, default=40, help="list functions longer than this")
    ap.add_argument("--fail", type=int, default=0, help="exit 1 if any is longer than this (0: never)")
    args = ap.parse_args()
    found, total_lines = [], 0
    for p in args.paths:
        for f in sorted(Path(p).rglob("*.py")) if Path(p).is_dir() else [Path(p)]:
            total_lines += len(f.read_text(encoding="utf-8").splitlines())
            found += [x for x in lengths(f) if x[0] > args.over]
    for n, where in sorted(found, reverse=True):
        print(f"{n:4d}  {where}")
    print(f"{len(found)} functions over {args.over} lines; {total_lines} lines in all")
    return 1 if args.fail and any(n > args.fail for n, _ in found) else 0


if __name__ == "__main__":
    sys.exit(main())
