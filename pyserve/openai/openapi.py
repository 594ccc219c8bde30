"""The OpenAPI 3.0 document served at /openapi.json (hand-written; bounds match protocol.py)."""
from __future__ import annotations

from .protocol import (MAX_COMPLETION_LOGPROBS, MAX_N, MAX_PROMPTS, MAX_STOP, MAX_STOP_LEN, MAX_TOP_LOGPROBS,
                       ROLES)

_ERROR = {"type": "object", "required": ["error"], "properties": {"error": {
    "type": "object", "required": ["message", "type", "param", "code"],
    "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                   "param": {"type": "string", "nullable": True}, "code": {"type": "string", "nullable": True}}}}}


def _err(desc: str) -> dict:
    return {"description": desc, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}


_STOP = {"oneOf": [{"type": "string", "maxLength": MAX_STOP_LEN},
                   {"type": "array", "items": {"type": "string", "maxLength": MAX_STOP_LEN}, "maxItems": MAX_STOP}],
         "nullable": True}

_SAMPLING = {
    "model": {"type": "string", "nullable": True},
    "max_tokens": {"type": "integer", "minimum": 1, "nullable": True},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2, "nullable": True},
    "top_p": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1, "nullable": True},
    "top_k": {"type": "integer", "minimum": -1, "nullable": True},
    "min_p": {"type": "number", "minimum": 0, "maximum": 1, "nullable": True},
    "n": {"type": "integer", "minimum": 1, "maximum": MAX_N, "nullable": True},
    "stop": _STOP,
    "seed": {"type": "integer", "nullable": True},
    "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2, "nullable": True},
    "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2, "nullable": True},
    "repetition_penalty": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 2,
                           "nullable": True},
    "logit_bias": {"type": "object", "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
                   "nullable": True, "description": "token id (as a string, in the vocabulary) -> bias"},
    "stream": {"type": "boolean", "nullable": True},
    "stream_options": {"type": "object", "nullable": True,
                       "properties": {"include_usage": {"type": "boolean"}},
                       "description": "only with stream: true"},
    "ignore_eos": {"type": "boolean", "nullable": True},
    "user": {"type": "string", "nullable": True},
}

_CONTENT_PART = {"type": "object", "required": ["type", "text"],
                 "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}}}
_MESSAGE = {"type": "object", "required": ["role", "content"], "properties": {
    "role": {"type": "string", "enum": list(ROLES)},
    "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": _CONTENT_PART, "minItems": 1}]},
    "name": {"type": "string"}}}

_CHAT_REQ = {"type": "object", "required": ["messages"], "properties": dict(
    _SAMPLING,
    messages={"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/Message"}},
    max_completion_tokens={"type": "integer", "minimum": 1, "nullable": True},
    logprobs={"type": "boolean", "nullable": True},
    top_logprobs={"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS, "nullable": True,
                  "description": "requires logprobs: true"},
    chat_template={"type": "string", "nullable": True},
    chat_template_kwargs={"type": "object", "nullable": True},
    add_generation_prompt={"type": "boolean", "nullable": True})}

_TOKEN_IDS = {"type": "array", "minItems": 1, "items": {"type": "integer", "minimum": 0}}
_COMPLETION_REQ = {"type": "object", "required": ["prompt"], "properties": dict(
    _SAMPLING,
    prompt={"oneOf": [{"type": "string"},
                      {"type": "array", "minItems": 1, "maxItems": MAX_PROMPTS, "items": {"type": "string"}},
                      _TOKEN_IDS,
                      {"type": "array", "minItems": 1, "maxItems": MAX_PROMPTS, "items": _TOKEN_IDS}]},
    logprobs={"type": "integer", "minimum": 0, "maximum": MAX_COMPLETION_LOGPROBS, "nullable": True},
    echo={"type": "boolean", "nullable": True})}

_JSON = {"type": "object", "additionalProperties": True}


def _post(summary: str, req_ref: str, ok: dict, stream: bool = False, auth: bool = True) -> dict:
    content = {"application/json": {"schema": ok}}
    if stream:
        content["text/event-stream"] = {"schema": {"type": "string"}}
    op = {"summary": summary,
          "requestBody": {"required": True, "content": {"application/json": {
              "schema": {"$ref": f"#/components/schemas/{req_ref}"}}}},
          "responses": {"200": {"description": "OK", "content": content}, "400": _err("invalid request"),
                        "401": _err("missing or wrong API key"), "404": _err("unknown model"),
                        "413": _err("body too large"), "415": _err("not JSON"),
                        "429": _err("rate limited or overloaded (see Retry-After)"),
                        "503": _err("loading or shutting down")}}
    return op


def _get(summary: str, ok: dict, errors: tuple = ("401",)) -> dict:
    resp = {"200": {"description": "OK", "content": {"application/json": {"schema": ok}}}}
    for e in errors:
        resp[e] = _err({"401": "missing or wrong API key", "404": "not found", "503": "loading"}[e])
    return {"summary": summary, "responses": resp}


def openapi_document(version: str, auth: bool) -> dict:
    doc = {
        "openapi": "3.0.3",
        "info": {"title": "pyserve", "version": version,
                 "description": "An OpenAI-compatible local LLM server. Errors use OpenAI's error JSON."},
        "paths": {
            "/health": {"get": {"summary": "liveness / readiness", "security": [], "responses": {
                "200": {"description": "ready", "content": {"application/json": {"schema": _JSON}}},
                "503": {"description": "loading or shutting down",
                        "content": {"application/json": {"schema": _JSON}}}}}},
            "/v1/models": {"get": _get("the served model", _JSON, ("401", "503"))},
            "/v1/models/{model}": {"get": dict(_get("one model", _JSON, ("401", "404", "503")), parameters=[
                {"name": "model", "in": "path", "required": True, "schema": {"type": "string"}}])},
            "/v1/completions": {"post": _post("text completion", "CompletionRequest", _JSON, stream=True)},
            "/v1/chat/completions": {"post": _post("chat completion", "ChatCompletionRequest", _JSON,
                                                   stream=True)},
            "/tokenize": {"post": _post("prompt or messages to token ids", "TokenizeRequest", _JSON)},
            "/detokenize": {"post": _post("token ids to text", "DetokenizeRequest", _JSON)},
            "/apply-template": {"post": _post("messages to the prompt text", "TemplateRequest", _JSON)},
            "/metrics": {"get": {"summary": "Prometheus metrics", "responses": {
                "200": {"description": "OK", "content": {"text/plain": {"schema": {"type": "string"}}}},
                "401": _err("missing or wrong API key")}}},
        },
        "components": {"schemas": {
            "Error": _ERROR,
            "Message": _MESSAGE,
            "ChatCompletionRequest": _CHAT_REQ,
            "CompletionRequest": _COMPLETION_REQ,
            "TokenizeRequest": {"oneOf": [
                {"type": "object", "required": ["prompt"], "properties": {
                    "prompt": {"type": "string"}, "add_special_tokens": {"type": "boolean"},
                    "return_token_strs": {"type": "boolean"}}},
                {"type": "object", "required": ["messages"], "properties": {
                    "messages": {"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/Message"}},
                    "add_generation_prompt": {"type": "boolean"}, "return_token_strs": {"type": "boolean"}}}]},
            "DetokenizeRequest": {"type": "object", "required": ["tokens"], "properties": {
                "tokens": {"type": "array", "items": {"type": "integer", "minimum": 0}}}},
            "TemplateRequest": {"type": "object", "required": ["messages"], "properties": {
                "messages": {"type": "array", "minItems": 1, "items": {"$ref": "#/components/schemas/Message"}},
                "chat_template": {"type": "string"}, "chat_template_kwargs": {"type": "object"},
                "add_generation_prompt": {"type": "boolean"}}},
        }},
    }
    if auth:
        doc["components"]["securitySchemes"] = {"bearer": {"type": "http", "scheme": "bearer"}}
        doc["security"] = [{"bearer": []}]
        doc["paths"]["/metrics"]["get"]["security"] = []
    return doc
