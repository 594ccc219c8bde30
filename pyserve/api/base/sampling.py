"""The request fields both generating endpoints (chat and completions) take beyond their own: vLLM's sampling
extras, written once here, and the constraint forms besides response_format — vLLM's structured_outputs, its
older guided_* fields and llama.cpp's json_schema / grammar — with the rules between them. `SamplingRequest.
to_sampling_params()` is the only bridge from a request to the engine.
"""
from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import Field, field_validator, model_validator

from ...engine.sampling_params import SamplingParams
from ...engine.structured import StructuredOutputsParams
from .errors import bad_request, unsupported
from .protocol import (MAX_LOGIT_BIAS, SEED_MASK, CacheSalt, MinP, MinTokens, Priority, PromptLogprobs,
                       RepetitionPenalty, RequestModel, StopTokenIds, TopK, unsupported_error)


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


# ---- structured output: OpenAI's response_format, vLLM's structured_outputs (and guided_*), llama.cpp's ----

class JsonSchemaFormat(RequestModel):
    name: Optional[str] = None
    description: Optional[str] = None
    schema_: Optional[Union[dict, bool]] = Field(None, alias="schema")  # none: any JSON object
    strict: Optional[bool] = None


class ResponseFormat(RequestModel):
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


class StructuredOutputs(RequestModel):
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
            raise unsupported_error("'structured_outputs.structural_tag'")
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


class SamplingRequest(RequestModel):
    """What chat and completions share beyond OpenAI's fields: vLLM's sampling extras and the constraint forms
    besides response_format (each request declares that, and OpenAI's sampling fields, in OpenAI's order), and
    what both do with them. A request is `class X(SamplingRequest, OpenAIFieldsOfX)`: pydantic lists a later
    base's fields first, so OpenAI's come first, then these, then the request's own extras."""
    # vLLM's extras
    top_k: TopK = None
    min_p: MinP = None
    repetition_penalty: RepetitionPenalty = None
    ignore_eos: Optional[bool] = None
    min_tokens: MinTokens = None
    stop_token_ids: StopTokenIds = None
    skip_special_tokens: Optional[bool] = None
    add_special_tokens: Optional[bool] = None  # False: no BOS beyond what the prompt (or template) writes
    prompt_logprobs: PromptLogprobs = None
    priority: Priority = None
    cache_salt: CacheSalt = None  # requests with different salts never share cached KV (a tenant's own cache)
    # llama.cpp's: a streamed response reports the prompt's prefill (`prompt_progress` on its chunks)
    return_progress: Optional[bool] = None
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
            structured_outputs=constraint if constraint is not None else self.structured()[0],
            priority=self.priority or 0, cache_salt=self.cache_salt,
            return_progress=bool(self.stream and self.return_progress), write_through=self.write_through())

    def logprobs_wanted(self) -> Optional[int]:
        """Alternatives per token (None: no logprobs)."""
        raise NotImplementedError

    def write_through(self) -> bool:
        """The client says it will send this prompt again (a chat's prompt_cache_key)."""
        return False

    def prompt_logprobs_wanted(self) -> Optional[int]:
        """Alternatives per prompt token (None: no prompt logprobs)."""
        return self.prompt_logprobs

    def max_new_tokens(self) -> tuple[Optional[int], str]:
        """(the completion bound the client asked for or None, the field that carried it)."""
        return self.max_tokens, "max_tokens"


def _or(v, default):
    return default if v is None else v
