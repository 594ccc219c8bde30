"""The OpenAI response models (pydantic v2), in OpenAI's field order; `/openapi.json` describes them.

Responses are pyserve's own data, so they are built without validation (`model_construct`: chunks are on
every token's path) and serialized with `exclude_unset` (server/sse.py: dumps): every field is passed explicitly, and
one that a response leaves out on purpose (a delta's `role` after the first chunk, `usage` when the client
did not ask for it, `token_strs` unless asked) is absent from its JSON, as in OpenAI's.
"""
from __future__ import annotations

import time
from typing import Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field


class ResponseModel(BaseModel):
    # Its serializer is built on first use or by protocol.build_deferred once the server is ready, not at
    # import: building every model's took ~70 ms of start-up with protocol.py's (docs/BENCHMARKS.md).
    model_config = ConfigDict(defer_build=True)


def now() -> int:
    return int(time.time())


class ErrorInfo(ResponseModel):
    message: str
    type: str
    param: Optional[str]
    code: Optional[str]


class ErrorResponse(ResponseModel):
    error: ErrorInfo


class PromptTokensDetails(ResponseModel):
    cached_tokens: int = 0


class CompletionTokensDetails(ResponseModel):
    reasoning_tokens: int = 0


class Usage(ResponseModel):
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


# ---- /v1/completions ----

class CompletionLogprobs(ResponseModel):
    tokens: list[str] = Field(default_factory=list)
    token_logprobs: list[Optional[float]] = Field(default_factory=list)
    top_logprobs: list[dict[str, float]] = Field(default_factory=list)
    text_offset: list[int] = Field(default_factory=list)


class PromptLogprob(ResponseModel):
    """vLLM's shape of one alternative at a prompt position."""
    logprob: float
    rank: Optional[int] = None  # 1 = the most likely (None: outside the reported top)
    decoded_token: str


PromptLogprobs = list[Optional[dict[str, PromptLogprob]]]  # per prompt token, None first; keys are token ids


class CompletionChoice(ResponseModel):
    index: int
    text: str
    logprobs: Optional[CompletionLogprobs] = None
    finish_reason: Optional[str] = None
    prompt_logprobs: Optional[PromptLogprobs] = None  # vLLM's extra, when asked


class CompletionResponse(ResponseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    system_fingerprint: Optional[str] = None
    choices: list[CompletionChoice]
    usage: Optional[Usage] = None


# ---- /v1/chat/completions ----

class TopLogprob(ResponseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(ResponseModel):
    token: str
    logprob: Optional[float]
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(ResponseModel):
    content: list[TokenLogprob]
    refusal: Optional[list[TokenLogprob]] = None


class AssistantMessage(ResponseModel):
    role: Literal["assistant"] = "assistant"
    content: Optional[str]
    refusal: Optional[str] = None
    # [{id: "call_…", type: "function", function: {name, arguments: JSON text}}]; absent without tools
    tool_calls: Optional[list[dict]] = None
    # the model's reasoning (llama.cpp's and LangChain's name, and vLLM's / Ollama's): absent when it did not reason
    reasoning_content: Optional[str] = None
    reasoning: Optional[str] = None


class ChatChoice(ResponseModel):
    index: int
    message: AssistantMessage
    logprobs: Optional[ChoiceLogprobs] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[str] = None  # vLLM's: the stop string that ended it (sent only then)


class ChatCompletionResponse(ResponseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: Optional[str] = None
    choices: list[ChatChoice]
    usage: Usage
    prompt_logprobs: Optional[PromptLogprobs] = None  # vLLM's extra, when asked


class DeltaMessage(ResponseModel):
    role: Optional[Literal["assistant"]] = None
    content: Optional[str] = None
    # a call's first entry {index, id, type, function: {name, arguments}}, then {index, function: {arguments}}
    tool_calls: Optional[list[dict]] = None
    reasoning_content: Optional[str] = None  # a piece of the reasoning (and the same as `reasoning`)
    reasoning: Optional[str] = None


class ChatChunkChoice(ResponseModel):
    index: int
    delta: DeltaMessage
    logprobs: Optional[ChoiceLogprobs] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[str] = None  # vLLM's: the stop string that ended it (sent only then)


class ChatCompletionChunk(ResponseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: Optional[str] = None
    choices: list[ChatChunkChoice]
    usage: Optional[Usage] = None


# ---- the other endpoints ----

class ModelCard(ResponseModel):
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


class ModelList(ResponseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(ResponseModel):
    tokens: list[int]
    count: int
    max_model_len: int
    token_strs: Optional[list[str]] = None


class DetokenizeResponse(ResponseModel):
    prompt: str


class TemplateResponse(ResponseModel):
    prompt: str


class EmbeddingData(ResponseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: Union[list[float], str]  # base64: little-endian float32


class EmbeddingUsage(ResponseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(ResponseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: EmbeddingUsage


class TokenizerInfo(ResponseModel):
    """vLLM's GET /tokenizer_info (what lm-eval's `tokenizer_backend=remote` reads)."""
    tokenizer_class: str
    bos_token: Optional[str]
    eos_token: Optional[str]
    pad_token: Optional[str]
    add_bos_token: bool
    model_max_length: int
    chat_template: Optional[str]
