"""The package's layer order holds: engine → openai / anthropic (the API layer: each API's shapes over the
one chat serving) → server → cli, each importing only its own layer or those below; bench (a client of any server) imports none of them. `pyserve/__init__.py` is the facade that
re-exports from every layer, and `_engine` (the compiled extension) is below them all."""
from __future__ import annotations

import ast
from pathlib import Path

import pyserve

ROOT = Path(pyserve.__file__).resolve().parent
ORDER = {"_engine": 0, "engine": 1, "openai": 2, "anthropic": 2, "server": 3, "cli": 4, "__main__": 5}


def _layer(module: str) -> str:
    """'pyserve.openai.protocol' → 'openai'; 'pyserve' → ''."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def _imports(path: Path, module: str):
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


def _modules():
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
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


def _attribute_chains(path: Path):
    """Every dotted attribute chain in a module, as text ('engine.llm.engine.stats')."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Attribute) and not isinstance(getattr(node, "parent", None), ast.Attribute):
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


def test_wire_framing_is_the_servers():
    """SSE and JSON encoding are HTTP: below the server the layers hand up response models and events
    (openai/streaming.py), never bytes framed for the wire, and never import an HTTP framework."""
    bad = []
    for path, module in _modules():
        if _layer(module) not in ("engine", "openai"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        bad += [f"{module}:{n.lineno} frames SSE: {n.value!r}" for n in ast.walk(tree)
                if isinstance(n, ast.Constant) and isinstance(n.value, bytes) and n.value.startswith(b"data:")]
        bad += [f"{module}:{n.lineno} imports {a.name}" for n in ast.walk(tree) if isinstance(n, ast.Import)
                for a in n.names if a.name.split(".")[0] in ("quart", "hypercorn")]
        bad += [f"{module}:{n.lineno} imports {n.module}" for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[0] in ("quart", "hypercorn")]
    assert not bad, "\n".join(bad)


def test_no_function_over_60_lines():
    """The house rule (scripts/function_lengths.py), held by the suite."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "scripts" / "function_lengths.py"  # the clone's, not the install's
    r = subprocess.run([sys.executable, str(script), "--over", "60", "--fail", "60", str(ROOT)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout
