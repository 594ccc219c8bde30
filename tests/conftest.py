"""Shared fixtures: the default model, loaded once per session, and the reference data folder."""
from pathlib import Path

import pytest

from support.paths import DATA


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """tests/data: the reference data, in the repository (origins and licences: tests/data/README.md)."""
    return DATA


@pytest.fixture(scope="session")
def model_path() -> str:
    from pyserve.engine.model_source import resolve_model

    return resolve_model(None)


@pytest.fixture(scope="session")
def llm(model_path):
    from pyserve import LLM

    return LLM(model_path, n_threads=2)


@pytest.fixture(scope="module")
def server():
    """`pyserve serve` with the default model on a loopback port, for one module; it must exit 0 (a module
    that needs other flags defines its own `server`)."""
    from pyserve.bench.launch import ServerProcess

    s = ServerProcess().wait_ready()
    yield s
    assert s.stop() == 0, "".join(s.stderr)


@pytest.fixture(scope="module")
def client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
