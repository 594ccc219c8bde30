"""Anthropic's Messages API request models (pydantic v2), in Anthropic's field order.

Strict as the OpenAI models (api/base/protocol.py: no "1" for 1, unknown fields accepted and ignored); a block
type pyserve cannot serve (images, documents, server tools) is refused with a 400 naming it rather than
dropped. Sampling bounds are Anthropic's (temperature in [0, 1]) where they are narrower than the engine's.
"""
from __future__ import annotations

from typing import Annotated, Literal, Optional, Union

from pydantic import Field, StringConstraints, field_validator

from ..base.protocol import (MAX_MESSAGES, MAX_STOP, MAX_TOOLS, RequestModel, StopString, ToolName, TopK, TopP,
                              unsupported_error)

# Block types Anthropic defines that pyserve does not serve (refused, never dropped)
_REFUSED_BLOCKS = ("image", "document", "search_result", "server_tool_use", "web_search_tool_result",
                   "container_upload", "tool_reference")


class TextBlock(RequestModel):
    type: Literal["text"]
    text: str
    cache_control: Optional[dict] = None  # a breakpoint: with a disk tier, the prompt is written through to it
    citations: Optional[list] = None


class ToolUseBlock(RequestModel):
    type: Literal["tool_use"]
    id: Annotated[str, StringConstraints(min_length=1)]
    name: str
    input: dict
    cache_control: Optional[dict] = None


class ToolResultBlock(RequestModel):
    type: Literal["tool_result"]
    tool_use_id: Annotated[str, StringConstraints(min_length=1)]
    content: Optional[Union[str, list[TextBlock]]] = None
    is_error: Optional[bool] = None
    cache_control: Optional[dict] = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "\n".join(b.text for b in self.content)
        return self.content or ""


class ThinkingBlock(RequestModel):
    type: Literal["thinking"]
    thinking: str
    signature: Optional[str] = None  # pyserve signs nothing; what it sent back (empty) is accepted


class RedactedThinkingBlock(RequestModel):
    type: Literal["redacted_thinking"]
    data: str


class RefusedBlock(RequestModel):
    type: str

    @field_validator("type")
    @classmethod
    def _refused(cls, v: str) -> str:
        if v in _REFUSED_BLOCKS:
            raise unsupported_error(f"content blocks of type {v!r}")
        raise ValueError(f"{v!r} is not a known content block type")


ContentBlock = Annotated[Union[TextBlock, ToolUseBlock, ToolResultBlock, ThinkingBlock, RedactedThinkingBlock,
                               RefusedBlock], Field(union_mode="left_to_right")]


class Message(RequestModel):
    role: Literal["user", "assistant"]
    content: Union[str, list[ContentBlock]]

    def blocks(self) -> list:
        return [TextBlock(type="text", text=self.content)] if isinstance(self.content, str) else self.content


class Tool(RequestModel):
    name: ToolName
    description: Optional[str] = None
    input_schema: dict
    type: Optional[Literal["custom"]] = None
    cache_control: Optional[dict] = None


class ToolChoice(RequestModel):
    type: Literal["auto", "any", "tool", "none"]
    name: Optional[str] = None
    disable_parallel_tool_use: Optional[bool] = None


class ThinkingConfig(RequestModel):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: Annotated[Optional[int], Field(ge=1)] = None


class Metadata(RequestModel):
    user_id: Optional[str] = None


Messages = Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES)]
System = Optional[Union[str, list[TextBlock]]]
Tools = Optional[Annotated[list[Tool], Field(max_length=MAX_TOOLS)]]


class CountTokensRequest(RequestModel):
    """/v1/messages/count_tokens: the prompt fields of a message request."""
    messages: Messages
    model: str
    system: System = None
    thinking: Optional[ThinkingConfig] = None
    tool_choice: Optional[ToolChoice] = None
    tools: Tools = None


class MessagesRequest(RequestModel):
    """/v1/messages."""
    model: str
    max_tokens: Annotated[int, Field(ge=1)]
    messages: Messages
    metadata: Optional[Metadata] = None
    service_tier: Optional[str] = None
    stop_sequences: Optional[Annotated[list[StopString], Field(max_length=MAX_STOP)]] = None
    stream: Optional[bool] = None
    system: System = None
    temperature: Annotated[Optional[float], Field(ge=0, le=1)] = None
    thinking: Optional[ThinkingConfig] = None
    tool_choice: Optional[ToolChoice] = None
    tools: Tools = None
    top_k: TopK = None
    top_p: TopP = None
