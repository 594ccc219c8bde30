"""The OpenAI request models (pydantic v2), in OpenAI's field order, with OpenAI's bounds declared once on
the fields; `/openapi.json` is generated from the same models (openapi.py).

A body is parsed and validated in one pass of pydantic's JSON parser (`parse_body`), in strict mode (no "1"
for 1, no true for 1). Unknown fields are accepted and ignored (the first few names are logged once). A
validation error becomes OpenAI's error JSON with `param` taken from the error's location
(errors.from_validation). Rules that tie two fields together raise OpenAIError from a model validator (pydantic
passes it through untouched). `to_sampling_params` is the only bridge to the engine.
"""
from __future__ import annotations

import logging
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, StringConstraints, ValidationError,
                      ValidationInfo)
from pydantic import field_validator, model_validator
from pydantic_core import PydanticCustomError

from ..engine.limits import field_limits
from ..engine.sampling_params import MAX_LOGPROBS, SamplingParams
from ..engine.structured import StructuredOutputsParams
from .errors import bad_request, from_validation, unsupported

log = logging.getLogger("pyserve.server")

# Bounds (OpenAI's where it has one; documented in docs/HARDENING.md)
MAX_N = 16  # choices per prompt
MAX_PROMPTS = 64  # prompts in one /v1/completions request
MAX_CHOICES = 128  # prompts x n
MAX_STOP = 16  # stop strings (OpenAI: 4; pyserve allows more)
MAX_STOP_LEN = 256  # characters per stop string
MAX_STOP_TOKEN_IDS = 64
MAX_LOGIT_BIAS = 1024  # entries
MAX_MESSAGES = 4096
SEED_MASK = (1 << 63) - 1  # the engine takes a non-negative int64 seed

# A token id on the wire: an int32, the engine's id type (whether it is in the vocabulary is the engine's rule)
TokenId = Annotated[int, Field(ge=-(1 << 31), lt=1 << 31)]

_TEXT_PARTS = ("text", "input_text")
_MEDIA_PARTS = ("image_url", "input_image", "input_audio", "file", "refusal", "image", "audio")


def _unsupported(what: str) -> PydanticCustomError:
    return PydanticCustomError("unsupported", "{what} is not supported by pyserve", {"what": what})


class _Model(BaseModel):
    # defer_build: as responses.ResponseModel's, built on first use or by build_deferred.
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False, defer_build=True)


async def build_deferred() -> int:
    """Builds every pyserve pydantic model not yet built (their defer_build), one per scheduler turn so that
    requests already being served are not held up; the count built. The server runs it once it is ready, so
    that a first request of each kind does not build its models itself."""
    import trio

    built = 0
    for cls in _pyserve_models(BaseModel):
        if not cls.__pydantic_complete__:
            try:
                cls.model_rebuild()
            except Exception:  # noqa: BLE001 - its first use raises the same: its requests fail, not the server
                log.exception("pydantic model %s.%s does not build", cls.__module__, cls.__qualname__)
            built += 1
            await trio.lowlevel.checkpoint()
    return built


def _pyserve_models(base: type) -> list[type]:
    """pyserve's subclasses of `base`, recursively, each once (a class of two bases is below both)."""
    out: dict[type, None] = {}
    for cls in base.__subclasses__():
        if cls.__module__.startswith("pyserve."):
            out[cls] = None
        out.update(dict.fromkeys(_pyserve_models(cls)))
    return list(out)


# ---- messages ----

class ContentPart(_Model):
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
            raise _unsupported(f"message content of type {self.type!r}")
        return self


class FunctionCall(_Model):
    name: str
    arguments: str  # JSON text, as OpenAI sends it back


class ToolCall(_Model):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Model):
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


# ---- sampling fields (both endpoints) ----

StopString = Annotated[str, StringConstraints(max_length=MAX_STOP_LEN)]


class StreamOptions(_Model):
    include_usage: Optional[bool] = None


def _token_id_keys(bias: Optional[dict]) -> dict[int, float]:
    """logit_bias: {"token id": bias in [-100, 100]} → {id: bias}."""
    if not bias:
        return {}
    if len(bias) > MAX_LOGIT_BIAS:
        raise ValueError(f"holds at most {MAX_LOGIT_BIAS} entries")
    out = {}
    for k, v in bias.items():
        if not k.strip().lstrip("-").isdigit() or not -(1 << 31) <= int(k) < 1 << 31:
            raise ValueError(f"keys must be token ids (integers as strings), got {k!r}")
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
            raise ValueError(f"the bias for token {k} must be a number in [-100, 100], got {v!r}")
        out[int(k)] = float(v)
    return out


# Each shared field's type and bounds, written once: a sampler field's range is the engine's (engine/limits.py:
# what its own check applies), narrowed where the API caps it; both endpoints list them in OpenAI's order.
Penalty = Annotated[Optional[float], Field(**field_limits("presence_penalty"))]  # frequency_penalty's is the same
MaxTokens = Annotated[Optional[int], Field(ge=1)]
NChoices = Annotated[Optional[int], Field(ge=1, le=MAX_N)]
Stop = Optional[Union[StopString, Annotated[list[StopString], Field(max_length=MAX_STOP)]]]
Temperature = Annotated[Optional[float], Field(**field_limits("temperature") | {"le": 2})]  # OpenAI's cap
TopP = Annotated[Optional[float], Field(**field_limits("top_p"))]
TopK = Annotated[Optional[int], Field(**field_limits("top_k", int))]
MinP = Annotated[Optional[float], Field(**field_limits("min_p"))]
RepetitionPenalty = Annotated[Optional[float], Field(**field_limits("repetition_penalty") | {"le": 2})]  # the API's cap
PromptLogprobs = Annotated[Optional[int], Field(ge=0, le=MAX_LOGPROBS)]  # vLLM's: alternatives per prompt token
MinTokens = Annotated[Optional[int], Field(**field_limits("min_tokens", int) | {"lt": 1 << 31})]  # vLLM's: no end (EOS, stop ids, strings) before this
Seed = Annotated[Optional[int], Field(ge=-(1 << 63), lt=1 << 63)]  # an int64 (negative: as its 63-bit mask)
StopTokenIds = Optional[Annotated[list[TokenId], Field(max_length=MAX_STOP_TOKEN_IDS)]]


# ---- tools ----

ToolName = Annotated[str, StringConstraints(pattern=r"^[a-zA-Z0-9_.-]{1,64}$")]  # OpenAI's rule, plus '.'
MAX_TOOLS = 128


class FunctionDefinition(_Model):
    name: ToolName
    description: Optional[str] = None
    parameters: Optional[dict] = None  # a JSON schema of the arguments object; none: any object
    strict: Optional[bool] = None


class ChatTool(_Model):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Model):
    name: str


class NamedToolChoice(_Model):
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


# ---- structured output: OpenAI's response_format, vLLM's structured_outputs (and guided_*), llama.cpp's ----

class JsonSchemaFormat(_Model):
    name: Optional[str] = None
    description: Optional[str] = None
    schema_: Optional[Union[dict, bool]] = Field(None, alias="schema")  # none: any JSON object
    strict: Optional[bool] = None


class ResponseFormat(_Model):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: Optional[JsonSchemaFormat] = None

    @model_validator(mode="after")
    def _schema_given(self):
        if self.type == "json_schema" and self.json_schema is None:
            raise bad_request("response_format of type 'json_schema' needs 'json_schema'", param="response_format")
        return self

    def params(self) -> Optional[StructuredOutputsParams]:
        if self.type == "json_object":
            return StructuredOutputsParams(json_object=True)
        if self.type == "json_schema":
            schema = self.json_schema.schema_
            return StructuredOutputsParams(json=schema) if schema is not None else StructuredOutputsParams(
                json_object=True)
        return None


class StructuredOutputs(_Model):
    """vLLM's structured_outputs: exactly one of json, regex, choice, grammar, json_object."""
    json_: Optional[Union[dict, str]] = Field(None, alias="json")
    regex: Optional[str] = None
    choice: Optional[list[str]] = None
    grammar: Optional[str] = None
    json_object: Optional[bool] = None
    whitespace_pattern: Optional[str] = None
    disable_any_whitespace: Optional[bool] = None  # what pyserve does anyway (compact JSON)
    structural_tag: Optional[Any] = None

    @field_validator("structural_tag")
    @classmethod
    def _no_structural_tag(cls, v):
        if v is not None:  # accepted and then not enforced would be worse than a 400
            raise _unsupported("'structured_outputs.structural_tag'")
        return v

    def params(self) -> StructuredOutputsParams:
        return StructuredOutputsParams(json=self.json_, regex=self.regex, choice=self.choice, grammar=self.grammar,
                                       json_object=self.json_object, whitespace_pattern=self.whitespace_pattern)


# (field, StructuredOutputsParams field) of vLLM's older top-level forms
_GUIDED = (("guided_json", "json"), ("guided_regex", "regex"), ("guided_choice", "choice"),
           ("guided_grammar", "grammar"))


def _constraints(req) -> list[tuple[str, StructuredOutputsParams]]:
    """(request field, constraint) for every constraint the request carries, in any of the three forms."""
    found = []
    rf = req.response_format.params() if req.response_format is not None else None
    if rf is not None:
        found.append(("response_format", rf))
    if req.structured_outputs is not None:
        found.append(("structured_outputs", req.structured_outputs.params()))
    for name, key in _GUIDED:
        if getattr(req, name) is not None:
            found.append((name, StructuredOutputsParams(**{key: getattr(req, name)},
                                                        whitespace_pattern=req.guided_whitespace_pattern)))
    if req.json_schema is not None:
        found.append(("json_schema", StructuredOutputsParams(json=req.json_schema)))
    if req.grammar is not None:
        found.append(("grammar", StructuredOutputsParams(grammar=req.grammar)))
    return found


class _Sampling(_Model):
    """What both endpoints do with the sampling fields they each declare (in OpenAI's order), and the
    constraint fields both take besides response_format (which each declares in its place)."""
    # structured output: vLLM's, its older guided_* forms, llama.cpp's (at most one of all, with response_format)
    structured_outputs: Optional[StructuredOutputs] = None
    guided_json: Optional[Union[dict, str]] = None
    guided_regex: Optional[str] = None
    guided_choice: Optional[list[str]] = None
    guided_grammar: Optional[str] = None
    guided_whitespace_pattern: Optional[str] = None
    json_schema: Optional[Union[dict, bool]] = None
    grammar: Optional[str] = None
    # structured(), once resolved: a plain slot (a pydantic private attribute costs microseconds a request)
    __slots__ = ("_constraint",)

    @field_validator("logit_bias", check_fields=False)
    @classmethod
    def _bias(cls, v):
        return _token_id_keys(v)  # {id: bias}, as the engine takes it

    @model_validator(mode="after")
    def _stream_rules(self):
        if self.stream_options is not None and not self.stream:
            raise bad_request("'stream_options' is only allowed when 'stream' is true", param="stream_options")
        if self.best_of is not None and self.best_of != (self.n or 1):
            raise unsupported("best_of other than n", "best_of")
        object.__setattr__(self, "_constraint", self._resolve_constraint())  # at most one, well-formed: a 400 now
        return self

    def structured(self) -> tuple[Optional[StructuredOutputsParams], Optional[str]]:
        """(the request's constraint, the field that carried it), or (None, None), resolved once. Two
        constraints, or a malformed one (an empty choice, two kinds in structured_outputs), is a 400 naming
        the fields."""
        try:
            return self._constraint
        except AttributeError:  # not set yet (a model made without validation)
            object.__setattr__(self, "_constraint", self._resolve_constraint())
            return self._constraint

    def _resolve_constraint(self) -> tuple[Optional[StructuredOutputsParams], Optional[str]]:
        try:
            found = _constraints(self)
        except ValueError as e:  # StructuredOutputsParams' own rules; the one form that can break them
            field_name = "structured_outputs" if self.structured_outputs is not None else None
            raise bad_request(str(e), param=field_name) from None
        if len(found) > 1:
            names = " and ".join(f"'{n}'" for n, _ in found)
            raise bad_request(f"at most one constraint per request: {names} were both given", param=found[1][0])
        return found[0][1] if found else None, found[0][0] if found else None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    @property
    def n_choices(self) -> int:
        return self.n or 1

    def stop_list(self) -> list[str]:
        stop = [self.stop] if isinstance(self.stop, str) else (self.stop or [])
        return [s for s in stop if s]

    def to_sampling_params(self, max_tokens: int = 1, constraint: Optional[StructuredOutputsParams] = None,
                           keep_special: bool = False) -> SamplingParams:
        """The only bridge to the engine: this request's sampling, for one prompt, all n samples. The serving
        layer adds what the request implies without saying: `constraint` in place of the request's own (a
        chat's tools make one; the two exclude each other), and `keep_special` keeps control tokens in the
        text unless skip_special_tokens is given (a tool parser reads them)."""
        return SamplingParams(
            n=self.n_choices, temperature=_or(self.temperature, 1.0), top_p=_or(self.top_p, 1.0),
            top_k=_or(self.top_k, 0), min_p=_or(self.min_p, 0.0), presence_penalty=_or(self.presence_penalty, 0.0),
            frequency_penalty=_or(self.frequency_penalty, 0.0),
            repetition_penalty=_or(self.repetition_penalty, 1.0),
            seed=None if self.seed is None else self.seed & SEED_MASK, stop=self.stop_list(),
            stop_token_ids=list(self.stop_token_ids or ()), ignore_eos=bool(self.ignore_eos),
            max_tokens=max_tokens, min_tokens=self.min_tokens or 0, logprobs=self.logprobs_wanted(),
            prompt_logprobs=self.prompt_logprobs_wanted(),
            logit_bias=self.logit_bias or {}, skip_special_tokens=_or(self.skip_special_tokens, not keep_special),
            structured_outputs=constraint if constraint is not None else self.structured()[0])

    def logprobs_wanted(self) -> Optional[int]:
        """Alternatives per token (None: no logprobs)."""
        raise NotImplementedError

    def prompt_logprobs_wanted(self) -> Optional[int]:
        """Alternatives per prompt token (None: no prompt logprobs)."""
        return self.prompt_logprobs

    def max_new_tokens(self) -> tuple[Optional[int], str]:
        """(the completion bound the client asked for or None, the field that carried it)."""
        return self.max_tokens, "max_tokens"


def _or(v, default):
    return default if v is None else v


# ---- the chat prompt: chat completions, /apply-template, /tokenize with messages ----

class ChatPrompt(_Model):
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


# ---- the endpoints ----

class ChatCompletionRequest(_Sampling, ChatPrompt):
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
    # vLLM's extras
    best_of: Optional[int] = None
    top_k: TopK = None
    min_p: MinP = None
    repetition_penalty: RepetitionPenalty = None
    ignore_eos: Optional[bool] = None
    min_tokens: MinTokens = None
    stop_token_ids: StopTokenIds = None
    skip_special_tokens: Optional[bool] = None
    chat_template: Optional[str] = None
    chat_template_kwargs: Optional[dict] = None
    add_generation_prompt: bool = True
    continue_final_message: Optional[bool] = None
    add_special_tokens: Optional[bool] = None  # False: no BOS beyond what the template writes
    prompt_logprobs: PromptLogprobs = None
    thinking_token_budget: Optional[Annotated[int, Field(ge=0)]] = None  # tokens the reasoning may take

    @field_validator("functions", "function_call")
    @classmethod
    def _no_functions(cls, v, info: ValidationInfo):
        if v:
            raise _unsupported(f"the legacy '{info.field_name}' (use 'tools' and 'tool_choice')")
        return v

    @field_validator("modalities")
    @classmethod
    def _text_modality(cls, v):
        if v and any(m != "text" for m in v):
            raise _unsupported("output modalities other than 'text'")
        return v

    @field_validator("audio", "prediction")
    @classmethod
    def _no_audio(cls, v, info: ValidationInfo):
        if v:
            raise _unsupported("audio output" if info.field_name == "audio" else "predicted outputs ('prediction')")
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

    def max_new_tokens(self) -> tuple[Optional[int], str]:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens, "max_completion_tokens"
        return self.max_tokens, "max_tokens"


TokenIds = Annotated[list[TokenId], Field(min_length=1)]
Prompt = Union[str, Annotated[list[str], Field(min_length=1, max_length=MAX_PROMPTS)], TokenIds,
               Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)]]


class CompletionRequest(_Sampling):
    model: Optional[str] = None
    prompt: Prompt
    best_of: Optional[int] = None
    echo: Optional[bool] = None
    frequency_penalty: Penalty = None
    logit_bias: Optional[dict[str, Any]] = None
    logprobs: Annotated[Optional[int], Field(ge=0, le=MAX_LOGPROBS)] = None
    max_tokens: Annotated[Optional[int], Field(ge=0)] = None  # 0: score the prompt alone (echo + logprobs)
    n: NChoices = None
    presence_penalty: Penalty = None
    seed: Seed = None
    stop: Stop = None
    stream: Optional[bool] = None
    stream_options: Optional[StreamOptions] = None
    suffix: Optional[str] = None
    temperature: Temperature = None
    top_p: TopP = None
    user: Optional[str] = None
    metadata: Optional[dict] = None
    # vLLM's extras
    top_k: TopK = None
    min_p: MinP = None
    repetition_penalty: RepetitionPenalty = None
    ignore_eos: Optional[bool] = None
    min_tokens: MinTokens = None
    stop_token_ids: StopTokenIds = None
    skip_special_tokens: Optional[bool] = None
    add_special_tokens: Optional[bool] = None  # vLLM's: False sends the prompt without a BOS
    prompt_logprobs: PromptLogprobs = None
    response_format: Optional[ResponseFormat] = None  # as chat's (vLLM takes it on completions too)

    @model_validator(mode="after")
    def _choices(self):
        if self.suffix and self.echo:  # the prompt the model gets is the FIM layout, not the text sent
            raise bad_request("'echo' cannot be used with 'suffix' (fill-in-the-middle)", param="echo")
        if self.max_tokens == 0 and self.prompt_logprobs_wanted() is None:
            raise bad_request("'max_tokens' must be at least 1 (0 only scores the prompt: with 'echo' and "
                              "'logprobs', or 'prompt_logprobs')", param="max_tokens")
        if len(self.prompts) * self.n_choices > MAX_CHOICES:
            raise bad_request(f"prompts x n is at most {MAX_CHOICES}, got {len(self.prompts) * self.n_choices}",
                              param="n")
        return self

    @property
    def prompts(self) -> list[Union[str, list[int]]]:
        """Each prompt: a string or token ids."""
        p = self.prompt
        if isinstance(p, str) or isinstance(p[0], int):
            return [p]
        return list(p)

    def logprobs_wanted(self) -> Optional[int]:
        return self.logprobs

    def prompt_logprobs_wanted(self) -> Optional[int]:
        """Alternatives per prompt token: vLLM's prompt_logprobs, or the echoed prompt's logprobs (what
        lm-eval's log-likelihood requests ask: echo + logprobs)."""
        if self.prompt_logprobs is not None:
            return self.prompt_logprobs
        return self.logprobs if self.echo else None


class TemplateRequest(ChatPrompt):
    """/apply-template: a chat request's prompt fields (chat's types, rules and order), rendered as chat
    renders them."""
    messages: Messages
    model: Optional[str] = None
    parallel_tool_calls: Optional[bool] = None
    tool_choice: ToolChoice = None
    tools: Tools = None
    # vLLM's extras
    chat_template: Optional[str] = None
    chat_template_kwargs: Optional[dict] = None
    add_generation_prompt: bool = True
    continue_final_message: Optional[bool] = None
    add_special_tokens: Optional[bool] = None  # /tokenize: False adds no BOS beyond what the template writes


def _continue_or_prompt(req) -> None:
    """continue_final_message leaves the last message open, add_generation_prompt opens a new turn: one or
    the other (vLLM's 400 when both are asked; continue_final_message alone turns the prompt off)."""
    if not req.continue_final_message:
        return
    if req.add_generation_prompt and "add_generation_prompt" in req.model_fields_set:
        raise bad_request("'continue_final_message' and 'add_generation_prompt' cannot both be true",
                          param="continue_final_message")
    req.add_generation_prompt = False


class TokenizeRequest(TemplateRequest):
    """/tokenize: `prompt` (or llama.cpp's `content`) text, or `messages` (with /apply-template's fields)
    rendered as chat renders them; add_special_tokens applies to both."""
    messages: Optional[Messages] = None
    prompt: Optional[str] = None
    content: Optional[str] = None
    return_token_strs: Optional[bool] = None

    @model_validator(mode="after")
    def _one_input(self):
        if self.messages is None and self.text is None:
            raise bad_request("'prompt' (a string) or 'messages' is required", param="prompt")
        return self

    @property
    def text(self) -> Optional[str]:
        return self.prompt if self.prompt is not None else self.content


class DetokenizeRequest(_Model):
    model: Optional[str] = None
    tokens: list[TokenId]


# ---- parsing ----

_logged_unknown: set[str] = set()
_MAX_LOGGED_UNKNOWN = 64


def _log_unknown(req: BaseModel) -> None:
    for k in req.model_extra or ():
        if k not in _logged_unknown and len(_logged_unknown) < _MAX_LOGGED_UNKNOWN:
            _logged_unknown.add(k)  # bounded: a client inventing names cannot grow it (or the log) forever
            log.warning("ignoring unknown request field %r%s", k[:64],
                        " (no more are logged)" if len(_logged_unknown) == _MAX_LOGGED_UNKNOWN else "")


def parse_body(model: type[BaseModel], data: bytes):
    """The HTTP body (bytes) as `model`, parsed and validated in one pass of pydantic's JSON parser, which
    refuses invalid UTF-8, lone surrogates, NaN / Infinity in any declared field and nesting past its
    recursion limit (unknown fields are bounded by that limit and by the body size, and never read)."""
    if data[:3] == b"\xef\xbb\xbf":
        data = data[3:]
    if not data.strip():
        raise bad_request("the request body is empty; a JSON object is required")
    try:
        req = model.model_validate_json(data)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        if first["type"] == "json_invalid":
            raise bad_request(f"the request body is not valid JSON: {first['msg']}") from None
        if first["type"] == "model_type" and not first["loc"]:
            raise bad_request("the request body must be a JSON object") from None
        raise from_validation(e) from None
    _log_unknown(req)
    return req


EmbeddingInput = Union[Annotated[str, Field(min_length=1)], Annotated[list[Annotated[str, Field(min_length=1)]],
                       Field(min_length=1, max_length=MAX_PROMPTS)], TokenIds,
                       Annotated[list[TokenIds], Field(min_length=1, max_length=MAX_PROMPTS)]]


class EmbeddingRequest(_Model):
    """/v1/embeddings (OpenAI's fields, in its order)."""
    input: EmbeddingInput
    model: Optional[str] = None
    dimensions: Annotated[Optional[int], Field(ge=1)] = None
    encoding_format: Literal["float", "base64"] = "float"
    user: Optional[str] = None
    # vLLM's extras
    add_special_tokens: Optional[bool] = None

    @property
    def inputs(self) -> list[Union[str, list[int]]]:
        """Each input: a string or token ids."""
        x = self.input
        if isinstance(x, str) or isinstance(x[0], int):
            return [x]
        return list(x)
