"""OpenAI request parsing and response shapes for the HTTP server.

Requests arrive as JSON objects; `parse_chat` / `parse_completion` check every field the server knows,
ignore (and log once) the ones it does not, and refuse with a 400 the ones OpenAI has but pyserve does not
support. Errors carry OpenAI's JSON: {"error": {"message", "type", "param", "code"}}.
"""
from __future__ import annotations

import json
import logging
import math
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from ..engine.sampling_params import MAX_LOGPROBS, SamplingParams

log = logging.getLogger("pyserve.server")

# Bounds (OpenAI's where it has one; documented in docs/HARDENING.md)
MAX_N = 16  # choices per prompt
MAX_PROMPTS = 64  # prompts in one /v1/completions request
MAX_CHOICES = 128  # prompts x n
MAX_STOP = 16  # stop strings (OpenAI: 4; pyserve allows more)
MAX_STOP_LEN = 256  # characters per stop string
MAX_STOP_TOKEN_IDS = 64
MAX_LOGIT_BIAS = 1024  # entries
MAX_TOP_LOGPROBS = MAX_LOGPROBS  # chat top_logprobs: 0..20 (OpenAI's)
MAX_COMPLETION_LOGPROBS = MAX_LOGPROBS  # completions logprobs: 0..20 (OpenAI: 5)
MAX_MESSAGES = 4096
MAX_JSON_DEPTH = 64
ROLES = ("system", "user", "assistant", "tool", "developer")
SEED_MASK = (1 << 63) - 1  # the engine takes a non-negative int64 seed


class OpenAIError(Exception):
    """An error the client gets as OpenAI's error JSON, with an HTTP status."""

    def __init__(self, message: str, status: int = 400, type: str = "invalid_request_error",
                 param: Optional[str] = None, code: Optional[str] = None, headers: Optional[dict] = None):
        super().__init__(message)
        self.message, self.status, self.type, self.param, self.code = message, status, type, param, code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: Optional[str] = None, code: Optional[str] = None) -> OpenAIError:
    return OpenAIError(message, 400, "invalid_request_error", param, code)


def unsupported(what: str, param: str) -> OpenAIError:
    return OpenAIError(f"{what} is not supported by pyserve", 400, "invalid_request_error", param, "unsupported")


def server_error(message: str, status: int = 500) -> OpenAIError:
    return OpenAIError(message, status, "server_error")


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(12)}"


def now() -> int:
    return int(time.time())


# ---- the body ----

def _no_constant(name: str):
    raise ValueError(f"{name} is not valid JSON")


def _check_tree(v: Any, depth: int = 0) -> None:
    """No lone surrogates in any string (they cannot be encoded as UTF-8) and bounded nesting."""
    if depth > MAX_JSON_DEPTH:
        raise bad_request(f"the request body is nested more than {MAX_JSON_DEPTH} levels deep")
    if isinstance(v, str):
        try:
            v.encode("utf-8")
        except UnicodeEncodeError:
            raise bad_request("the request body holds a string with a lone surrogate (\\ud800-\\udfff), "
                              "which is not valid Unicode") from None
    elif isinstance(v, dict):
        for k, x in v.items():
            _check_tree(k, depth + 1)
            _check_tree(x, depth + 1)
    elif isinstance(v, list):
        for x in v:
            _check_tree(x, depth + 1)


def parse_json(data: bytes) -> Any:
    """The request body as JSON: strict UTF-8, no NaN / Infinity, bounded nesting; a 400 otherwise."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad_request(f"the request body is not valid UTF-8: {e}") from None
    if text.startswith("\ufeff"):
        text = text[1:]
    if not text.strip():
        raise bad_request("the request body is empty; a JSON object is required")
    try:
        obj = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise bad_request(f"the request body is nested more than {MAX_JSON_DEPTH} levels deep") from None
    except ValueError as e:
        raise bad_request(f"the request body is not valid JSON: {e}") from None
    _check_tree(obj)
    return obj


# ---- field checking ----

_MISSING = object()
_logged_unknown: set[str] = set()
_MAX_LOGGED_UNKNOWN = 64


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class _Fields:
    def __init__(self, body: Any, known: set[str]):
        if not isinstance(body, dict):
            raise bad_request("the request body must be a JSON object")
        self.body = body
        for k in body:
            if k not in known and k not in _logged_unknown and len(_logged_unknown) < _MAX_LOGGED_UNKNOWN:
                _logged_unknown.add(k)  # bounded: a client inventing names cannot grow it (or the log) forever
                log.warning("ignoring unknown request field %r%s", k[:64],
                            " (no more are logged)" if len(_logged_unknown) == _MAX_LOGGED_UNKNOWN else "")

    def get(self, name: str, kind: str, default: Any = None, nullable: bool = True) -> Any:
        v = self.body.get(name, _MISSING)
        if v is _MISSING or (v is None and nullable):
            return default
        ok = {"int": _is_int, "num": lambda x: _is_num(x) and math.isfinite(x), "bool": lambda x: isinstance(x, bool),
              "str": lambda x: isinstance(x, str), "dict": lambda x: isinstance(x, dict),
              "list": lambda x: isinstance(x, list), "any": lambda x: True}[kind](v)
        if not ok:
            names = {"int": "an integer", "num": "a number", "bool": "a boolean", "str": "a string",
                     "dict": "an object", "list": "an array"}
            raise bad_request(f"'{name}' must be {names[kind]}, got {type(v).__name__}", param=name)
        return v

    def num(self, name: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
        v = float(self.get(name, "num", default))
        if not ((lo < v) if lo_open else (lo <= v)) or not v <= hi:
            raise bad_request(f"'{name}' must be in {'(' if lo_open else '['}{lo:g}, {hi:g}], got {v:g}", param=name)
        return v

    def boolean(self, name: str, default: bool) -> bool:
        return self.get(name, "bool", default)


# ---- requests ----

_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "min_p", "n", "stop", "seed",
           "presence_penalty", "frequency_penalty", "repetition_penalty", "logit_bias", "logprobs", "stream",
           "stream_options", "ignore_eos", "user", "best_of", "stop_token_ids", "skip_special_tokens",
           "metadata", "store", "service_tier"}
_CHAT = _COMMON | {"messages", "max_completion_tokens", "top_logprobs", "chat_template", "chat_template_kwargs",
                   "tools", "tool_choice", "functions", "function_call", "response_format", "parallel_tool_calls",
                   "add_generation_prompt", "continue_final_message", "modalities", "audio", "prediction",
                   "reasoning_effort"}
_COMPLETION = _COMMON | {"prompt", "echo", "suffix"}


@dataclass
class GenRequest:
    model: Optional[str]
    stream: bool
    include_usage: bool
    n: int
    max_tokens: Optional[int]
    params: SamplingParams  # max_tokens filled in per prompt
    user: Optional[str] = None
    # chat
    messages: Optional[list] = None
    chat_template: Optional[str] = None
    chat_template_kwargs: Optional[dict] = None
    add_generation_prompt: bool = True
    top_logprobs: Optional[int] = None  # chat: alternatives wanted per token (None: no logprobs)
    # completions
    prompts: list[Union[str, list[int]]] = field(default_factory=list)
    echo: bool = False
    logprobs: Optional[int] = None  # completions: alternatives wanted


def _sampling(f: _Fields, n: int, logprobs: Optional[int]) -> SamplingParams:
    stop = f.get("stop", "any", [])
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise bad_request("'stop' must be a string or an array of strings", param="stop")
    if len(stop) > MAX_STOP:
        raise bad_request(f"'stop' holds at most {MAX_STOP} strings, got {len(stop)}", param="stop")
    for s in stop:
        if len(s) > MAX_STOP_LEN:
            raise bad_request(f"each 'stop' string is at most {MAX_STOP_LEN} characters, got {len(s)}",
                              param="stop")
    stop = [s for s in stop if s]
    raw_bias = f.get("logit_bias", "dict", {})
    if len(raw_bias) > MAX_LOGIT_BIAS:
        raise bad_request(f"'logit_bias' holds at most {MAX_LOGIT_BIAS} entries", param="logit_bias")
    bias = {}
    for k, v in raw_bias.items():
        try:
            tid = int(k) if isinstance(k, str) and k.strip().lstrip("-").isdigit() else None
        except ValueError:
            tid = None
        if tid is None:
            raise bad_request(f"'logit_bias' keys must be token ids (integers as strings), got {k!r}",
                              param="logit_bias")
        if not _is_num(v) or not math.isfinite(v) or not -100 <= v <= 100:
            raise bad_request(f"logit_bias for token {k} must be a number in [-100, 100], got {v!r}",
                              param="logit_bias")
        bias[tid] = float(v)
    stop_ids = f.get("stop_token_ids", "list", [])
    if not all(_is_int(t) for t in stop_ids):
        raise bad_request("'stop_token_ids' must be an array of integers", param="stop_token_ids")
    if len(stop_ids) > MAX_STOP_TOKEN_IDS:
        raise bad_request(f"'stop_token_ids' holds at most {MAX_STOP_TOKEN_IDS} ids", param="stop_token_ids")
    seed = f.get("seed", "int")
    top_k = f.get("top_k", "int", 0)
    if top_k < -1:
        raise bad_request(f"'top_k' must be -1, 0 (off) or positive, got {top_k}", param="top_k")
    try:
        return SamplingParams(
            n=n, temperature=f.num("temperature", 1.0, 0.0, 2.0), top_p=f.num("top_p", 1.0, 0.0, 1.0, lo_open=True),
            top_k=top_k, min_p=f.num("min_p", 0.0, 0.0, 1.0),
            presence_penalty=f.num("presence_penalty", 0.0, -2.0, 2.0),
            frequency_penalty=f.num("frequency_penalty", 0.0, -2.0, 2.0),
            repetition_penalty=f.num("repetition_penalty", 1.0, 0.0, 2.0, lo_open=True),
            seed=None if seed is None else seed & SEED_MASK, stop=stop, stop_token_ids=list(stop_ids),
            ignore_eos=f.boolean("ignore_eos", False), max_tokens=1, logprobs=logprobs, logit_bias=bias,
            skip_special_tokens=f.boolean("skip_special_tokens", True))
    except ValueError as e:
        raise bad_request(str(e), param=str(e).split(" ", 1)[0]) from None


def _common(f: _Fields) -> dict:
    n = f.get("n", "int", 1)
    if not 1 <= n <= MAX_N:
        raise bad_request(f"'n' must be in [1, {MAX_N}], got {n}", param="n")
    best_of = f.get("best_of", "int")
    if best_of is not None and best_of != n:
        raise unsupported("best_of other than n", "best_of")
    stream = f.boolean("stream", False)
    opts = f.get("stream_options", "dict")
    if opts is not None and not stream:
        raise bad_request("'stream_options' is only allowed when 'stream' is true", param="stream_options")
    include_usage = (opts or {}).get("include_usage", False)
    if include_usage is None:
        include_usage = False
    if not isinstance(include_usage, bool):
        raise bad_request("'stream_options.include_usage' must be a boolean", param="stream_options")
    model = f.get("model", "str")
    user = f.get("user", "str")
    for name in ("metadata",):
        f.get(name, "dict")
    return dict(model=model, stream=stream, include_usage=include_usage, n=n, user=user)


def _max_tokens(f: _Fields, *names: str) -> Optional[int]:
    for name in names:
        v = f.get(name, "int")
        if v is not None:
            if v < 1:
                raise bad_request(f"'{name}' must be at least 1, got {v}", param=name)
            return v
    return None


def check_messages(messages: Any, param: str = "messages") -> list:
    """A non-empty array of {role, content} with a known role and text content (a string or text parts)."""
    if not isinstance(messages, list) or not messages:
        raise bad_request(f"'{param}' must be a non-empty array", param=param)
    if len(messages) > MAX_MESSAGES:
        raise bad_request(f"'{param}' holds at most {MAX_MESSAGES} messages", param=param)
    for i, m in enumerate(messages):
        where = f"{param}[{i}]"
        if not isinstance(m, dict):
            raise bad_request(f"{where} must be an object", param=where)
        role = m.get("role")
        if not isinstance(role, str):
            raise bad_request(f"{where}.role is required (a string)", param=f"{where}.role")
        if role not in ROLES:
            raise bad_request(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}", param=f"{where}.role")
        if "name" in m and m["name"] is not None and not isinstance(m["name"], str):
            raise bad_request(f"{where}.name must be a string", param=f"{where}.name")
        if m.get("tool_calls") or m.get("function_call"):
            raise unsupported("messages with tool calls", f"{where}.tool_calls")
        content = m.get("content")
        if content is None:
            if role != "assistant":
                raise bad_request(f"{where}.content is required for role {role!r}", param=f"{where}.content")
        elif isinstance(content, list):
            for j, part in enumerate(content):
                pw = f"{where}.content[{j}]"
                if not isinstance(part, dict) or not isinstance(part.get("type"), str):
                    raise bad_request(f"{pw} must be an object with a 'type'", param=pw)
                kind = part["type"]
                if kind in ("text", "input_text"):
                    if not isinstance(part.get("text"), str):
                        raise bad_request(f"{pw}.text must be a string", param=f"{pw}.text")
                elif kind in ("image_url", "input_image", "input_audio", "file", "refusal", "image", "audio"):
                    raise unsupported(f"message content of type {kind!r}", pw)
                else:
                    raise bad_request(f"{pw}.type {kind!r} is not a known content type", param=f"{pw}.type")
        elif not isinstance(content, str):
            raise bad_request(f"{where}.content must be a string or an array of parts", param=f"{where}.content")
    return messages


def parse_chat(body: Any) -> GenRequest:
    f = _Fields(body, _CHAT)
    messages = check_messages(f.get("messages", "any", nullable=False))
    if f.get("tools", "list"):
        raise unsupported("tool calling ('tools')", "tools")
    if f.get("functions", "list"):
        raise unsupported("function calling ('functions')", "functions")
    tc = f.get("tool_choice", "any")
    if tc not in (None, "none", "auto"):
        raise unsupported("'tool_choice'", "tool_choice")
    if f.get("function_call", "any") not in (None, "none", "auto"):
        raise unsupported("'function_call'", "function_call")
    f.get("parallel_tool_calls", "bool")
    rf = f.get("response_format", "dict")
    if rf is not None and rf.get("type", "text") != "text":
        raise unsupported(f"response_format {rf.get('type')!r} (only 'text')", "response_format")
    mods = f.get("modalities", "list")
    if mods and any(m != "text" for m in mods):
        raise unsupported("output modalities other than 'text'", "modalities")
    if f.get("audio", "dict"):
        raise unsupported("audio output", "audio")
    if f.get("prediction", "dict"):
        raise unsupported("predicted outputs ('prediction')", "prediction")
    f.get("reasoning_effort", "str")
    want_lp = f.boolean("logprobs", False)
    top = f.get("top_logprobs", "int")
    if top is not None:
        if not want_lp:
            raise bad_request("'top_logprobs' requires 'logprobs' to be true", param="top_logprobs")
        if not 0 <= top <= MAX_TOP_LOGPROBS:
            raise bad_request(f"'top_logprobs' must be in [0, {MAX_TOP_LOGPROBS}], got {top}", param="top_logprobs")
    top_lp = (top or 0) if want_lp else None
    common = _common(f)
    kwargs = f.get("chat_template_kwargs", "dict")
    return GenRequest(**common, max_tokens=_max_tokens(f, "max_completion_tokens", "max_tokens"),
                      params=_sampling(f, common["n"], top_lp), messages=messages,
                      chat_template=f.get("chat_template", "str"), chat_template_kwargs=kwargs,
                      add_generation_prompt=f.boolean("add_generation_prompt", True), top_logprobs=top_lp)


def parse_completion(body: Any) -> GenRequest:
    f = _Fields(body, _COMPLETION)
    prompt = f.get("prompt", "any", nullable=False)
    if prompt is None:
        raise bad_request("'prompt' is required", param="prompt")
    prompts: list
    if isinstance(prompt, str):
        prompts = [prompt]
    elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        prompts = [list(prompt)]
    elif isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        prompts = list(prompt)
    elif (isinstance(prompt, list) and prompt and all(isinstance(p, list) and p and all(_is_int(t) for t in p)
                                                      for p in prompt)):
        prompts = [list(p) for p in prompt]
    else:
        raise bad_request("'prompt' must be a string, an array of strings, an array of token ids or an array of "
                          "token-id arrays (none empty)", param="prompt")
    if len(prompts) > MAX_PROMPTS:
        raise bad_request(f"'prompt' holds at most {MAX_PROMPTS} prompts, got {len(prompts)}", param="prompt")
    if f.get("suffix", "str"):
        raise unsupported("'suffix' (fill-in-the-middle)", "suffix")
    lp = f.get("logprobs", "int")
    if lp is not None and not 0 <= lp <= MAX_COMPLETION_LOGPROBS:
        raise bad_request(f"'logprobs' must be in [0, {MAX_COMPLETION_LOGPROBS}], got {lp}", param="logprobs")
    echo = f.boolean("echo", False)
    if echo and lp is not None:
        raise unsupported("'echo' together with 'logprobs' (prompt logprobs)", "echo")
    common = _common(f)
    if len(prompts) * common["n"] > MAX_CHOICES:
        raise bad_request(f"prompts x n is at most {MAX_CHOICES}, got {len(prompts) * common['n']}", param="n")
    return GenRequest(**common, max_tokens=_max_tokens(f, "max_tokens"), params=_sampling(f, common["n"], lp),
                      prompts=prompts, echo=echo, logprobs=lp)


def check_vocab(req: GenRequest, n_vocab: int) -> None:
    """What needs the model: logit_bias keys and stop_token_ids must be ids in the vocabulary."""
    for t in req.params.logit_bias:
        if not 0 <= t < n_vocab:
            raise bad_request(f"logit_bias key {t} is not a token id in the vocabulary [0, {n_vocab})",
                              param="logit_bias")
    for t in req.params.stop_token_ids:
        if not 0 <= t < n_vocab:
            raise bad_request(f"stop_token_ids holds {t}, not a token id in the vocabulary [0, {n_vocab})",
                              param="stop_token_ids")


@dataclass
class TemplateRequest:
    messages: list
    chat_template: Optional[str]
    chat_template_kwargs: Optional[dict]
    add_generation_prompt: bool


def parse_template_request(body: Any) -> TemplateRequest:
    f = _Fields(body, {"messages", "chat_template", "chat_template_kwargs", "add_generation_prompt", "model",
                       "add_special_tokens", "return_token_strs", "prompt", "content"})
    return TemplateRequest(check_messages(f.get("messages", "any", nullable=False)), f.get("chat_template", "str"),
                           f.get("chat_template_kwargs", "dict"), f.boolean("add_generation_prompt", True))


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}
