"""The Responses API's request (/v1/responses), fields in OpenAI's documented order."""
from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field


class ResponsesRequest(BaseModel):
    model_config = ConfigDict(extra="allow", defer_build=True)  # built as protocol.RequestModel's
    background: Optional[bool] = None
    include: Optional[list[str]] = None
    input: Union[str, list[dict[str, Any]]] = Field(min_length=1)
    instructions: Optional[str] = None
    max_output_tokens: Optional[int] = Field(default=None, ge=1)
    metadata: Optional[dict] = None
    model: Optional[str] = None
    parallel_tool_calls: Optional[bool] = None
    previous_response_id: Optional[str] = None
    prompt_cache_key: Optional[str] = None
    reasoning: Optional[dict] = None
    store: Optional[bool] = None
    stream: Optional[bool] = None
    temperature: Optional[float] = Field(default=None, ge=0, le=2)
    text: Optional[dict] = None
    tool_choice: Optional[Union[str, dict]] = None
    tools: Optional[list[dict[str, Any]]] = None
    top_p: Optional[float] = Field(default=None, gt=0, le=1)
    user: Optional[str] = None
