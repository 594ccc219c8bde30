"""The Responses API's Response object, built from a chat Usage and output items."""
from __future__ import annotations

from ..base.protocol import now
from .protocol import ResponsesRequest


def response_object(rid: str, model: str, req: ResponsesRequest, output: list, u, status: str) -> dict:
    """The Response object: `u` a chat Usage (None while in progress)."""
    usage = None if u is None else {
        "input_tokens": u.prompt_tokens, "output_tokens": u.completion_tokens, "total_tokens": u.total_tokens,
        "input_tokens_details": {"cached_tokens": u.prompt_tokens_details.cached_tokens},
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens(u)}}
    return {"id": rid, "object": "response", "created_at": now(), "status": status, "model": model,
            "output": output, "parallel_tool_calls": req.parallel_tool_calls is not False,
            "tool_choice": req.tool_choice or "auto", "tools": req.tools or [], "instructions": req.instructions,
            "previous_response_id": req.previous_response_id, "usage": usage}


def reasoning_tokens(u) -> int:
    details = getattr(u, "completion_tokens_details", None)
    return getattr(details, "reasoning_tokens", None) or 0
