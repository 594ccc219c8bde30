"""Functions longer than a bound, longest first (the house rule: none over 60 lines in pyserve/ or csrc/).

    python scripts/function_lengths.py [--over 40] [--fail 60] [PATH ...]     (default PATH: pyserve csrc)

A Python function's length is its source lines, decorators and docstring included, nested functions counted
in their parent too (a closure is part of the function that defines it). A C++ function's (.h, .cpp) is its
lines from its template header or return type to its closing brace, as tree-sitter's C++ grammar parses it
(no preprocessor, no include paths needed); lambdas and local classes count in the function that holds them,
a class's member functions each on its own. Exits 1 when any exceeds --fail.
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

CPP_SUFFIXES = (".h", ".cpp")


def python_lengths(path: Path):
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            start = min([node.lineno] + [d.lineno for d in node.decorator_list])
            yield node.end_lineno - start + 1, f"{path}:{node.lineno} {node.name}"


def _cpp_parser():
    import tree_sitter_cpp
    from tree_sitter import Language, Parser

    return Parser(Language(tree_sitter_cpp.language()))


def _cpp_name(node) -> str:
    """The declarator's name ('Engine::step', 'operator()'), or '?'."""
    d = node.child_by_field_name("declarator")
    while d is not None and d.type != "function_declarator":
        d = d.child_by_field_name("declarator")
    inner = d.child_by_field_name("declarator") if d is not None else None
    return inner.text.decode() if inner is not None else "?"


def _outermost_functions(node):
    """The function definitions under `node` that no other function definition holds."""
    if node.type == "function_definition":
        yield node
        return
    for child in node.children:
        yield from _outermost_functions(child)


def cpp_lengths(path: Path, parser=None):
    tree = (parser or _cpp_parser()).parse(path.read_bytes())
    for fn in _outermost_functions(tree.root_node):
        top = fn.parent if fn.parent is not None and fn.parent.type == "template_declaration" else fn
        n = fn.end_point[0] - top.start_point[0] + 1
        yield n, f"{path}:{top.start_point[0] + 1} {_cpp_name(fn)}"


def lengths(path: Path, parser=None):
    """(lines, 'path:line name') of every function of a Python or C++ file."""
    if path.suffix in CPP_SUFFIXES:
        return list(cpp_lengths(path, parser))
    return list(python_lengths(path))


def source_files(root: Path) -> list[Path]:
    if not root.is_dir():
        return [root]
    return sorted(p for p in root.rglob("*") if p.suffix in (".py",) + CPP_SUFFIXES)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("paths", nargs="*", default=["pyserve", "csrc"])
    ap.add_argument("--over", type=int, default=40, help="list functions longer than this")
    ap.add_argument("--fail", type=int, default=0, help="exit 1 if any is longer than this (0: never)")
    args = ap.parse_args()
    files = [f for p in args.paths for f in source_files(Path(p))]
    parser = _cpp_parser() if any(f.suffix in CPP_SUFFIXES for f in files) else None
    found, total_lines = [], 0
    for f in files:
        total_lines += len(f.read_text(encoding="utf-8").splitlines())
        found += [x for x in lengths(f, parser) if x[0] > args.over]
    for n, where in sorted(found, reverse=True):
        print(f"{n:4d}  {where}")
    print(f"{len(found)} functions over {args.over} lines in {len(files)} files; {total_lines} lines in all")
    return 1 if args.fail and any(n > args.fail for n, _ in found) else 0


if __name__ == "__main__":
    sys.exit(main())
