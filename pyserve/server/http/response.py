"""The HTTP shapes of what the serving layer returns: JSON bodies and SSE streams."""
from __future__ import annotations

from typing import Optional, Union

from quart import Response

from ...api.base.streaming import EventStream
from . import sse


def json_response(obj, status: int = 200, headers: Optional[dict] = None) -> Response:
    return Response(sse.dumps(obj), status=status, headers=headers, content_type="application/json")


def sse_response(stream: EventStream) -> Response:
    resp = Response(sse.body(stream), status=200, headers=sse.HEADERS)
    resp.timeout = None  # Quart's RESPONSE_TIMEOUT would cut long streams
    return resp


def reply(result: Union[object, EventStream], stream: bool) -> Response:
    """What an endpoint made of a request: an SSE stream when it asked to stream, else its JSON body."""
    return sse_response(result) if stream else json_response(result)
