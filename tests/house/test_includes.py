"""csrc/ is folders by layer, and its #include lines say so: a file includes only headers of its own folder or
of the folders before it in the order CMakeLists.txt lists them (PYSERVE_CORE_LAYERS, then
PYSERVE_MODULE_LAYERS), so the include graph between folders runs one way and has no cycle."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from support.graphs import cycles
from support.paths import REPO

_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def layer_order(cmake: str) -> list[str]:
    """The layers, lowest first, as CMakeLists.txt sets them."""
    order = []
    for name in ("PYSERVE_CORE_LAYERS", "PYSERVE_MODULE_LAYERS"):
        m = re.search(rf"set\({name}\s+([^)#]*)\)", cmake)
        assert m, f"CMakeLists.txt sets no {name}"
        order += m.group(1).split()
    return order


def _folder(path: Path, csrc: Path) -> str:
    rel = path.parent.relative_to(csrc).as_posix()
    return "" if rel == "." else rel


def folder_graph(csrc: Path) -> dict[str, set[str]]:
    """{folder: the folders its files include from} ('' for csrc/ itself); an include that names no file
    under csrc/ maps to '?'+its text."""
    graph: dict[str, set[str]] = {}
    for f in sorted(p for p in csrc.rglob("*") if p.suffix in (".h", ".cpp")):
        folder = _folder(f, csrc)
        targets = graph.setdefault(folder, set())
        for inc in _INCLUDE.findall(f.read_text(encoding="utf-8")):
            target = csrc / inc
            targets.add(_folder(target, csrc) if target.is_file() else "?" + inc)
    return graph


def order_violations(graph: dict[str, set[str]], order: list[str]) -> list[str]:
    """Every include that names no header under csrc/, lies in a folder that is no layer, or runs up the order."""
    rank = {layer: i for i, layer in enumerate(order)}
    bad = []
    for folder, targets in sorted(graph.items()):
        if folder not in rank:
            bad.append(f"csrc/{folder}/ is no layer (add it to CMakeLists.txt's order)")
            continue
        for t in sorted(targets):
            if t.startswith("?"):
                bad.append(f"csrc/{folder}/ includes \"{t[1:]}\", which is no file under csrc/ (write "
                           "\"folder/name.h\")")
            elif t in rank and rank[t] > rank[folder]:
                bad.append(f"csrc/{folder}/ includes from csrc/{t}/, a layer above it")
    return bad


def test_every_include_runs_down_the_layer_order():
    order = layer_order((REPO / "CMakeLists.txt").read_text(encoding="utf-8"))
    graph = folder_graph(REPO / "csrc")
    assert not order_violations(graph, order), "\n".join(order_violations(graph, order))
    assert not cycles(graph)
    assert "" not in graph, "a file at csrc/'s top: every file belongs to a layer's folder"
    assert len(graph) >= 10 and sum(map(len, graph.values())) > 20  # the walk saw the tree


def _tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


@pytest.mark.parametrize("files, expected", [
    ({"base/a.h": "", "kernels/k.h": '#include "base/a.h"\n'}, []),
    ({"base/a.h": '#include "kernels/k.h"\n', "kernels/k.h": ""}, ["a layer above it"]),
    ({"base/a.h": '#include "a.h"\n'}, ["which is no file under csrc/"]),
    ({"base/a.h": "", "extra/x.h": '#include "base/a.h"\n'}, ["csrc/extra/ is no layer"]),
])
def test_the_order_check_sees_what_breaks_it(tmp_path, files, expected):
    found = order_violations(folder_graph(_tree(tmp_path, files)), ["base", "kernels"])
    assert len(found) == len(expected) and all(e in f for e, f in zip(expected, found)), found


def test_a_cycle_between_folders_is_found(tmp_path):
    graph = folder_graph(_tree(tmp_path, {"a/x.h": '#include "b/y.h"\n', "b/y.h": '#include "c/z.h"\n',
                                          "c/z.h": '#include "a/x.h"\n', "d/w.h": '#include "a/x.h"\n'}))
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_order_is_read_from_cmake():
    assert layer_order("set(PYSERVE_CORE_LAYERS base kernels)\nset(PYSERVE_MODULE_LAYERS bindings)") == [
        "base", "kernels", "bindings"]
