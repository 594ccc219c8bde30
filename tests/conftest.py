"""Shared fixtures: the default model, loaded once per session, and the reference data folder."""
from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parent.parent.parent / "shared"


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    assert SHARED.is_dir(), f"reference data not found at {SHARED}"
    return SHARED


@pytest.fixture(scope="session")
def model_path() -> str:
    from pyserve.engine.model_source import resolve_model

    return resolve_model(None)


@pytest.fixture(scope="session")
def llm(model_path):
    from pyserve import LLM

    return LLM(model_path, n_threads=2)
