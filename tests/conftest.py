"""Shared fixtures: the default model, loaded once per session, and the reference data folder."""
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """tests/data: the reference data, in the repository (origins and licences: tests/data/README.md)."""
    return Path(__file__).resolve().parent / "data"


@pytest.fixture(scope="session")
def model_path() -> str:
    from pyserve.engine.model_source import resolve_model

    return resolve_model(None)


@pytest.fixture(scope="session")
def llm(model_path):
    from pyserve import LLM

    return LLM(model_path, n_threads=2)
