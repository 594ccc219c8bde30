"""Anthropic's error shape: {"type": "error", "error": {"type", "message"}}, for every error on its routes.

Errors are raised as OpenAIError in every layer (api/base/errors.py); the server's error handlers pick the shape
by the request's path (`wants_anthropic`), so an auth failure, a 404 model, a 429, a body that does not parse
and an error mid-stream all reach an Anthropic client as its SDK parses them. The status stays the one the
error was raised with; the type follows it as Anthropic's do.
"""
from __future__ import annotations

from ..base.errors import OpenAIError

PREFIX = "/v1/messages"
_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
          404: "not_found_error", 413: "request_too_large", 429: "rate_limit_error", 503: "overloaded_error",
          529: "overloaded_error"}


def wants_anthropic(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def error_type(status: int) -> str:
    if status in _TYPES:
        return _TYPES[status]
    return "api_error" if status >= 500 else "invalid_request_error"


def anthropic_body(e: OpenAIError) -> dict:
    return {"type": "error", "error": {"type": error_type(e.status), "message": e.message}}


def from_openai_body(body: dict) -> dict:
    """An in-band OpenAI error event of the chat stream (its status is gone: its type says server or client)."""
    err = body.get("error") or {}
    kind = "api_error" if err.get("type") == "server_error" else "invalid_request_error"
    return {"type": "error", "error": {"type": kind, "message": err.get("message", "")}}
