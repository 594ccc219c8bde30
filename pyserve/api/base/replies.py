"""The reply bodies more than one endpoint family answers with: OpenAI's error JSON, usage, the logprob shapes
(chat's, completions', vLLM's prompt logprobs) and the model list. Each family's own replies are in its
protocol.py; all are ReplyModels (protocol.py: built unvalidated, serialized without what they leave out).
"""
from __future__ import annotations

from typing import Literal, Optional

from pydantic import Field

from .protocol import ReplyModel


class ErrorInfo(ReplyModel):
    message: str
    type: str
    param: Optional[str]
    code: Optional[str]


class ErrorResponse(ReplyModel):
    error: ErrorInfo


class PromptTokensDetails(ReplyModel):
    cached_tokens: int = 0


class CompletionTokensDetails(ReplyModel):
    reasoning_tokens: int = 0


class Usage(ReplyModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails
    completion_tokens_details: Optional[CompletionTokensDetails] = None  # chat with a reasoning parser


def with_reasoning_tokens(u: Usage, n: int) -> Usage:
    """The usage with the tokens generated inside the reasoning."""
    return Usage.model_construct(**{k: getattr(u, k) for k in u.model_fields_set},
                                 completion_tokens_details=CompletionTokensDetails.model_construct(reasoning_tokens=n))


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> Usage:
    return Usage.model_construct(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                                 total_tokens=prompt_tokens + completion_tokens,
                                 prompt_tokens_details=PromptTokensDetails.model_construct(cached_tokens=cached_tokens))


# ---- logprobs: completions' (and vLLM's prompt logprobs), chat's ----

class CompletionLogprobs(ReplyModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[Optional[float]] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class PromptLogprob(ReplyModel):
    """vLLM's shape of one alternative at a prompt position."""
    logprob: float
    rank: Optional[int] = None  # 1 = the most likely (None: outside the reported top)
    decoded_token: str


PromptLogprobs = list[Optional[dict[str, PromptLogprob]]]  # per prompt token, None first; keys are token ids


class TopLogprob(ReplyModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(ReplyModel):
    token: str
    logprob: Optional[float]
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(ReplyModel):
    content: list[TokenLogprob]
    refusal: Optional[list[TokenLogprob]] = None


# ---- /v1/models ----

class ModelCard(ReplyModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "pyserve"
    max_model_len: int
    architecture: Optional[str] = None  # the GGUF's general.architecture (e.g. "gemma4"), where it is known
    # several models behind one server: the model this name serves (an alias's canonical name), whether it
    # is loaded now, and "loading" / "available" (loaded on the first request) / "unavailable" (see `error`)
    root: Optional[str] = None
    loaded: Optional[bool] = None
    status: Optional[str] = None
    error: Optional[str] = None


class ModelList(ReplyModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]
