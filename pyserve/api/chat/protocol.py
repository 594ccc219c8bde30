"""/v1/chat/completions' models: the request (messages, tools, the prompt's rules that /apply-template and
/tokenize share, OpenAI's fields in its order, then vLLM's and pyserve's extras) and its replies (the
completion, and the chunks of a stream).
"""
from __future__ import annotations

from typing import Annotated, Any, Literal, Optional, Union

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from ...engine.sampling_params import MAX_LOGPROBS
from ..base.errors import bad_request, unsupported
from ..base.protocol import (MAX_MESSAGES, MAX_TOOLS, MaxTokens, NChoices, Penalty, ReplyModel, RequestModel, Seed,
                             Stop, StreamOptions, Temperature, ToolName, TopP, unsupported_error)
from ..base.replies import ChoiceLogprobs, PromptLogprobs, Usage
from ..base.sampling import ResponseFormat, SamplingRequest

_TEXT_PARTS = ("text", "input_text")
_MEDIA_PARTS = ("image_url", "input_image", "input_audio", "file", "refusal", "image", "audio")


# ---- messages ----

class ContentPart(RequestModel):
    type: str
    text: Optional[str] = Field(None, validate_default=True)

    @field_validator("type")
    @classmethod
    def _known_type(cls, v: str) -> str:
        if v not in _TEXT_PARTS and v not in _MEDIA_PARTS:
            raise ValueError(f"{v!r} is not a known content type")
        return v

    @field_validator("text")
    @classmethod
    def _text_of_text_part(cls, v: Optional[str], info: ValidationInfo) -> Optional[str]:
        if v is None and info.data.get("type") in _TEXT_PARTS:
            raise ValueError("a text part needs 'text' (a string)")
        return v

    @model_validator(mode="after")
    def _text_only(self) -> "ContentPart":
        if self.type in _MEDIA_PARTS:
            raise unsupported_error(f"message content of type {self.type!r}")
        return self


class FunctionCall(RequestModel):
    name: str
    arguments: str  # JSON text, as OpenAI sends it back


class ToolCall(RequestModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(RequestModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Optional[Union[str, list[ContentPart]]] = None
    name: Optional[str] = None
    tool_calls: Optional[list[ToolCall]] = None
    tool_call_id: Optional[str] = None
    function_call: Optional[Any] = None

    def for_template(self) -> dict:
        """The message as templates see it: text parts joined into one string, None-valued keys dropped,
        `developer` as `system` (what templates know); chat_template.decode_tool_call_arguments then makes
        tool calls what templates expect."""
        m = self.model_dump(exclude_none=True)
        if isinstance(self.content, list):
            m["content"] = "\n".join(p.text or "" for p in self.content)
        if self.role == "developer":
            m["role"] = "system"
        return m

    def text_bytes(self) -> int:
        calls = sum(len(c.function.arguments.encode()) for c in self.tool_calls or ())
        if isinstance(self.content, str):
            return len(self.content.encode()) + calls
        return sum(len((p.text or "").encode()) for p in self.content or ()) + calls


def _check_messages(messages: list[ChatMessage]) -> list[ChatMessage]:
    """The rules between a message's fields, in one pass over the list (a pydantic validator per message
    costs more than the rest of its validation)."""
    for i, m in enumerate(messages):
        if m.content is None and not (m.role == "assistant"):
            raise bad_request(f"'messages[{i}].content' is required for role {m.role!r}",
                              param=f"messages[{i}].content")
        if m.function_call:
            raise unsupported("messages with a legacy function_call (use tool_calls)", f"messages[{i}].function_call")
        if m.tool_calls and m.role != "assistant":
            raise bad_request(f"'messages[{i}].tool_calls' belong to an assistant message",
                              param=f"messages[{i}].tool_calls")
        if m.role == "tool" and not m.tool_call_id:
            raise bad_request(f"'messages[{i}].tool_call_id' is required for role 'tool'",
                              param=f"messages[{i}].tool_call_id")
    return messages


Messages = Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES), AfterValidator(_check_messages)]


# ---- tools ----

class FunctionDefinition(RequestModel):
    name: ToolName
    description: Optional[str] = None
    parameters: Optional[dict] = None  # a JSON schema of the arguments object; none: any object
    strict: Optional[bool] = None


class ChatTool(RequestModel):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(RequestModel):
    name: str


class NamedToolChoice(RequestModel):
    type: Literal["function"]
    function: NamedFunction


ToolChoice = Optional[Union[Literal["none", "auto", "required"], NamedToolChoice]]
Tools = Optional[Annotated[list[ChatTool], Field(min_length=1, max_length=MAX_TOOLS)]]


def _check_tools(req) -> None:
    """tool_choice needs tools and names one of them; tool names are unique."""
    names = [t.function.name for t in req.tools or ()]
    if len(set(names)) != len(names):
        raise bad_request("'tools': function names must be unique", param="tools")
    if req.tool_choice is not None and not req.tools:
        raise bad_request("'tool_choice' is only allowed when 'tools' are given", param="tool_choice")
    if isinstance(req.tool_choice, NamedToolChoice) and req.tool_choice.function.name not in names:
        raise bad_request(f"'tool_choice': no tool named {req.tool_choice.function.name!r} in 'tools'",
                          param="tool_choice")


# ---- the chat prompt: chat completions, /apply-template, /tokenize with messages ----

class ChatPrompt(RequestModel):
    """The rules of the fields a chat prompt is rendered from (messages, tools, the template's options).
    Chat completions and the template endpoints declare those fields with the same types (Messages, Tools,
    ToolChoice), chat in OpenAI's order, and ChatServing renders all three from them one way: what
    /apply-template and /tokenize show is what the model gets for the same chat request."""

    @model_validator(mode="after")
    def _prompt_rules(self):
        _continue_or_prompt(self)
        _check_tools(self)
        return self

    def tool_mode(self) -> str:
        """"none" (no tools, or tool_choice none), "auto" (the default with tools), "required" or "named"."""
        if not self.tools or self.tool_choice == "none":
            return "none"
        if isinstance(self.tool_choice, NamedToolChoice):
            return "named"
        return self.tool_choice or "auto"

    def text_bytes(self) -> int:
        return sum(m.text_bytes() for m in self.messages or ())


def _continue_or_prompt(req) -> None:
    """continue_final_message leaves the last message open, add_generation_prompt opens a new turn: one or
    the other (vLLM's 400 when both are asked; continue_final_message alone turns the prompt off)."""
    if not req.continue_final_message:
        return
    if req.add_generation_prompt and "add_generation_prompt" in req.model_fields_set:
        raise bad_request("'continue_final_message' and 'add_generation_prompt' cannot both be true",
                          param="continue_final_message")
    req.add_generation_prompt = False


# ---- the request ----

class _OpenAIChatFields(ChatPrompt):
    """OpenAI's fields of a chat completion request, in its order."""
    messages: Messages
    model: Optional[str] = None
    audio: Optional[dict] = None
    frequency_penalty: Penalty = None
    function_call: Optional[Any] = None
    functions: Optional[list] = None
    logit_bias: Optional[dict[str, Any]] = None
    logprobs: Optional[bool] = None
    max_completion_tokens: MaxTokens = None
    max_tokens: MaxTokens = None
    metadata: Optional[dict] = None
    modalities: Optional[list[str]] = None
    n: NChoices = None
    parallel_tool_calls: Optional[bool] = None  # default true
    prediction: Optional[dict] = None
    presence_penalty: Penalty = None
    # OpenAI's: the prompt is one the client will send again — with a disk tier, its prefix is written through
    # to disk at once (not only when the pool evicts it)
    prompt_cache_key: Optional[str] = None
    reasoning_effort: Optional[Literal["none", "minimal", "low", "medium", "high"]] = None  # none: no thinking
    response_format: Optional[ResponseFormat] = None
    seed: Seed = None
    service_tier: Optional[str] = None
    stop: Stop = None
    store: Optional[bool] = None
    stream: Optional[bool] = None
    stream_options: Optional[StreamOptions] = None
    temperature: Temperature = None
    tool_choice: ToolChoice = None
    tools: Tools = None
    top_logprobs: Annotated[Optional[int], Field(ge=0, le=MAX_LOGPROBS)] = None
    top_p: TopP = None
    user: Optional[str] = None


class ChatCompletionRequest(SamplingRequest, _OpenAIChatFields):
    """A /v1/chat/completions request: OpenAI's fields in its order, then vLLM's sampling extras and the
    structured-output forms chat and completions share, then chat's own extras (vLLM's template options and
    the reasoning's token budget)."""
    # (pydantic lists a later base's fields first: _OpenAIChatFields', then SamplingRequest's, then these)
    best_of: Optional[int] = None
    chat_template: Optional[str] = None
    chat_template_kwargs: Optional[dict] = None
    add_generation_prompt: bool = True
    continue_final_message: Optional[bool] = None
    thinking_token_budget: Optional[Annotated[int, Field(ge=0)]] = None  # tokens the reasoning may take

    @field_validator("functions", "function_call")
    @classmethod
    def _no_functions(cls, v, info: ValidationInfo):
        if v:
            raise unsupported_error(f"the legacy '{info.field_name}' (use 'tools' and 'tool_choice')")
        return v

    @field_validator("modalities")
    @classmethod
    def _text_modality(cls, v):
        if v and any(m != "text" for m in v):
            raise unsupported_error("output modalities other than 'text'")
        return v

    @field_validator("audio", "prediction")
    @classmethod
    def _no_audio(cls, v, info: ValidationInfo):
        if v:
            raise unsupported_error("audio output" if info.field_name == "audio" else "predicted outputs ('prediction')")
        return v

    @model_validator(mode="after")
    def _top_logprobs_needs_logprobs(self):
        if self.top_logprobs is not None and not self.logprobs:
            raise bad_request("'top_logprobs' requires 'logprobs' to be true", param="top_logprobs")
        constraint, field_name = self.structured()
        if self.tool_mode() != "none" and constraint is not None:
            raise bad_request(f"at most one constraint per request: 'tools' and '{field_name}' were "
                              "both given (send tool_choice 'none' to constrain the answer)", param="tools")
        return self

    def logprobs_wanted(self) -> Optional[int]:
        return (self.top_logprobs or 0) if self.logprobs else None

    def write_through(self) -> bool:
        return self.prompt_cache_key is not None

    def max_new_tokens(self) -> tuple[Optional[int], str]:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"


# ---- the replies ----

class AssistantMessage(ReplyModel):
    role: Literal["assistant"] = "assistant"
    content: Optional[str]
    refusal: Optional[str] = None
    # [{id: "call_…", type: "function", function: {name, arguments: JSON text}}]; absent without tools
    tool_calls: Optional[list[dict]] = None
    # the model's reasoning (llama.cpp's and LangChain's name, and vLLM's / Ollama's): absent when it did not reason
    reasoning_content: Optional[str] = None
    reasoning: Optional[str] = None


class ChatChoice(ReplyModel):
    index: int
    message: AssistantMessage
    logprobs: Optional[ChoiceLogprobs] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[str] = None  # vLLM's: the stop string that ended it (sent only then)


class ChatCompletionResponse(ReplyModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: Optional[str] = None
    choices: list[ChatChoice]
    usage: Usage
    prompt_logprobs: Optional[PromptLogprobs] = None  # vLLM's extra, when asked


class DeltaMessage(ReplyModel):
    role: Optional[Literal["assistant"]] = None
    content: Optional[str] = None
    # a call's first entry {index, id, type, function: {name, arguments}}, then {index, function: {arguments}}
    tool_calls: Optional[list[dict]] = None
    reasoning_content: Optional[str] = None  # a piece of the reasoning (and the same as `reasoning`)
    reasoning: Optional[str] = None


class ChatChunkChoice(ReplyModel):
    index: int
    delta: DeltaMessage
    logprobs: Optional[ChoiceLogprobs] = None
    finish_reason: Optional[str] = None
    stop_reason: Optional[str] = None  # vLLM's: the stop string that ended it (sent only then)


class ChatCompletionChunk(ReplyModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: Optional[str] = None
    choices: list[ChatChunkChoice]
    usage: Optional[Usage] = None
    prompt_progress: Optional[dict] = None  # llama.cpp's (return_progress): {total, cache, processed, time_ms}
