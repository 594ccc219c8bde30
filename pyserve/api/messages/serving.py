"""/v1/messages and /v1/messages/count_tokens: the Anthropic request as a chat request (convert.py), served
by ChatServing.create, its response or chunk stream translated back (shapes.py, stream.py)."""
from __future__ import annotations

from typing import Union

from ..base.context import RequestContext
from ..base.streaming import EventStream
from . import shapes
from .convert import chat_request
from .protocol import CountTokensRequest, MessagesRequest
from .stream import message_events


async def create_message(serving, req: MessagesRequest, ctx: RequestContext) -> Union[dict, EventStream]:
    chat = await serving.chat.create(chat_request(req), ctx)
    if isinstance(chat, EventStream):
        return message_events(chat, serving.model.name)
    return shapes.response(chat)


async def count_tokens(serving, req: CountTokensRequest) -> dict:
    """The prompt's length, as the same request would be rendered for /v1/messages."""
    chat = chat_request(req)
    ids = await serving.chat.prompt_ids(chat, serving.chat.tool_plan(chat))
    return {"input_tokens": len(ids)}
