"""pyserve: a local LLM server with a C++ GGUF engine and an OpenAI-compatible API."""
from .outputs import CompletionOutput, RequestOutput
from .sampling_params import SamplingParams

__all__ = ["LLM", "AsyncLLM", "SamplingParams", "RequestOutput", "CompletionOutput", "create_app"]


def __getattr__(name: str):
    # The engine (a compiled extension) loads on first use, so `import pyserve` stays cheap.
    if name == "LLM":
        from .llm import LLM

        return LLM
    if name == "AsyncLLM":
        from .engine_client import AsyncLLM

        return AsyncLLM
    if name == "create_app":  # the ASGI app around an open AsyncLLM (Quart-Trio: serve it on a trio server)
        from .app import create_app

        return create_app
    raise AttributeError(name)
