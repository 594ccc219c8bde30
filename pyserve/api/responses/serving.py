"""/v1/responses: a Responses request translated into a ChatCompletionRequest, served by ChatServing.create, its
ChatCompletionResponse translated back into a Response object (streamed: its chunks into the Responses API's
events, stream.py)."""
from __future__ import annotations

import json
from functools import partial
from typing import Optional

from pydantic import ValidationError

from ..base.context import RequestContext
from ..base.errors import bad_request
from ..base.protocol import StreamOptions
from ..chat.protocol import ChatCompletionRequest
from .items import input_items, output_message
from .object import response_object
from .protocol import ResponsesRequest
from .store import ResponseStore
from .stream import responses_events


def _item_message(item: dict) -> dict:
    """One input item as a chat message (message, function_call, function_call_output)."""
    kind = item.get("type", "message")
    if kind == "message":
        content = item.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        return {"role": item.get("role", "user"), "content": content}
    if kind == "function_call":
        return {"role": "assistant", "content": None, "tool_calls": [{
            "id": item.get("call_id"), "type": "function",
            "function": {"name": item.get("name"), "arguments": item.get("arguments", "")}}]}
    if kind == "function_call_output":
        return {"role": "tool", "tool_call_id": item.get("call_id"), "content": item.get("output", "")}
    raise bad_request(f"input items of type {kind!r} are not supported", param="input")


def _tools(req: ResponsesRequest):
    out = []
    for t in req.tools or []:
        if t.get("type") != "function":
            continue  # other tool types (web_search, local_shell, ...) are skipped, as llama.cpp does for Codex
        out.append({"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters")
                                                      if k in t}})
    return out or None


def _tool_choice(choice):
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    return choice


def _response_format(text):
    fmt = (text or {}).get("format")
    if not fmt or fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {k: fmt[k] for k in ("name", "schema", "strict") if k in fmt}}
    return {"type": fmt.get("type")}


def input_messages(req: ResponsesRequest) -> list[dict]:
    """This request's input as chat messages (without the instructions)."""
    if isinstance(req.input, str):
        return [{"role": "user", "content": req.input}]
    return [_item_message(i) for i in req.input if i.get("type") != "reasoning"]


def chat_request(req: ResponsesRequest, conversation: list[dict]) -> ChatCompletionRequest:
    """The chat request: the instructions as the system message, then `conversation` (chat messages)."""
    system = [{"role": "system", "content": req.instructions}] if req.instructions else []
    body = {"model": req.model, "messages": system + conversation, "max_tokens": req.max_output_tokens,
            "temperature": req.temperature, "top_p": req.top_p, "tools": _tools(req),
            "tool_choice": _tool_choice(req.tool_choice) if req.tools else None,
            "parallel_tool_calls": req.parallel_tool_calls, "response_format": _response_format(req.text),
            "reasoning_effort": (req.reasoning or {}).get("effort"), "prompt_cache_key": req.prompt_cache_key}
    try:
        return ChatCompletionRequest.model_validate({k: v for k, v in body.items() if v is not None})
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        field = _FIELDS.get(str(first["loc"][0]) if first["loc"] else "", "input")
        raise bad_request(f"{field}: {first['msg']}", param=field) from None


# the chat request's fields → the Responses fields they came from (for a 400 naming the field sent)
_FIELDS = {"messages": "input", "max_tokens": "max_output_tokens", "response_format": "text.format",
           "reasoning_effort": "reasoning.effort", "tools": "tools", "tool_choice": "tool_choice",
           "temperature": "temperature", "top_p": "top_p", "parallel_tool_calls": "parallel_tool_calls"}


def _output(msg, rid: str) -> list[dict]:
    thought = getattr(msg, "reasoning_content", None)
    out = [{"type": "reasoning", "id": f"rs_{rid}", "summary": [], "status": "completed",
            "content": [{"type": "reasoning_text", "text": thought}]}] if thought else []
    for i, call in enumerate(getattr(msg, "tool_calls", None) or []):
        f = call["function"] if isinstance(call, dict) else call.function
        f = f if isinstance(f, dict) else f.model_dump()
        cid = call["id"] if isinstance(call, dict) else call.id
        out.append({"type": "function_call", "id": f"fc_{rid}_{i}", "call_id": cid, "name": f["name"],
                    "arguments": f["arguments"] if isinstance(f["arguments"], str) else json.dumps(f["arguments"]),
                    "status": "completed"})
    if msg.content:
        out.append({"type": "message", "id": f"msg_{rid}", "status": "completed", "role": "assistant",
                    "content": [{"type": "output_text", "text": msg.content, "annotations": []}]})
    return out


def completed(req: ResponsesRequest, chat, rid: Optional[str] = None) -> dict:
    """The completed Response of a chat completion (its id `rid`, else built on the chat's)."""
    tag = chat.id.removeprefix("chatcmpl-")
    return response_object(rid or f"resp_{tag}", chat.model, req, _output(chat.choices[0].message, tag),
                           chat.usage, "completed")


class ResponsesServing:
    def __init__(self, chat, store: ResponseStore):
        self.chat, self.store = chat, store

    def prepare(self, req: ResponsesRequest, ctx: RequestContext) -> tuple[list[dict], ChatCompletionRequest]:
        """The conversation (stored turns `previous_response_id` names, then this input) and its chat request."""
        prior = self.store.previous(ctx.owner, req.previous_response_id) if req.previous_response_id else []
        conversation = prior + input_messages(req)
        return conversation, chat_request(req, conversation)

    async def create(self, req: ResponsesRequest, ctx: RequestContext):
        conversation, creq = self.prepare(req, ctx)
        keep = partial(self._keep, req, ctx.owner, conversation) if req.store is not False else None
        if req.stream:
            creq.stream, creq.stream_options = True, StreamOptions(include_usage=True)
            return responses_events(await self.chat.create(creq, ctx), req, keep)
        resp = completed(req, await self.chat.create(creq, ctx))
        if keep:
            keep(resp)
        return resp

    def _keep(self, req: ResponsesRequest, owner, conversation: list[dict], resp: dict) -> None:
        """Stores a completed response with its conversation (what a later previous_response_id prepends)."""
        messages = conversation + [output_message(resp["output"])]
        self.store.put(owner, resp, messages, input_items(req, resp["id"]))

    async def input_tokens(self, req: ResponsesRequest, ctx: RequestContext) -> dict:
        """/v1/responses/input_tokens: the prompt's length as /v1/responses would render it."""
        self.chat.model.check_name(req.model)
        prior = self.store.previous(ctx.owner, req.previous_response_id) if req.previous_response_id else []
        creq = chat_request(req, prior + input_messages(req))
        ids = await self.chat.prompt_ids(creq, self.chat.tool_plan(creq))
        return {"object": "response.input_tokens", "input_tokens": len(ids)}
