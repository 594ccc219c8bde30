"""pyserve: a local LLM server with a C++ GGUF engine and an OpenAI-compatible API.

Layers, bottom to top (a module imports only from its own layer or those below it; docs/ARCHITECTURE.md):
`engine` (LLM, AsyncLLM, tokenizer, sampling) → `api` (each endpoint family's protocol models and serving
over a shared base: chat, completions, responses, messages, pooling, infill, tokens; replies and event
streams, never bytes) → `server` (the app, its routes and edge, the wire: HTTP, SSE framing; metrics, the
Hypercorn runner) → `cli`. `bench` is a client of any OpenAI-compatible server and imports none of them.
"""
from .engine.outputs import CompletionOutput, RequestOutput
from .engine.sampling_params import SamplingParams

__all__ = ["LLM", "AsyncLLM", "SamplingParams", "RequestOutput", "CompletionOutput", "create_app"]


def __getattr__(name: str):
    # The engine (a compiled extension) loads on first use, so `import pyserve` stays cheap.
    if name == "LLM":
        from .engine.llm import LLM

        return LLM
    if name == "AsyncLLM":
        from .engine.async_llm import AsyncLLM

        return AsyncLLM
    if name == "create_app":  # the ASGI app around an open AsyncLLM (Quart-Trio: serve it on a trio server)
        from .server.app import create_app

        return create_app
    raise AttributeError(name)
