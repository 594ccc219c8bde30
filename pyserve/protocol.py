"""OpenAI request parsing and response shapes for the HTTP server.

Requests arrive as JSON objects; `parse_chat` / `parse_completion` check every field the server knows,
ignore (and log once) the ones it does not, and refuse with a 400 the ones OpenAI has but pyserve does not
support. Errors carry OpenAI's JSON: {"error": {"message", "type", "param", "code"}}.
"""
from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from .sampling_params import MAX_LOGPROBS, SamplingParams

log = logging.getLogger("pyserve.server")

MAX_N = 128
SEED_MASK = (1 << 63) - 1  # the engine takes a non-negative int64 seed


class OpenAIError(Exception):
    """An error the client gets as OpenAI's error JSON, with an HTTP status."""

    def __init__(self, message: str, status: int = 400, type: str = "invalid_request_error",
                 param: Optional[str] = None, code: Optional[str] = None):
        super().__init__(message)
        self.message, self.status, self.type, self.param, self.code = message, status, type, param, code

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


# ---- field checking ----

_MISSING = object()
_logged_unknown: set[str] = set()


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
            if k not in known and k not in _logged_unknown:
                _logged_unknown.add(k)
                log.warning("ignoring unknown request field %r", k)

    def get(self, name: str, kind: str, default: Any = None, nullable: bool = True) -> Any:
        v = self.body.get(name, _MISSING)
        if v is _MISSING or (v is None and nullable):
            return default
        ok = {"int": _is_int, "num": _is_num, "bool": lambda x: isinstance(x, bool),
              "str": lambda x: isinstance(x, str), "dict": lambda x: isinstance(x, dict),
              "list": lambda x: isinstance(x, list), "any": lambda x: True}[kind](v)
        if not ok:
            names = {"int": "an integer", "num": "a number", "bool": "a boolean", "str": "a string",
                     "dict": "an object", "list": "an array"}
            raise bad_request(f"'{name}' must be {names[kind]}, got {type(v).__name__}", param=name)
        return v


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
    stop = [s for s in stop if s]
    if len(stop) > 16:
        raise bad_request("'stop' holds at most 16 strings", param="stop")
    bias = f.get("logit_bias", "dict", {})
    try:
        bias = {int(k): float(v) for k, v in bias.items()}
    except (TypeError, ValueError):
        raise bad_request("'logit_bias' maps token ids (as strings) to numbers", param="logit_bias") from None
    for k, v in bias.items():
        if not -100 <= v <= 100:
            raise bad_request(f"logit_bias for token {k} must be in [-100, 100], got {v}", param="logit_bias")
    stop_ids = f.get("stop_token_ids", "list", [])
    if not all(_is_int(t) for t in stop_ids):
        raise bad_request("'stop_token_ids' must be an array of integers", param="stop_token_ids")
    seed = f.get("seed", "int")
    top_k = f.get("top_k", "int", 0)
    try:
        return SamplingParams(
            n=n, temperature=float(f.get("temperature", "num", 1.0)), top_p=float(f.get("top_p", "num", 1.0)),
            top_k=-1 if top_k == -1 else top_k, min_p=float(f.get("min_p", "num", 0.0)),
            presence_penalty=float(f.get("presence_penalty", "num", 0.0)),
            frequency_penalty=float(f.get("frequency_penalty", "num", 0.0)),
            repetition_penalty=float(f.get("repetition_penalty", "num", 1.0)),
            seed=None if seed is None else seed & SEED_MASK, stop=stop, stop_token_ids=list(stop_ids),
            ignore_eos=f.get("ignore_eos", "bool", False), max_tokens=1, logprobs=logprobs, logit_bias=bias,
            skip_special_tokens=f.get("skip_special_tokens", "bool", True))
    except ValueError as e:
        raise bad_request(str(e), param=str(e).split(" ", 1)[0]) from None


def _common(f: _Fields) -> dict:
    n = f.get("n", "int", 1)
    if not 1 <= n <= MAX_N:
        raise bad_request(f"'n' must be in [1, {MAX_N}], got {n}", param="n")
    best_of = f.get("best_of", "int")
    if best_of is not None and best_of != n:
        raise unsupported("best_of other than n", "best_of")
    stream = f.get("stream", "bool", False)
    opts = f.get("stream_options", "dict")
    if opts is not None and not stream:
        raise bad_request("'stream_options' is only allowed when 'stream' is true", param="stream_options")
    include_usage = bool((opts or {}).get("include_usage", False))
    model = f.get("model", "str")
    user = f.get("user", "str")
    return dict(model=model, stream=stream, include_usage=include_usage, n=n, user=user)


def _max_tokens(f: _Fields, *names: str) -> Optional[int]:
    for name in names:
        v = f.get(name, "int")
        if v is not None:
            if v < 1:
                raise bad_request(f"'{name}' must be at least 1, got {v}", param=name)
            return v
    return None


def parse_chat(body: Any) -> GenRequest:
    f = _Fields(body, _CHAT)
    messages = f.get("messages", "list", nullable=False)
    if messages is None or not messages:
        raise bad_request("'messages' must be a non-empty array", param="messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad_request(f"messages[{i}] must be an object with a 'role'", param="messages")
        content = m.get("content")
        if isinstance(content, list):
            for part in content:
                if not isinstance(part, dict) or part.get("type") not in ("text", "input_text"):
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise unsupported(f"message content of type {kind!r}", "messages")
        elif content is not None and not isinstance(content, str):
            raise bad_request(f"messages[{i}].content must be a string or an array of parts", param="messages")
    if f.get("tools", "list"):
        raise unsupported("tool calling ('tools')", "tools")
    if f.get("functions", "list"):
        raise unsupported("function calling ('functions')", "functions")
    tc = f.get("tool_choice", "any")
    if tc not in (None, "none", "auto"):
        raise unsupported("'tool_choice'", "tool_choice")
    if f.get("function_call", "any") not in (None, "none", "auto"):
        raise unsupported("'function_call'", "function_call")
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
    want_lp = f.get("logprobs", "bool", False)
    top = f.get("top_logprobs", "int")
    if top is not None:
        if not want_lp:
            raise bad_request("'top_logprobs' requires 'logprobs' to be true", param="top_logprobs")
        if not 0 <= top <= MAX_LOGPROBS:
            raise bad_request(f"'top_logprobs' must be in [0, {MAX_LOGPROBS}], got {top}", param="top_logprobs")
    top_lp = (top or 0) if want_lp else None
    common = _common(f)
    kwargs = f.get("chat_template_kwargs", "dict")
    return GenRequest(**common, max_tokens=_max_tokens(f, "max_completion_tokens", "max_tokens"),
                      params=_sampling(f, common["n"], top_lp), messages=messages,
                      chat_template=f.get("chat_template", "str"), chat_template_kwargs=kwargs,
                      add_generation_prompt=f.get("add_generation_prompt", "bool", True), top_logprobs=top_lp)


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
    if f.get("suffix", "str"):
        raise unsupported("'suffix' (fill-in-the-middle)", "suffix")
    lp = f.get("logprobs", "int")
    if lp is not None and not 0 <= lp <= MAX_LOGPROBS:
        raise bad_request(f"'logprobs' must be in [0, {MAX_LOGPROBS}], got {lp}", param="logprobs")
    echo = f.get("echo", "bool", False)
    if echo and lp is not None:
        raise unsupported("'echo' together with 'logprobs' (prompt logprobs)", "echo")
    common = _common(f)
    return GenRequest(**common, max_tokens=_max_tokens(f, "max_tokens"), params=_sampling(f, common["n"], lp),
                      prompts=prompts, echo=echo, logprobs=lp)


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": {"cached_tokens": 0}}
