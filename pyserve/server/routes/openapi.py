"""The OpenAPI 3.1 document served at /openapi.json, assembled from every endpoint family's request and reply
models (api/*/protocol.py: so a fuzzer driven by it checks the code, not a copy)."""
from __future__ import annotations

from pydantic.json_schema import models_json_schema

from ...api.base import replies
from ...api.chat import protocol as chat
from ...api.completions import protocol as completions
from ...api.infill import protocol as infill
from ...api.messages import protocol as messages
from ...api.pooling import protocol as embeddings
from ...api.pooling import score_protocol as score
from ...api.responses.protocol import ResponsesRequest
from ...api.tokens import protocol as tokens

_REF = "#/components/schemas/{model}"
_V, _S = "validation", "serialization"  # a request's schema, a reply's
_MODELS = [(chat.ChatCompletionRequest, _V), (chat.ChatCompletionResponse, _S), (chat.ChatCompletionChunk, _S),
           (completions.CompletionRequest, _V), (completions.CompletionResponse, _S),
           (embeddings.EmbeddingRequest, _V), (embeddings.EmbeddingResponse, _S),
           (tokens.TokenizeRequest, _V), (tokens.DetokenizeRequest, _V), (tokens.TemplateRequest, _V),
           (tokens.TokenizeResponse, _S), (tokens.DetokenizeResponse, _S), (tokens.TemplateResponse, _S),
           (tokens.TokenizerInfo, _S), (replies.ModelList, _S), (replies.ModelCard, _S), (replies.ErrorResponse, _S),
           (score.RerankRequest, _V), (score.RerankResponse, _S), (score.ScoreRequest, _V), (score.ScoreResponse, _S),
           (infill.InfillRequest, _V), (infill.InfillResponse, _S),
           (messages.MessagesRequest, _V), (messages.CountTokensRequest, _V), (ResponsesRequest, _V)]
_ERRORS = {"400": "invalid request", "401": "missing or wrong API key", "404": "unknown model (or stored response)",
           "413": "body too large", "415": "not JSON", "429": "rate limited or overloaded (see Retry-After)",
           "503": "loading or shutting down"}
_JSON = {"type": "object", "additionalProperties": True}


def _ref(model) -> dict:
    return _JSON if model is _JSON_REF else {"$ref": _REF.format(model=model.__name__)}


class _JSON_REF:
    """A response described as any JSON object (Anthropic's shapes are its SDK's, not pyserve's models)."""


def _error(desc: str) -> dict:
    return {"description": desc, "content": {"application/json": {"schema": _ref(replies.ErrorResponse)}}}


def _post(summary: str, req, ok, stream=None) -> dict:
    content = {"application/json": {"schema": _ref(ok)}}
    if stream is not None:
        content["text/event-stream"] = {"schema": {"type": "string"},
                                        "description": f"`data: <{stream.__name__}>` events, then `data: [DONE]`"}
    responses = {"200": {"description": "OK", "content": content}}
    responses.update({code: _error(desc) for code, desc in _ERRORS.items()})
    return {"post": {"summary": summary, "responses": responses,
                     "requestBody": {"required": True, "content": {"application/json": {"schema": _ref(req)}}}}}


def _anthropic(path: dict) -> dict:
    """An Anthropic route: its errors are Anthropic's {"type": "error", "error": {"type", "message"}}."""
    for code, resp in path["post"]["responses"].items():
        if code != "200":
            resp["content"]["application/json"]["schema"] = _JSON
    return path


def _get(summary: str, ok: dict, errors: tuple = ("401",)) -> dict:
    responses = {"200": {"description": "OK", "content": {"application/json": {"schema": ok}}}}
    responses.update({code: _error(_ERRORS[code]) for code in errors})
    return {"get": {"summary": summary, "responses": responses}}


def _responses(summary: str, stream: bool) -> dict:
    """A Responses API route: a JSON object or (create) its named events (docs/RESPONSES_API.md)."""
    doc = _post(summary, ResponsesRequest, replies.ErrorResponse)
    content = {"application/json": {"schema": _JSON}}
    if stream:
        content["text/event-stream"] = {"schema": {"type": "string"}}
    doc["post"]["responses"]["200"]["content"] = content
    return doc


def _stored_responses() -> dict:
    """The response store's routes (docs/RESPONSES_API.md): a stored Response, its deletion, its input items, the
    cancellation of a background one."""
    rid = [{"name": "response_id", "in": "path", "required": True, "schema": {"type": "string"}}]
    order = [{"name": "order", "in": "query", "required": False, "schema": {"enum": ["asc", "desc"]}}]
    one = _get("a stored response", _JSON, ("401", "404"))["get"]
    gone = _get("delete a stored response", _JSON, ("401", "404"))["get"]
    items = _get("a stored response's input items", _JSON, ("400", "401", "404"))["get"]
    cancel = _get("cancel a background response", _JSON, ("400", "401", "404"))["get"]
    return {"/v1/responses/{response_id}": {"get": dict(one, parameters=rid), "delete": dict(gone, parameters=rid)},
            "/v1/responses/{response_id}/input_items": {"get": dict(items, parameters=rid + order)},
            "/v1/responses/{response_id}/cancel": {"post": dict(cancel, parameters=rid)}}


def _paths() -> dict:
    model_param = [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}]
    return {
        "/health": {"get": {"summary": "liveness / readiness", "security": [], "responses": {
            "200": {"description": "ready", "content": {"application/json": {"schema": _JSON}}},
            "503": {"description": "loading or shutting down", "content": {"application/json": {"schema": _JSON}}}}}},
        "/v1/models": _get("every model the server serves, loaded or not", _ref(replies.ModelList), ("401", "503")),
        "/v1/models/{model}": {"get": dict(_get("one model", _ref(replies.ModelCard), ("401", "404", "503"))["get"],
                                           parameters=model_param)},
        "/v1/completions": _post("text completion", completions.CompletionRequest, completions.CompletionResponse,
                                 completions.CompletionResponse),
        "/v1/chat/completions": _post("chat completion", chat.ChatCompletionRequest, chat.ChatCompletionResponse,
                                      chat.ChatCompletionChunk),
        "/infill": _post("llama.cpp's fill-in-the-middle (a stream: its objects, the last with stop true, no "
                         "[DONE])", infill.InfillRequest, infill.InfillResponse),
        "/v1/messages": _anthropic(_post("Anthropic's Messages API (streamed: Anthropic's named SSE events)",
                                         messages.MessagesRequest, _JSON_REF)),
        "/v1/messages/count_tokens": _anthropic(_post("Anthropic's token count of a message request",
                                                      messages.CountTokensRequest, _JSON_REF)),
        "/v1/responses": _responses("a response (the Responses API)", True),
        "/v1/responses/input_tokens": _responses("the input's token count", False),
        **_stored_responses(),
        "/v1/embeddings": _post("embeddings of texts or token ids", embeddings.EmbeddingRequest,
                                embeddings.EmbeddingResponse),
        "/v1/rerank": _post("documents ranked by a reranker model's relevance to a query (Jina / Cohere)",
                            score.RerankRequest, score.RerankResponse),
        "/v1/score": _post("a reranker's relevance scores of text pairs (vLLM's)", score.ScoreRequest,
                           score.ScoreResponse),
        "/tokenize": _post("prompt or messages to token ids", tokens.TokenizeRequest, tokens.TokenizeResponse),
        "/detokenize": _post("token ids to text", tokens.DetokenizeRequest, tokens.DetokenizeResponse),
        "/apply-template": _post("messages to the prompt text", tokens.TemplateRequest, tokens.TemplateResponse),
        "/tokenizer_info": {"get": dict(_get("the tokenizer's special tokens, template and length (vLLM's)",
                                             _ref(tokens.TokenizerInfo), ("401", "404", "503"))["get"],
                                        parameters=[{"name": "model", "in": "query", "required": False,
                                                     "schema": {"type": "string"}}])},
        "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {
            "200": {"description": "OK", "content": {"text/plain": {"schema": {"type": "string"}}}},
            "401": _error("missing or wrong API key")}}},
    }


def openapi_document(version: str, auth: bool) -> dict:
    _, schemas = models_json_schema(_MODELS, ref_template=_REF)
    doc = {"openapi": "3.1.0",
           "info": {"title": "pyserve", "version": version,
                    "description": "An OpenAI-compatible local LLM server. Errors use OpenAI's error JSON."},
           "paths": _paths(), "components": {"schemas": schemas["$defs"]}}
    if auth:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
        doc["paths"]["/metrics"]["get"]["security"] = []
    return doc
