"""Where things are in the repository (a clone: tests read its data and run its scripts, never ../shared)."""
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
DATA = TESTS / "data"  # reference data, each file's origin and licence in data/README.md
SCRIPTS = REPO / "scripts"
DOCS = REPO / "docs"
