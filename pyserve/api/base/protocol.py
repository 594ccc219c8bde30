"""The protocol base every endpoint family builds on: the request and reply model bases, the bounds and field
types that more than one family declares, and the one parse of a body.

Requests (`RequestModel`, pydantic v2) declare their fields in their API's order with its bounds written once
as types (below); a body is parsed and validated in one pass of pydantic's JSON parser (`parse_body`), in
strict mode (no "1" for 1, no true for 1). Unknown fields are accepted and ignored (the first few names are
logged once). A validation error becomes OpenAI's error JSON with `param` taken from the error's location
(errors.from_validation); rules that tie two fields together raise OpenAIError from a model validator
(pydantic passes it through untouched).

Replies (`ReplyModel`: the bodies an endpoint answers with, in OpenAI's field order; /openapi.json describes
them) are pyserve's own data, so they are built without validation (`model_construct`: chunks are on every
token's path) and serialized with `exclude_unset` (server/http/sse.py: dumps): every field is passed explicitly,
and one that a reply leaves out on purpose (a delta's `role` after the first chunk, `usage` when the client
did not ask for it) is absent from its JSON, as in OpenAI's.
"""
from __future__ import annotations

import logging
import time
from typing import Annotated, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError
from pydantic_core import PydanticCustomError

from ...engine.limits import field_limits
from ...engine.sampling_params import MAX_LOGPROBS
from .errors import bad_request, from_validation

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


def unsupported_error(what: str) -> PydanticCustomError:
    """What a validator raises for a value pyserve cannot serve (a 400 naming the field, never dropped)."""
    return PydanticCustomError("unsupported", "{what} is not supported by pyserve", {"what": what})


class RequestModel(BaseModel):
    """The base of every request model, of every API: strict, unknown fields kept (and ignored), no NaN, and
    built on first use or by build_deferred, as ReplyModel."""
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False, defer_build=True)


class ReplyModel(BaseModel):
    """The base of every reply body. Its serializer is built on first use or by build_deferred once the server
    is ready, not at import: building every model's took ~70 ms of start-up (docs/BENCHMARKS.md)."""
    model_config = ConfigDict(defer_build=True)


def now() -> int:
    return int(time.time())


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


# ---- field types more than one family declares (each bound written once) ----

StopString = Annotated[str, StringConstraints(max_length=MAX_STOP_LEN)]


class StreamOptions(RequestModel):
    include_usage: Optional[bool] = None


# Each shared field's type and bounds, written once: a sampler field's range is the engine's (engine/limits.py:
# what its own check applies), narrowed where the API caps it; the endpoints list them in their API's order.
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
ToolName = Annotated[str, StringConstraints(pattern=r"^[a-zA-Z0-9_.-]{1,64}$")]  # OpenAI's rule, plus '.'
MAX_TOOLS = 128
TokenIds = Annotated[list[TokenId], Field(min_length=1)]
Priority = Annotated[Optional[int], Field(ge=-(1 << 31), lt=1 << 31)]  # vLLM's: lower is served first
CacheSalt = Annotated[Optional[str], StringConstraints(min_length=1, max_length=1024)]  # vLLM's: non-empty if given


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
