"""How scripts/function_lengths.py measures a function (the house rule: ≤ 60 lines, held by
test_layers.py::test_no_function_over_60_lines): a C++ function from its template line or return type to its
closing brace, what it holds (lambdas, local classes) counted in it, a class's member functions each on its
own; a Python function with its decorators and docstring. Each measure is seen to fail where it should."""
from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from support.paths import SCRIPTS

_spec = importlib.util.spec_from_file_location("function_lengths", SCRIPTS / "function_lengths.py")
fl = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(fl)


def _body(n: int) -> str:
    return "".join(f"  x += {i};\n" for i in range(n))


def _measured(tmp_path, name: str, text: str) -> dict[str, int]:
    f = tmp_path / name
    f.write_text(text)
    return {where.split(" ", 1)[1]: n for n, where in fl.lengths(f)}


def test_cpp_functions_free_member_template_and_lambdas(tmp_path):
    text = ("#include <vector>\n"
            "int free_fn(int x) {\n" + _body(5) + "  return x;\n}\n"
            "template <class T>\nT twice(T x) {\n  return x + x;\n}\n"
            "struct S {\n  int get() const { return 1; }\n  void set(int v);\n};\n"
            "void S::set(int v) {\n  auto f = [&](int y) {\n" + _body(3) + "    return y;\n  };\n  f(v);\n}\n")
    assert _measured(tmp_path, "a.cpp", text) == {"free_fn": 8, "twice": 4, "get": 1, "S::set": 9}


def test_a_long_cpp_function_fails_the_rule(tmp_path):
    f = tmp_path / "long.cpp"
    f.write_text("int long_fn(int x) {\n" + _body(58) + "  return x;\n}\n")  # 61 lines
    r = subprocess.run([sys.executable, str(SCRIPTS / "function_lengths.py"), "--over", "60", "--fail", "60", str(f)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and "61" in r.stdout and "long_fn" in r.stdout, r.stdout


def test_python_functions_count_decorators_docstrings_and_closures(tmp_path):
    text = ("import functools\n\n\n@functools.cache\ndef f():\n    \"\"\"doc\"\"\"\n    def g():\n        return 1\n"
            "    return g\n")
    assert _measured(tmp_path, "m.py", text) == {"f": 6, "g": 2}


@pytest.mark.parametrize("n, fails", [(60, False), (61, True)])
def test_the_bound_is_60(tmp_path, n, fails):
    f = tmp_path / "m.py"
    f.write_text("def f():\n" + "    x = 1\n" * (n - 2) + "    return x\n")
    r = subprocess.run([sys.executable, str(SCRIPTS / "function_lengths.py"), "--fail", "60", str(f)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == int(fails), r.stdout
