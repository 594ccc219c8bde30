"""The routes, one module per endpoint family as in api/: each parses its input (body.py), hands the serving
layer what it needs, and wraps what comes back (server/http/response.py): a few lines each.

The modules of the APIs fewer clients speak (infill, rerank, the Responses and Anthropic APIs, the OpenAPI
document) are imported by their routes at their first request, not at start-up: their protocol models take
~25 ms to build, on the way to a server's first /health 200."""
from __future__ import annotations

from quart_trio import QuartTrio

from . import chat, completions, info, messages, pooling, responses, tokens, webui, worker


def add_routes(app: QuartTrio, state) -> None:
    completions.add_routes(app, state)  # /v1/completions, /infill
    pooling.add_routes(app, state)  # /v1/embeddings, /v1/rerank, /v1/score
    chat.add_routes(app, state)  # /v1/chat/completions
    responses.add_routes(app, state)  # /v1/responses (OpenAI's Responses API)
    tokens.add_routes(app, state)  # /tokenize, /detokenize, /tokenizer_info, /apply-template
    info.add_routes(app, state)  # /health, /v1/models, /openapi.json, /server_info, /model_info, /metrics
    messages.add_routes(app, state)  # /v1/messages (Anthropic's Messages API)
    webui.add_routes(app)  # the chat page at /
    worker.add_routes(app, state)  # what SGLang's and vLLM's routers read
