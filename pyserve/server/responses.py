"""The HTTP shapes of what the serving layer returns: JSON bodies and SSE streams."""
from __future__ import annotations

from typing import Optional

from pydantic import BaseModel
from quart import Response

from ..openai.sse import HEADERS, dumps


def json_response(obj, status: int = 200, headers: Optional[dict] = None) -> Response:
    return Response(dumps(obj), status=status, headers=headers, content_type="application/json")


def sse_response(body) -> Response:
    resp = Response(body, status=200, headers=HEADERS)
    resp.timeout = None  # Quart's RESPONSE_TIMEOUT would cut long streams
    return resp


def reply(result) -> Response:
    """A response model as JSON, an SSE body (an async iterator of bytes) as a stream."""
    return json_response(result) if isinstance(result, BaseModel) else sse_response(result)
