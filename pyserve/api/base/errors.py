"""OpenAI's error JSON, and the one translation of every error the layers below raise.

`OpenAIError` is what the HTTP edge answers: {"error": {"message", "type", "param", "code"}} with a status.
Below this layer errors are plain Python exceptions: pydantic's ValidationError (the request body),
ValueError from the engine (its messages begin with the field they are about: "prompt: token id …",
"temperature must be …"; ContextLengthError carries its numbers), ChatTemplateError, the grammar compiler's
ValueError. `from_validation`, `from_engine`, `from_template` and `from_constraint` turn them into OpenAIError,
each in one place; the server's error handlers (server/app.py) turn an OpenAIError into the HTTP response.
"""
from __future__ import annotations

import logging
import re
from typing import Optional

from pydantic import ValidationError

from ...engine.limits import ContextLengthError

log = logging.getLogger("pyserve.server")


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


def model_not_found(name: str) -> OpenAIError:
    return OpenAIError(f"The model `{name}` does not exist.", 404, "invalid_request_error", "model",
                       "model_not_found")


def loading() -> OpenAIError:
    err = server_error("the model is still loading", 503)
    err.headers["Retry-After"] = "5"
    return err


# ---- pydantic → OpenAI ----

# Fields whose errors name the exact element (messages[2].content[0].text); the others name the field itself,
# as OpenAI does ("stop", not "stop[3]").
_DEEP_PARAMS = frozenset({"messages"})
# pydantic puts the branch of a union it tried into the location ("str", "list[ContentPart]"): not a field
_UNION_TAG = re.compile(r"^(str|int|float|bool|list|dict|none)$|[\[(]|^function-")


def _param(loc: tuple) -> Optional[str]:
    parts = [p for p in loc if not (isinstance(p, str) and _UNION_TAG.search(p))]
    if not parts:
        return None
    if parts[0] not in _DEEP_PARAMS:
        return str(parts[0])
    out = str(parts[0])
    for p in parts[1:]:
        out += f"[{p}]" if isinstance(p, int) else f".{p}"
    return out


def from_validation(e: ValidationError) -> OpenAIError:
    """The deepest error (a union's failing branch that got furthest is the one the client meant)."""
    err = max(e.errors(include_url=False, include_context=False), key=lambda x: len(_param(x["loc"]) or ""))
    param = _param(err["loc"])
    msg = err["msg"] if err["type"] != "missing" else "this field is required"
    text = f"'{param}': {msg}" if param else msg
    code = "unsupported" if err["type"] == "unsupported" else None
    return bad_request(text, param=param, code=code)


# ---- engine → OpenAI ----

_FIELD = re.compile(r"^([a-z_]+)(?::| must| is| holds| has)")
_KNOWN_FIELDS = frozenset({"prompt", "logit_bias", "stop_token_ids", "temperature", "top_k", "top_p", "min_p",
                           "presence_penalty", "frequency_penalty", "repetition_penalty", "seed", "max_tokens",
                           "n", "logprobs", "stop", "min_tokens"})


def from_engine(e: BaseException, prompt_param: str = "prompt", max_tokens_param: Optional[str] = None) -> OpenAIError:
    """An engine refusal (ValueError, whose message names its field first) or failure, as OpenAI's error.
    A request too long for the model is said in OpenAI's words (context_length_exceeded); max_tokens_param:
    the field that set its completion length, None where the client sent none."""
    if isinstance(e, OpenAIError):
        return e
    if isinstance(e, ContextLengthError):
        return context_length_exceeded(e, prompt_param, max_tokens_param)
    if isinstance(e, ValueError):
        msg = str(e)
        m = _FIELD.match(msg)
        param = m.group(1) if m and m.group(1) in _KNOWN_FIELDS else None
        if param == "prompt":
            param = prompt_param
        return bad_request(msg, param=param)
    log.error("engine request failed", exc_info=e)
    return server_error(f"internal error: {type(e).__name__}: {e}")


def context_length_exceeded(e: ContextLengthError, prompt_param: str, max_tokens_param: Optional[str]) -> OpenAIError:
    """OpenAI's message for a request past the model's length, from the engine's numbers."""
    head = f"This model's maximum context length is {e.max_len} tokens. However, "
    if max_tokens_param is not None and e.max_tokens:
        return bad_request(f"{head}you requested {e.n_prompt + e.max_tokens} tokens ({e.n_prompt} in the prompt, "
                           f"{e.max_tokens} in the completion). Please reduce the length of the prompt or "
                           f"completion.", param=max_tokens_param, code="context_length_exceeded")
    room = ", leaving no room for the completion" if e.max_tokens else ""
    return bad_request(f"{head}your prompt is {e.n_prompt} tokens{room}. Please reduce the length of the prompt.",
                       param=prompt_param, code="context_length_exceeded")


def from_template(e: Exception, param: str) -> OpenAIError:
    """A chat template that failed to render (ChatTemplateError: its message is the user's)."""
    return bad_request(str(e), param=param, code="chat_template_error")


def from_constraint(e: ValueError, field_name: str) -> OpenAIError:
    """A constraint the grammar compiler refused (its message says why), named by the field that carried it."""
    return bad_request(f"'{field_name}': {e}", param=field_name, code="invalid_constraint")
