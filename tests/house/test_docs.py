"""Every path a document names exists: the README, docs/ and every other Markdown file of the repository name
files and folders that are there. A path is written with its folders, from the repository's root (`tests/…`)
or from the top of pyserve/ or csrc/ (`server/app.py`, `kernels/packed.h`), `X.{h,cpp}` for both and `*` as a
glob; a code file's name written alone (`engine.cpp`) must be somewhere in the tree. The map,
docs/ARCHITECTURE.md, stays one screen: the depth is in docs/design/, one document per subsystem."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from support.paths import DOCS, REPO

# Folders a path may start with: the repository's, and (read from disk) those at the top of pyserve/ and csrc/
_TOPS = ("pyserve", "csrc", "tests", "scripts", "docs", ".ci")
_TOKEN = re.compile(r"(?<![\w./~:@*{-])((?:\.?[\w-]+/)+[\w.*-]*|[\w*-]+\.(?:py|h|cpp|md))(?![\w/*-])")
_BRACES = re.compile(r"([\w./*-]+)\.\{([\w,]+)\}")
_LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")  # a Markdown link's target, relative to its document
_NOT_FILES = {"llama.cpp", "convert_hf_to_gguf.py"}  # a project's name, and llama.cpp's converter


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout.split()
    return [p for p in out if (REPO / p).exists()]


def _roots(doc: str = "README.md") -> dict[str, tuple[str, ...]]:
    """{first folder of a path: the folders it may be under} for every way a document may start one: from the
    repository's root, from the top of pyserve/ or csrc/, or from the document's own folder (a Markdown link)."""
    roots: dict[str, tuple[str, ...]] = {top: ("",) for top in _TOPS}
    here = Path(doc).parent.as_posix()
    for parent in ([here] if here != "." else []) + ["pyserve", "csrc"]:
        for d in (REPO / parent).iterdir():
            if d.is_dir():
                roots[d.name] = roots.get(d.name, ()) + (parent + "/",)
    return roots


def names_in(text: str, roots: dict[str, tuple[str, ...]]) -> set[tuple[str, ...]]:
    """The paths a text names, each as the paths it may be from the repository's root (a folder ends in '/';
    a lone file name stands alone)."""
    text = _BRACES.sub(lambda m: " ".join(f"{m.group(1)}.{ext}" for ext in m.group(2).split(",")), text)
    text = text.replace("**", "  ")  # Markdown's bold, not a glob
    found = set()
    for m in _TOKEN.finditer(text):
        tok = m.group(1).rstrip(".")
        first = tok.split("/")[0]
        if "/" not in tok:
            if tok not in _NOT_FILES:
                found.add((tok,))
        elif first in roots:
            found.add(tuple(root + tok for root in roots[first]))
    return found


def missing(paths: tuple[str, ...], basenames: set[str]) -> bool:
    """Whether none of the paths one name may be is there."""
    return not any(_there(p, basenames) for p in paths)


def _there(path: str, basenames: set[str]) -> bool:
    if "/" not in path:
        return any(Path(b).match(path) for b in basenames)
    return any(REPO.glob(path.rstrip("/"))) if "*" in path else (REPO / path).exists()


def documents() -> list[str]:
    return sorted(p for p in tracked() if p.endswith(".md"))


def links_in(text: str, doc: str) -> set[tuple[str, ...]]:
    """The targets of a document's Markdown links to files of the repository (not URLs), from its root."""
    here = Path(doc).parent
    return {((here / t).as_posix(),) for t in _LINK.findall(text) if ":" not in t}


def test_every_path_a_document_names_exists():
    basenames = {Path(f).name for f in tracked()}
    docs = documents()
    bad = []
    for doc in docs:
        text = (REPO / doc).read_text(encoding="utf-8")
        named = names_in(text, _roots(doc)) | links_in(text, doc)
        bad += [f"{doc}: {' or '.join(paths)}" for paths in sorted(named) if missing(paths, basenames)]
    assert not bad, "\n".join(bad)
    assert len(docs) >= 10


@pytest.mark.parametrize("text, expected", [
    ("see `server/app.py` and csrc/kernels/packed.{h,cpp}", {("pyserve/server/app.py",), ("csrc/kernels/packed.h",),
                                                            ("csrc/kernels/packed.cpp",)}),
    ("tests/models/test_*.py, kernels/quant.h, engine.cpp, csrc/", {("tests/models/test_*.py",), ("csrc/kernels/quant.h",),
                                                                     ("engine.cpp",), ("csrc/",)}),
    ("`engine/llm.py`", {("pyserve/engine/llm.py", "csrc/engine/llm.py")}),
    ("**llama.cpp**'s server at 12 tokens/s, Qwen/Qwen3-4B, https://x.org/a/b.py, ~/.cache/pyserve", set()),
])
def test_what_counts_as_a_path(text, expected):
    assert names_in(text, _roots()) == expected


def test_links_are_read_from_their_document():
    assert links_in("[a](design/api.md) [b](../README.md#x) [c](https://x.org/y.md)", "docs/X.md") == {
        ("docs/design/api.md",), ("docs/../README.md",)}


def test_a_path_that_is_gone_is_missing():
    basenames = {Path(f).name for f in tracked()}
    assert missing(("pyserve/openai/protocol.py",), basenames) and missing(("serving_common.py",), basenames)
    assert not missing(("csrc/kernels/packed.h",), basenames) and not missing(("tests/models/test_*.py",), basenames)
    assert not missing(("pyserve/engine/llm.py", "csrc/engine/llm.py"), basenames)
    assert not missing(("csrc/",), basenames) and missing(("csrc/nowhere/",), basenames)


def test_the_map_is_one_screen():
    """docs/ARCHITECTURE.md: the layers, one request's path, where the metrics are measured and the links —
    about a screen to read (≤ 1,200 words, no line over 200 characters); the rest is docs/design/'s."""
    text = (DOCS / "ARCHITECTURE.md").read_text(encoding="utf-8")
    assert len(text.split()) <= 1200, len(text.split())
    assert max(map(len, text.splitlines())) <= 200
    assert len(list((DOCS / "design").glob("*.md"))) >= 5
