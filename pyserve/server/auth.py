"""Access control at the HTTP edge: API keys and CORS.

Keys come from `--api-key` (repeatable), `PYSERVE_API_KEY` and `--api-key-file` (one key per line; blank
lines and `#` comments skipped). With any key configured, `Authorization: Bearer KEY` is required on
/v1/*, /tokenize, /detokenize and /apply-template (or Anthropic's `x-api-key: KEY`) (and on /metrics with `--metrics-require-key`); /health,
/openapi.json, the chat page (`/` and `/webui/*`: the page asks for the key itself) and CORS preflights
stay open. Keys are compared in constant time against every configured key (no early exit on the first
match), a failure is counted and answered 401 with OpenAI's error JSON, and the presented key is never
logged.
"""
from __future__ import annotations

import hmac
import logging
import os
from dataclasses import dataclass, field
from typing import Iterable, Optional

from ..api.base.errors import OpenAIError

log = logging.getLogger("pyserve.server")

OPEN_PATHS = ("/health", "/openapi.json", "/")
OPEN_PREFIX = "/webui/"  # the chat page's assets (webui.py serves only its own files there)


def load_keys(keys: Iterable[str] = (), key_file: Optional[str] = None, env: bool = True) -> list[str]:
    """Every configured key, de-duplicated, in order. Empty keys are refused (they would match anything)."""
    out: list[str] = []
    for k in keys or ():
        out.append(k)
    if env and os.environ.get("PYSERVE_API_KEY"):
        out.append(os.environ["PYSERVE_API_KEY"])
    if key_file:
        with open(key_file, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if line and not line.startswith("#"):
                    out.append(line)
    seen, keys_out = set(), []
    for k in out:
        k = k.strip()
        if not k:
            raise ValueError("an API key may not be empty")
        if any(c.isspace() for c in k):
            raise ValueError("an API key may not contain whitespace")
        if k not in seen:
            seen.add(k)
            keys_out.append(k)
    return keys_out


@dataclass
class AccessConfig:
    api_keys: list[str] = field(default_factory=list)
    metrics_require_key: bool = False
    allowed_origins: list[str] = field(default_factory=list)  # "*" allows any origin

    def requires_key(self, path: str) -> bool:
        if not self.api_keys:
            return False
        if path in OPEN_PATHS or path.startswith(OPEN_PREFIX):
            return False
        if path == "/metrics":
            return self.metrics_require_key
        return True  # /v1/*, /tokenize, /detokenize, /apply-template, /server_info, /model_info, unknown paths


def bearer_token(header: Optional[str]) -> Optional[str]:
    if not header:
        return None
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    token = token.strip()
    return token or None


def presented_key(headers) -> Optional[str]:
    """The client's key: `Authorization: Bearer KEY`, or Anthropic's `x-api-key: KEY` (its SDK's header)."""
    token = bearer_token(headers.get("Authorization"))
    if token is None:
        token = (headers.get("x-api-key") or "").strip() or None
    return token


def match_key(token: Optional[str], keys: list[str]) -> Optional[str]:
    """The configured key equal to `token`, compared in constant time against every key, or None."""
    if token is None:
        token = ""
    given = token.encode("utf-8", "surrogatepass")
    found = None
    for k in keys:
        if hmac.compare_digest(given, k.encode("utf-8")) and found is None:
            found = k
    return found


def auth_error(missing: bool) -> OpenAIError:
    if missing:
        msg = ("You didn't provide an API key. You need to provide your API key in an Authorization header using "
               "Bearer auth (i.e. Authorization: Bearer YOUR_KEY).")
    else:
        msg = "Incorrect API key provided."
    return OpenAIError(msg, 401, "invalid_request_error", None, "invalid_api_key",
                       headers={"WWW-Authenticate": 'Bearer realm="pyserve"'})


# ---- CORS ----

CORS_METHODS = "GET, POST, DELETE, OPTIONS"
CORS_HEADERS = "Authorization, Content-Type, OpenAI-Organization, OpenAI-Project, X-Stainless-Lang, " \
               "X-Stainless-Package-Version, X-Stainless-OS, X-Stainless-Arch, X-Stainless-Runtime, " \
               "X-Stainless-Runtime-Version, X-Stainless-Retry-Count, X-Stainless-Timeout, X-Api-Key, " \
               "Anthropic-Version, Anthropic-Beta"


def origin_allowed(origin: Optional[str], allowed: list[str]) -> bool:
    return bool(origin) and bool(allowed) and ("*" in allowed or origin in allowed)


def cors_headers(origin: str, allowed: list[str], preflight: bool = False,
                 request_headers: Optional[str] = None) -> dict:
    h = {"Access-Control-Allow-Origin": "*" if "*" in allowed else origin, "Vary": "Origin"}
    if preflight:
        h["Access-Control-Allow-Methods"] = CORS_METHODS
        h["Access-Control-Allow-Headers"] = request_headers or CORS_HEADERS
        h["Access-Control-Max-Age"] = "600"
    else:
        h["Access-Control-Expose-Headers"] = "Retry-After, X-Request-Id"
    return h
