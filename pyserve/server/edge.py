"""The HTTP edge, before any route: CORS preflights, API keys (401s counted, their log lines throttled),
503 while shutting down, 415 for a body that is not JSON, the per-key requests-per-minute limit; and the
per-request context the serving layer is handed (the timer, admission bound to the client's key, the
drain event, the stalled-client watch).
"""
from __future__ import annotations

import logging
import re
import secrets
import time
from functools import partial
from typing import Optional

from quart import Response

from ..api.base.context import NullObserver, RequestContext
from ..api.base.errors import OpenAIError, bad_request, server_error
from ..api.responses.store import owner_of
from .admission import Admission, AdmissionQueue, RateLimiter
from .auth import AccessConfig, auth_error, cors_headers, match_key, origin_allowed, presented_key
from .config import ServerConfig
from .metrics import TIMER_KEY, Metrics

log = logging.getLogger("pyserve.server")

KEY_KEY = "pyserve.client_key"  # the client's key (API key or address) in the ASGI scope
OWNER_KEY = "pyserve.owner"  # the matched API key's hash (RequestContext.owner) in the ASGI scope
ID_KEY = "pyserve.request_id"  # the request's id in the ASGI scope (X-Request-Id in and out)
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:/+=-]{1,128}")
# POST endpoints that take a JSON body
JSON_POSTS = frozenset({"/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/completions",
                        "/chat/completions", "/embeddings", "/tokenize", "/detokenize", "/apply-template",
                        "/v1/messages", "/v1/messages/count_tokens"})


class Edge:
    def __init__(self, config: ServerConfig, metrics: Metrics, max_num_seqs=lambda: 64):
        keys = list(config.api_keys) + ([config.api_key] if config.api_key else [])
        self.access = AccessConfig(list(dict.fromkeys(keys)), config.metrics_require_key,
                                   list(config.allowed_origins))
        self.config = config
        self.rate_limiter = RateLimiter(config.rate_limit_rpm, config.rate_limit_tpm)
        self.queue = AdmissionQueue(max_num_seqs, config.max_waiting, config.max_queue_wait)
        self.admission = Admission(self.rate_limiter, self.queue, config.default_completion_estimate)
        self.stopping = False  # set on the shutdown signal: new requests get 503
        self.auth_failures = 0  # 401s answered
        self.stalled_clients = 0  # streams aborted because the client stopped reading
        self._log_window, self._logged = 0.0, 0
        for metric, doc, value in [
                ("pyserve:auth_failures", "requests refused with 401", lambda: self.auth_failures),
                ("pyserve:rate_limited", "requests refused with 429 by a per-key rate limit",
                 lambda: self.rate_limiter.refused),
                ("pyserve:admission_refused", "requests refused with 429 because they could not start in time",
                 lambda: self.queue.refused),
                ("pyserve:stalled_clients", "streams aborted because the client stopped reading",
                 lambda: self.stalled_clients)]:
            metrics.add_counter(metric, doc, value)

    def before(self, request) -> Optional[Response]:
        """None to go on to the route, or the response that ends the request here."""
        request.scope[ID_KEY] = _request_id(request.headers.get("X-Request-Id"))
        origin = request.headers.get("Origin")
        if request.method == "OPTIONS" and origin and "Access-Control-Request-Method" in request.headers:
            return self._preflight(request, origin)  # before auth: browsers send no credentials on a preflight
        key = None
        if self.access.requires_key(request.path):
            token = presented_key(request.headers)
            key = match_key(token, self.access.api_keys)
            if key is None:
                self._refused_key(request, token)
                raise auth_error(token is None)
            request.scope[OWNER_KEY] = owner_of(key)
        if request.method == "POST":
            self._check_post(request)
            request.scope[KEY_KEY] = key = key or f"addr:{request.remote_addr}"
            if request.path in JSON_POSTS:
                self.rate_limiter.check_request(key)
        return None

    def _preflight(self, request, origin: str) -> Response:
        if not origin_allowed(origin, self.access.allowed_origins):
            return Response("", 403)
        return Response("", 204, cors_headers(origin, self.access.allowed_origins, preflight=True,
                                              request_headers=request.headers.get("Access-Control-Request-Headers")))

    def _refused_key(self, request, token: Optional[str]) -> None:
        """Counts a 401; logs at most 10 a minute, never the key itself."""
        self.auth_failures += 1
        now = time.monotonic()
        if now - self._log_window >= 60:
            self._log_window, self._logged = now, 0
        self._logged += 1
        if self._logged <= 10:
            log.warning("401 for %s %s from %s (%s)%s", request.method, request.path, request.remote_addr,
                        "no key" if token is None else "wrong key",
                        "; further 401s this minute are not logged" if self._logged == 10 else "")

    def _check_post(self, request) -> None:
        if self.stopping:
            raise server_error("server shutting down", 503)
        ctype = request.mimetype or ""
        if request.path in JSON_POSTS and ctype and ctype != "application/json" and not ctype.endswith("+json"):
            raise OpenAIError(f"Content-Type must be application/json, got {ctype!r}", 415,
                              "invalid_request_error", None, "unsupported_media_type")

    def after(self, request, resp: Response) -> Response:
        rid = request.scope.get(ID_KEY)
        if rid:
            resp.headers["X-Request-Id"] = rid  # the SDKs' response.request_id
        origin = request.headers.get("Origin")
        allowed = self.access.allowed_origins
        if origin_allowed(origin, allowed) and "Access-Control-Allow-Origin" not in resp.headers:
            resp.headers.update(cors_headers(origin, allowed))
        return resp

    def context(self, request, draining) -> RequestContext:
        """What the serving layer is handed for this request."""
        key = request.scope.get(KEY_KEY, "-")
        return RequestContext(observer=request.scope.get(TIMER_KEY) or NullObserver(),
                              admit=partial(self.admission.admit, key), draining=draining,
                              stall_timeout=self.config.stalled_client_timeout, on_stall=self._stalled,
                              request_id=request.scope.get(ID_KEY) or secrets.token_hex(12),
                              owner=request.scope.get(OWNER_KEY), sse_keepalive=self.config.sse_keepalive,
                              cache_tenant=None if self.config.shared_prefix_cache else request.scope.get(OWNER_KEY))

    def _stalled(self) -> None:
        self.stalled_clients += 1


def _request_id(given: Optional[str]) -> str:
    """The client's X-Request-Id (for tracing through routers), or a new one; 400 for one that is not a short
    token (it is echoed in headers and logs)."""
    if given is None:
        return secrets.token_hex(12)
    if not _REQUEST_ID.fullmatch(given):
        raise bad_request("X-Request-Id must be 1-128 characters of letters, digits and ._:/+=-")
    return given
