"""The package's layer order holds: engine → api (each API family's package over a shared base: chat,
completions, responses, messages, …) → server → cli, each importing only its own layer or those below; bench
(a client of any server) imports none of them. `pyserve/__init__.py` is the facade that re-exports from every
layer, and `_engine` (the compiled extension) is below them all. Between packages, imports have no cycle."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pyserve
from support.graphs import cycles
from support.paths import REPO, SCRIPTS

ROOT = Path(pyserve.__file__).resolve().parent
ORDER = {"_engine": 0, "engine": 1, "api": 2, "server": 3, "cli": 4, "__main__": 5}


def _layer(module: str) -> str:
    """'pyserve.api.chat.protocol' → 'api'; 'pyserve' → ''."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _imports(path: Path, module: str):
    """Every pyserve name a module imports, dotted ('pyserve.api.base.protocol', 'pyserve.engine.llm.LLM')."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
                names = [target] if node.module else [f"{target}.{a.name}" for a in node.names]
            else:
                names = [f"{node.module}.{a.name}" for a in node.names]
            yield from (n for n in names if n == "pyserve" or n.startswith("pyserve."))
        elif isinstance(node, ast.Import):
            yield from (a.name for a in node.names if a.name.startswith("pyserve"))


def _modules(root: Path = ROOT):
    """(path, dotted module name) of every module under `root` (a package named as its folder)."""
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root.parent).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        yield path, ".".join(parts)


def _allowed(layer: str, target_layer: str) -> bool:
    if layer == "bench":
        return target_layer == "bench"
    if target_layer == "bench":
        return layer == "cli"  # the command line mounts `pyserve bench`
    return ORDER.get(target_layer, 99) <= ORDER[layer]


def test_no_module_imports_a_layer_above_its_own():
    bad, seen = [], 0
    for path, module in _modules():
        layer = _layer(module)
        if layer == "":
            continue  # the facade
        seen += 1
        bad += [f"{module} imports {t}" for t in _imports(path, module) if not _allowed(layer, _layer(t))]
    assert not bad, "\n".join(bad)
    assert seen > 20  # the walk saw the package


def package_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """{node: the other nodes its modules import from}: every folder with an __init__.py is a node, and so is
    each module at the top (the facade `pyserve`, `cli`, `__main__`, the extension `_engine`): a layer each."""
    modules = dict((m, p) for p, m in _modules(root))
    packages = {m for m, p in modules.items() if p.name == "__init__.py"}

    def node_of(name: str) -> str:
        parts = name.split(".")
        if len(parts) > 1 and ".".join(parts[:2]) not in packages:
            return ".".join(parts[:2])  # a module at the top (or the compiled extension, which has no .py)
        while name not in modules:  # 'pkg.module.Name' → 'pkg.module'
            name = name.rsplit(".", 1)[0]
        return name if name in packages else name.rsplit(".", 1)[0]

    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        own = node_of(module)
        graph.setdefault(own, set()).update({node_of(t) for t in _imports(path, module)} - {own})
    return graph


def test_the_package_graph_has_no_cycle():
    """No two packages import each other, directly or around a loop: the API families stand on api.base and
    api.template, a family that serves through another imports it and not the reverse (messages and
    responses → chat, infill → completions, tokens → chat), the server imports the API, never the other way."""
    graph = package_graph()
    assert not cycles(graph), cycles(graph)
    assert {"pyserve.api.base", "pyserve.api.chat", "pyserve.api.messages"} <= set(graph)  # the walk saw them
    assert "pyserve.api.chat" in graph["pyserve.api.messages"]


@pytest.mark.parametrize("files, expected", [
    ({"a/__init__.py": "from ..b import x\n", "b/__init__.py": "from ..a.m import y\n", "a/m.py": ""},
     [["pyserve.a", "pyserve.b"]]),
    ({"a/__init__.py": "from ..b import x\n", "b/__init__.py": "", "b/m.py": "from ..a import y\n"},
     [["pyserve.a", "pyserve.b"]]),
    ({"a/__init__.py": "from ..b import x\n", "b/__init__.py": "import pyserve.c\n", "c/__init__.py": ""}, []),
])
def test_a_package_cycle_is_found(tmp_path, files, expected):
    """The check fails where it should: packages that import each other through their __init__ or a module."""
    for name, text in {"__init__.py": "", **files}.items():
        (tmp_path / "pyserve" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pyserve" / name).write_text(text)
    assert cycles(package_graph(tmp_path / "pyserve")) == expected


def _attribute_chains(path: Path):
    """Every outermost dotted attribute chain in a module, as text ('engine.llm.engine.stats'), with its line."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            yield node.lineno, ast.unparse(node)


def test_the_native_engine_stays_inside_the_engine_layer():
    """Only pyserve/engine/ touches the compiled extension: the layers above read the model's config, hparams,
    metadata, stats and KV geometry through LLM / AsyncLLM / EngineOptions, never `_engine`, nor reach
    through an AsyncLLM to its LLM or native engine (`.llm.` chains)."""
    bad = []
    for path, module in _modules():
        if _layer(module) in ("engine", "_engine", ""):
            continue
        bad += [f"{module} imports {t}" for t in _imports(path, module) if _layer(t) == "_engine"]
        bad += [f"{module}:{line} reaches through: {chain}" for line, chain in _attribute_chains(path)
                if ".llm." in chain or chain.startswith("llm.engine")]
    bad += [f"{module}:{line} uses a test harness: {chain}" for path, module in _modules()
            for line, chain in _attribute_chains(path) if "_engine.testing" in chain]
    assert not bad, "\n".join(bad)


def test_attribute_chains_are_whole(tmp_path):
    """A chain is seen once, whole, wherever it stands (inside a call, an argument, a subscript)."""
    f = tmp_path / "m.py"
    f.write_text("x = a.llm.engine.stats()\ny = f(b.c)[d.e.g]\n")
    assert sorted(c for _, c in _attribute_chains(f)) == ["a.llm.engine.stats", "b.c", "d.e.g"]


def test_wire_framing_is_the_servers():
    """SSE and JSON encoding are HTTP: below the server the layers hand up reply models and events
    (api/base/streaming.py), never bytes framed for the wire, and never import an HTTP framework."""
    bad, seen = [], set()
    for path, module in _modules():
        if _layer(module) not in ("engine", "api"):
            continue
        seen.add(module.split(".")[2] if _layer(module) == "api" and module.count(".") > 1 else _layer(module))
        tree = ast.parse(path.read_text(encoding="utf-8"))
        bad += [f"{module}:{n.lineno} frames SSE: {n.value!r}" for n in ast.walk(tree)
                if isinstance(n, ast.Constant) and isinstance(n.value, bytes) and n.value.startswith(b"data:")]
        bad += [f"{module}:{n.lineno} imports {a.name}" for n in ast.walk(tree) if isinstance(n, ast.Import)
                for a in n.names if a.name.split(".")[0] in ("quart", "hypercorn")]
        bad += [f"{module}:{n.lineno} imports {n.module}" for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] in ("quart", "hypercorn")]
    assert not bad, "\n".join(bad)
    assert {"engine", "base", "chat", "messages", "responses"} <= seen  # Anthropic's Messages API included


def test_no_function_over_60_lines():
    """The house rule (scripts/function_lengths.py), held by the suite on both sides: pyserve/'s Python and
    csrc/'s C++ (the clone's trees and script)."""
    r = subprocess.run([sys.executable, str(SCRIPTS / "function_lengths.py"), "--over", "60", "--fail", "60",
                        str(REPO / "pyserve"), str(REPO / "csrc")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    files = int(re.search(r" in (\d+) files", r.stdout).group(1))
    assert files > 200, r.stdout  # it read both trees
