"""Chat-template rendering compatible with Hugging Face ``transformers``.

A model's chat template is a Jinja template that turns an OpenAI-style message list into the prompt string the model
was trained on.  This module reproduces the environment ``transformers.apply_chat_template`` renders in, so that a
template shipped with a model (GGUF metadata, ``tokenizer_config.json``, ``--chat-template FILE``) gives byte for
byte the same prompt here:

* ``ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`` with ``jinja2.ext.loopcontrols`` and a
  ``{% generation %}`` tag (rendered as its body), the default lenient ``Undefined``;
* globals ``raise_exception`` and ``strftime_now`` (plus Jinja's own ``namespace``, ``dict``, ``range``, ...);
* ``tojson`` replaced by ``json.dumps(ensure_ascii=False, ...)`` (no HTML escaping, keys in insertion order,
  ``indent``/``separators`` supported);
* variables: the special tokens (``bos_token``/``eos_token`` only when the model has them), ``messages``
  (``None``-valued keys dropped, as ``apply_chat_template`` does), ``tools``, ``documents`` (``None``),
  ``add_generation_prompt``, and finally the request's ``chat_template_kwargs`` over all of those.

There are no resource limits here: this is for the operator's templates.  A template sent inside a request renders
through :mod:`.untrusted_template`, which adds a deadline and size checks.  Whatever goes wrong inside a template
surfaces as :class:`ChatTemplateError`, whose message is safe to return to the client.
"""

from __future__ import annotations

import contextvars
import functools
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any, Iterable

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.exceptions import TemplateError, TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["ChatTemplate", "ChatTemplateError", "builtin_gemma_template", "clear_template_cache",
           "decode_tool_call_arguments"]

#: Number of compiled templates kept (keyed by environment and source).
TEMPLATE_CACHE_SIZE = 32


class ChatTemplateError(ValueError):
    """A chat template could not be compiled or rendered.

    ``str(err)`` is a user-facing message.  For the template's own ``raise_exception(msg)`` it is exactly ``msg``.
    ``kind`` says what happened: ``"raised"`` (the template called ``raise_exception``), ``"syntax"`` (the template
    does not compile), ``"render"`` (an engine error while rendering: undefined value misuse, type error, sandbox
    violation, ...), ``"limit"`` (a resource limit was hit) or ``"input"`` (bad arguments).
    """

    def __init__(self, message: str, kind: str = "render") -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind

    def __str__(self) -> str:  # keep it the bare message even for odd args
        return self.message


class ResourceLimit(Exception):
    """A render hit a resource limit (raised by the untrusted kind's checks; reported with kind ``"limit"``)."""


class _TemplateRaised(TemplateError):
    """Raised by the template's ``raise_exception(...)`` global."""


def _raise_exception(message: Any = "") -> None:
    raise _TemplateRaised(message)


# The clock `strftime_now` reads during one render (None: local time).
_NOW: contextvars.ContextVar[datetime | None] = contextvars.ContextVar("pyserve_chat_template_now", default=None)


def strftime_now(format: Any) -> str:  # noqa: A002 - transformers' name and signature
    now = _NOW.get()
    return (datetime.now() if now is None else now).strftime(format)


def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
           sort_keys: bool = False) -> str:
    """transformers' ``tojson``: ``json.dumps`` without Jinja's HTML escaping."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class _GenerationExtension(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (transformers' AssistantTracker), which marks assistant output for
    training masks; here it just renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_generation_body"), [], [], body).set_lineno(lineno)

    def _generation_body(self, caller: Any) -> str:
        return caller()


class ChatEnvironment(ImmutableSandboxedEnvironment):
    """The Jinja environment ``transformers`` renders chat templates in; ``options`` go to Jinja."""

    def __init__(self, **options: Any) -> None:
        super().__init__(trim_blocks=True, lstrip_blocks=True,
                         extensions=[_GenerationExtension, jinja2.ext.loopcontrols], **options)
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = strftime_now
        self.filters["tojson"] = tojson


@functools.lru_cache(maxsize=TEMPLATE_CACHE_SIZE)
def _compile(environment: ChatEnvironment, source: str) -> jinja2.Template:
    try:
        return environment.from_string(source)
    except TemplateSyntaxError as exc:
        where = f" (line {exc.lineno})" if exc.lineno else ""
        raise ChatTemplateError(f"chat template syntax error{where}: {exc.message}", kind="syntax") from None
    except RecursionError:
        raise ChatTemplateError("invalid chat template: it is nested too deeply", kind="syntax") from None
    except Exception as exc:  # e.g. Python's own compiler limits
        raise ChatTemplateError(f"invalid chat template: {type(exc).__name__}: {exc}", kind="syntax") from None


def clear_template_cache() -> None:
    """Forget all compiled templates."""
    _compile.cache_clear()


def _template_line(exc: BaseException, template: jinja2.Template) -> int | None:
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            try:
                line = template.get_corresponding_lineno(tb.tb_lineno)
            except Exception:
                pass
        tb = tb.tb_next
    return line


def _render_error(exc: Exception, template: jinja2.Template) -> ChatTemplateError:
    kind = "limit"
    if isinstance(exc, ResourceLimit):
        detail = str(exc)
    elif isinstance(exc, RecursionError):
        detail = "recursion too deep"
    elif isinstance(exc, MemoryError):
        detail = "out of memory"
    elif isinstance(exc, TemplateError):
        kind, detail = "render", exc.message or type(exc).__name__
    else:
        kind, detail = "render", f"{type(exc).__name__}: {exc}"
    line = _template_line(exc, template)
    where = f" (template line {line})" if line else ""
    return ChatTemplateError(f"chat template error{where}: {detail}", kind=kind)


def _clean_messages(messages: Any) -> list:
    if isinstance(messages, (str, bytes, Mapping)) or messages is None:
        raise ChatTemplateError("messages must be a list of message objects", kind="input")
    return [{k: v for k, v in m.items() if v is not None} if isinstance(m, Mapping) else m for m in messages]


def decode_tool_call_arguments(messages: list[dict]) -> list[dict]:
    """OpenAI-shaped messages made into what chat templates expect of tool calls (what transformers' callers pass):
    an assistant message's ``tool_calls[i].function.arguments`` JSON text decoded to its value (text that is not
    JSON stays as it is) and its null ``content`` as "" (Qwen3's and Granite's templates read it). Messages
    without ``tool_calls`` are passed through; the others are copied, never changed in place."""
    out = []
    for m in messages:
        if isinstance(m, Mapping) and isinstance(m.get("tool_calls"), list):
            m = {**m, "content": "" if m.get("content") is None else m["content"],
                 "tool_calls": [_decoded_call(call) for call in m["tool_calls"]]}
        out.append(m)
    return out


def _decoded_call(call: Any) -> Any:
    function = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(function, Mapping) or not isinstance(function.get("arguments"), str):
        return call
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        return call
    return {**call, "function": {**function, "arguments": arguments}}


class ChatTemplate:
    """A compiled chat template plus the model's special tokens.

    ``bos_token`` / ``eos_token`` of ``None`` mean the model has no such token: the variable is then left undefined
    (not set to an empty string).  ``extra_context`` adds further template variables (other special tokens, say);
    the explicit tokens and the per-render variables take precedence.

    Compilation is cached by source (LRU of ``TEMPLATE_CACHE_SIZE``), so building a ``ChatTemplate`` per request is
    cheap.  A syntax error raises :class:`ChatTemplateError` here.  ``render`` is thread-safe.
    """

    environment: ChatEnvironment = ChatEnvironment()  # the untrusted kind brings its own

    def __init__(self, source: str, *, bos_token: str | None, eos_token: str | None,
                 extra_context: Mapping | None = None) -> None:
        if not isinstance(source, str):
            raise ChatTemplateError("the chat template must be a string", kind="input")
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.extra_context = dict(extra_context) if extra_context else {}
        self._template = _compile(self.environment, source)

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True, tools: list | None = None,
               chat_template_kwargs: Mapping | None = None, now: datetime | None = None) -> str:
        """Render ``messages`` to the prompt string.

        ``tools`` is passed as the ``tools`` variable (``None`` when absent, as transformers does);
        ``chat_template_kwargs`` (e.g. ``enable_thinking``) are set last, over the special tokens and the other
        variables; ``now`` pins what ``strftime_now()`` sees (default: local time).
        """
        variables = self._variables(messages, add_generation_prompt, tools, chat_template_kwargs)
        token = _NOW.set(now)
        try:
            chunks: Iterable[str] = self._template.root_render_func(self._template.new_context(variables))
            return self.environment.concat(chunks)  # as Template.render does
        except _TemplateRaised as exc:
            raise ChatTemplateError(str(exc.args[0] if exc.args else ""), kind="raised") from None
        except Exception as exc:
            raise _render_error(exc, self._template) from exc
        finally:
            _NOW.reset(token)

    def _variables(self, messages: Any, add_generation_prompt: bool, tools: list | None,
                   chat_template_kwargs: Mapping | None) -> dict[str, Any]:
        variables: dict[str, Any] = dict(self.extra_context)
        if self.bos_token is not None:
            variables["bos_token"] = self.bos_token
        if self.eos_token is not None:
            variables["eos_token"] = self.eos_token
        variables.update(messages=_clean_messages(messages), tools=tools, documents=None,
                         add_generation_prompt=add_generation_prompt)
        for key, value in (chat_template_kwargs or {}).items():
            if not isinstance(key, str) or not key.isidentifier():
                raise ChatTemplateError(f"chat_template_kwargs: invalid variable name {key!r}", kind="input")
            if key == "messages":
                raise ChatTemplateError("chat_template_kwargs cannot replace 'messages'", kind="input")
            variables[key] = value
        return variables


# Gemma 3 instruction-tuned chat template, verbatim as google/gemma-3-*-it ship it
# in tokenizer_config.json (identical to the template in the gemma3 GGUFs).
_GEMMA3_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n'}}\n"
    "{%- endif -%}\n"
)


def builtin_gemma_template() -> str:
    """The Gemma 3 chat template, for gemma-family models whose GGUF has none.

    Render it with the model's ``<bos>`` as ``bos_token``::

        <bos><start_of_turn>user
        {content}<end_of_turn>
        <start_of_turn>model
    """
    return _GEMMA3_TEMPLATE
