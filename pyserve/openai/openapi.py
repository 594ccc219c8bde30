"""The OpenAPI 3.1 document served at /openapi.json, generated from the protocol's and responses' models (so a
fuzzer driven by it checks the code, not a copy)."""
from __future__ import annotations

from pydantic.json_schema import models_json_schema

from . import infill_protocol as fim
from ..anthropic import protocol as a
from . import protocol as p
from . import protocol_rerank as rr
from . import responses as r
from .protocol_responses import ResponsesRequest

_REF = "#/components/schemas/{model}"
_MODELS = [(p.ChatCompletionRequest, "validation"), (p.CompletionRequest, "validation"),
           (p.EmbeddingRequest, "validation"), (r.EmbeddingResponse, "serialization"),
           (p.TokenizeRequest, "validation"), (p.DetokenizeRequest, "validation"), (p.TemplateRequest, "validation"),
           (r.ChatCompletionResponse, "serialization"), (r.ChatCompletionChunk, "serialization"),
           (r.CompletionResponse, "serialization"), (r.ModelList, "serialization"), (r.ModelCard, "serialization"),
           (r.TokenizeResponse, "serialization"), (r.DetokenizeResponse, "serialization"),
           (r.TemplateResponse, "serialization"), (r.TokenizerInfo, "serialization"),
           (r.ErrorResponse, "serialization"), (rr.RerankRequest, "validation"),
           (rr.RerankResponse, "serialization"), (rr.ScoreRequest, "validation"), (rr.ScoreResponse, "serialization"),
           (fim.InfillRequest, "validation"), (fim.InfillResponse, "serialization"),
           (a.MessagesRequest, "validation"),
           (a.CountTokensRequest, "validation"), (ResponsesRequest, "validation")]
_ERRORS = {"400": "invalid request", "401": "missing or wrong API key", "404": "unknown model (or stored response)",
           "413": "body too large", "415": "not JSON", "429": "rate limited or overloaded (see Retry-After)",
           "503": "loading or shutting down"}
_JSON = {"type": "object", "additionalProperties": True}


def _ref(model) -> dict:
    return _JSON if model is _JSON_REF else {"$ref": _REF.format(model=model.__name__)}


class _JSON_REF:
    """A response described as any JSON object (Anthropic's shapes are its SDK's, not pyserve's models)."""


def _error(desc: str) -> dict:
    return {"description": desc, "content": {"application/json": {"schema": _ref(r.ErrorResponse)}}}


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
    doc = _post(summary, ResponsesRequest, r.ErrorResponse)
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
        "/v1/models": _get("every model the server serves, loaded or not", _ref(r.ModelList), ("401", "503")),
        "/v1/models/{model}": {"get": dict(_get("one model", _ref(r.ModelCard), ("401", "404", "503"))["get"],
                                           parameters=model_param)},
        "/v1/completions": _post("text completion", p.CompletionRequest, r.CompletionResponse, r.CompletionResponse),
        "/v1/chat/completions": _post("chat completion", p.ChatCompletionRequest, r.ChatCompletionResponse,
                                      r.ChatCompletionChunk),
        "/infill": _post("llama.cpp's fill-in-the-middle (a stream: its objects, the last with stop true, no "
                         "[DONE])", fim.InfillRequest, fim.InfillResponse),
        "/v1/messages": _anthropic(_post("Anthropic's Messages API (streamed: Anthropic's named SSE events)",
                                         a.MessagesRequest, _JSON_REF)),
        "/v1/messages/count_tokens": _anthropic(_post("Anthropic's token count of a message request",
                                                      a.CountTokensRequest, _JSON_REF)),
        "/v1/responses": _responses("a response (the Responses API)", True),
        "/v1/responses/input_tokens": _responses("the input's token count", False),
        **_stored_responses(),
        "/v1/embeddings": _post("embeddings of texts or token ids", p.EmbeddingRequest, r.EmbeddingResponse),
        "/v1/rerank": _post("documents ranked by a reranker model's relevance to a query (Jina / Cohere)",
                            rr.RerankRequest, rr.RerankResponse),
        "/v1/score": _post("a reranker's relevance scores of text pairs (vLLM's)", rr.ScoreRequest, rr.ScoreResponse),
        "/tokenize": _post("prompt or messages to token ids", p.TokenizeRequest, r.TokenizeResponse),
        "/detokenize": _post("token ids to text", p.DetokenizeRequest, r.DetokenizeResponse),
        "/apply-template": _post("messages to the prompt text", p.TemplateRequest, r.TemplateResponse),
        "/tokenizer_info": {"get": dict(_get("the tokenizer's special tokens, template and length (vLLM's)",
                                             _ref(r.TokenizerInfo), ("401", "404", "503"))["get"],
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
