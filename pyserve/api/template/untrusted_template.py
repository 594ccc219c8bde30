"""Rendering a chat template sent inside a request (the server takes one only with --trust-request-chat-template).

The Jinja sandbox keeps a template away from Python internals and from mutating its inputs, but not from running
forever or allocating without bound.  :class:`UntrustedChatTemplate` renders exactly like :class:`ChatTemplate` (same
variables, same output for a real model's template) in an environment that adds:

* a wall-clock deadline, checked in the sandbox's ``call`` and ``call_binop`` hooks, in every filter and on every
  ``{% for %}`` iteration -- a loop over a variable (``{% for j in r %}``) passes through no hook, so the parser
  wraps each loop's iterable;
* size checks made *before* the operations that can amplify memory allocate: ``+ * ** %``, ``~`` (no hook either,
  so the parser routes it through a check too), the padding/joining/formatting str methods and filters, ``tojson``,
  printing a container, and joining the output.

A limit surfaces as :class:`ChatTemplateError` with ``kind == "limit"``.
"""

from __future__ import annotations

import contextvars
import functools
import math
import re
import string
import time
import types
from collections.abc import Mapping, Sized
from datetime import datetime
from typing import Any, Callable, Iterable, Iterator

import jinja2
from jinja2 import nodes
from jinja2.filters import make_attrgetter
from jinja2.runtime import markup_join, str_join
from jinja2.utils import Namespace

from .chat_template import ChatEnvironment, ChatTemplate, ChatTemplateError, ResourceLimit, strftime_now

__all__ = ["UntrustedChatTemplate", "ChatTemplateError"]

# Limits, read at call time so tests (or the server) can adjust them.
MAX_TEMPLATE_CHARS = 1 << 20  # template source
MAX_CHARS = 1 << 24  # any string a template builds, the rendered prompt included
MAX_ITEMS = 1 << 20  # any list a template builds
MAX_INT_BITS = 1 << 16  # an integer `*` / `**` may produce
MAX_JSON_INDENT = 64  # tojson's indent, and its two separators together (characters)
RENDER_TIMEOUT_S = 5.0  # one render, wall clock

# The monotonic time the current render must end by; inf outside a render (Jinja folds constants at compile time).
_DEADLINE: contextvars.ContextVar[float] = contextvars.ContextVar("pyserve_untrusted_deadline", default=math.inf)


def _tick() -> None:
    if time.monotonic() > _DEADLINE.get():
        raise ResourceLimit(f"rendering took too long (more than {RENDER_TIMEOUT_S:g} s)")


def _too_large(what: str, limit: int, unit: str = "characters") -> ResourceLimit:
    return ResourceLimit(f"{what} would be too large (more than {limit:,} {unit})")


def _check_chars(n: int, what: str = "a string") -> None:
    if n > MAX_CHARS:
        raise _too_large(what, MAX_CHARS)


def _check_items(n: int, what: str = "a list") -> None:
    if n > MAX_ITEMS:
        raise _too_large(what, MAX_ITEMS, "items")


def _size(obj: Any, indent: int = 0, item_sep: int = 2, key_sep: int = 2) -> int:
    """Estimate of ``len(str(obj))`` -- or, given the indent and separator lengths, of ``len(json.dumps(obj))`` --
    without building it; stops once past ``MAX_CHARS``.  A container counts every element, so ``[big] * n`` counts
    ``big`` n times, as its repr would."""
    total, stack = 0, [(obj, 0)]
    while stack and total <= MAX_CHARS:
        o, depth = stack.pop()
        if isinstance(o, Namespace):  # printed as <Namespace {...}>
            o, total = object.__getattribute__(o, "_Namespace__attrs"), total + 12
        if isinstance(o, str):
            total += len(o) + 2
        elif isinstance(o, int) and not isinstance(o, bool):
            total += o.bit_length() // 3 + 2
        elif isinstance(o, (dict, list, tuple, set, frozenset)):
            per_item = item_sep + indent * (depth + 1) + (key_sep if isinstance(o, dict) else 0)
            total += 2 + len(o) * per_item + indent * depth
            if total <= MAX_CHARS:
                children = [*o.keys(), *o.values()] if isinstance(o, dict) else o
                stack.extend((child, depth + 1) for child in children)
        else:
            total += 8
    return total


def _as_list(value: Any) -> list:
    """The items of an iterable argument, so they can be measured and then used."""
    if isinstance(value, Sized):
        _check_items(len(value))
    return value if isinstance(value, list) else list(value)


def _check_join(sep: Any, items: list, what: str = "the result of join") -> None:
    total = (len(sep) if isinstance(sep, str) else 0) * max(len(items) - 1, 0)
    for item in items:
        if total > MAX_CHARS:
            break
        total += _size(item)
    _check_chars(total, what)


_PERCENT_FIELD = re.compile(r"%(?:\([^)]*\))?([#0\- +]*(?:\*|\d+)?(?:\.(?:\*|\d+))?)[hlL]?([a-zA-Z%])")
_DIGITS = re.compile(r"\d+")


def _percent_specs(fmt: str) -> list[str]:
    """The flags/width/precision text of each ``%`` field of ``fmt``."""
    return [m[1] for m in _PERCENT_FIELD.finditer(fmt) if m[2] != "%"]


def _brace_specs(fmt: str) -> list[str]:
    """The format spec of each ``{}`` field of ``fmt``."""
    try:
        return [spec or "" for _text, field, spec, _conv in string.Formatter().parse(fmt) if field is not None]
    except ValueError:
        return []  # malformed: the real call raises the proper error


def _check_format(fmt: str, specs: list[str], values: list) -> None:
    """Size check for formatting ``values`` into ``fmt``, whose fields have the format specs ``specs``."""
    if not specs:
        return
    widths = [int(d) if len(d) < 12 else MAX_CHARS + 1 for spec in specs for d in _DIGITS.findall(spec)]
    if any("*" in spec or "{" in spec for spec in specs):  # widths taken from the values
        widths += [abs(v) for v in values if isinstance(v, int)]
    widest = max(widths, default=0)
    _check_chars(widest, "a formatted field")
    biggest = max((_size(v) for v in values), default=0)
    _check_chars(len(fmt) + len(specs) * (biggest + widest), "a formatted string")


def _format_values(args: Any) -> list:
    """The values of ``fmt % args``."""
    return list(args) if isinstance(args, tuple) else list(args.values()) if isinstance(args, Mapping) else [args]


def _check_binop(op: str, left: Any, right: Any) -> None:
    sequences = (str, list, tuple)
    if op == "+" and isinstance(left, sequences) and isinstance(right, sequences):
        (_check_chars if isinstance(left, str) else _check_items)(len(left) + len(right))
    elif op == "*" and isinstance(left, int) and isinstance(right, int):
        if left.bit_length() + right.bit_length() > MAX_INT_BITS:
            raise _too_large("an integer", MAX_INT_BITS, "bits")
    elif op == "*":
        seq, n = (left, right) if isinstance(right, int) else (right, left)
        if isinstance(seq, sequences) and isinstance(n, int):
            (_check_chars if isinstance(seq, str) else _check_items)(len(seq) * max(n, 0))
    elif op == "**" and isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
        if right > MAX_INT_BITS or right * left.bit_length() > MAX_INT_BITS:
            raise _too_large("an integer", MAX_INT_BITS, "bits")
    elif op == "%" and isinstance(left, str):
        _check_format(left, _percent_specs(left), _format_values(right))


# Checks for the str methods, filters and globals that can amplify their input.  Each takes the callee's arguments
# (a method's string first; a filter's value first, without Jinja's context argument) and returns None or, when it
# had to materialise an iterable to measure it, the positional arguments to call with instead.


def _chk_width(s: Any = "", width: Any = 0, *_a: Any, **_k: Any) -> None:
    if isinstance(width, int):
        _check_chars(width, "a padded string")


def _chk_expandtabs(s: str, tabsize: Any = 8, *_a: Any, **_k: Any) -> None:
    if isinstance(tabsize, int):
        _check_chars(len(s) + s.count("\t") * max(tabsize, 0), "the result of expandtabs()")


def _chk_replace(s: Any = "", old: Any = "", new: Any = "", count: Any = None, *_a: Any, **_k: Any) -> None:
    if isinstance(s, str) and isinstance(old, str) and isinstance(new, str) and len(new) > len(old):
        n = len(s) + 1 if old == "" else s.count(old)
        if isinstance(count, int) and count >= 0:
            n = min(n, count)
        _check_chars(len(s) + n * (len(new) - len(old)), "the result of replace")


def _chk_translate(s: str, table: Any = None, *_a: Any, **_k: Any) -> None:
    if isinstance(table, Mapping):
        longest = max((len(v) for v in table.values() if isinstance(v, str)), default=1)
        _check_chars(len(s) * longest, "the result of translate()")


def _chk_join_method(sep: str, items: Any = (), *rest: Any, **_k: Any) -> tuple:
    items = _as_list(items)
    _check_join(sep, items)
    return (items, *rest)


def _chk_join_filter(value: Any = (), *rest: Any, **kwargs: Any) -> tuple:
    items = _as_list(value)  # with attribute=: each item holds its attribute, so the items' size bounds it
    _check_join(rest[0] if rest else kwargs.get("d", ""), items)
    return (items, *rest)


def _chk_str_format(s: str, *args: Any, **kwargs: Any) -> None:
    _check_format(s, _brace_specs(s), [*args, *kwargs.values()])


def _chk_format_map(s: str, mapping: Any = None, *_a: Any, **_k: Any) -> None:
    if isinstance(mapping, Mapping):
        _check_format(s, _brace_specs(s), list(mapping.values()))


def _chk_percent(value: Any = "", *args: Any, **kwargs: Any) -> None:  # the `format` filter is `value % args`
    if isinstance(value, str):
        _check_format(value, _percent_specs(value), list(kwargs.values() if kwargs else args))


def _chk_indent(s: Any = "", width: Any = 4, *_a: Any, **_k: Any) -> None:
    w = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
    lines = s.count("\n") + 1 if isinstance(s, str) else 1
    _check_chars(_size(s) + lines * max(w, 0), "the result of indent")


def _chk_wordwrap(s: Any = "", width: Any = 79, break_long_words: Any = True, wrapstring: Any = None,
                  *_a: Any, **_k: Any) -> None:
    if isinstance(s, str) and isinstance(wrapstring, str):
        _check_chars(len(s) * (1 + len(wrapstring)), "the result of wordwrap")


def _chk_urlize(value: Any = "", trim_url_limit: Any = None, nofollow: Any = False, target: Any = None,
                rel: Any = None, *_a: Any, **_k: Any) -> None:
    extra = sum(len(x) for x in (target, rel) if isinstance(x, str))
    if isinstance(value, str) and extra:  # each URL (4+ characters) gains the attributes and some markup
        _check_chars(len(value) + (len(value) // 4 + 1) * (extra + 64), "the result of urlize")


def _chk_batch(value: Any = (), linecount: Any = 1, fill_with: Any = None, *_a: Any, **_k: Any) -> None:
    if fill_with is not None and isinstance(linecount, int):
        _check_items(linecount, "a batch")


def _chk_slice(value: Any = (), slices: Any = 1, *_a: Any, **_k: Any) -> None:
    if isinstance(slices, int):
        _check_items(slices, "the number of slices")


def _chk_items(value: Any = (), *_a: Any, **_k: Any) -> None:  # filters that turn a string's characters into a list
    if isinstance(value, Sized):
        _check_items(len(value))


def _chk_repr(value: Any = "", *_a: Any, **_k: Any) -> None:
    _check_chars(_size(value), "the printed value")


def _chk_tojson(x: Any = None, ensure_ascii: Any = False, indent: Any = None, separators: Any = None,
                *_a: Any, **_k: Any) -> None:
    indent_len = len(indent) if isinstance(indent, str) else indent if type(indent) is int else 0
    seps = separators if isinstance(separators, (list, tuple)) and len(separators) == 2 else (", ", ": ")
    item_sep, key_sep = (len(s) if isinstance(s, str) else 2 for s in seps)
    if max(indent_len, item_sep + key_sep) > MAX_JSON_INDENT:
        raise _too_large("the tojson indent or separators", MAX_JSON_INDENT)
    # ensure_ascii writes a non-ASCII character as \uXXXX: up to 6 times as long
    _check_chars(_size(x, indent_len, item_sep, key_sep) * (6 if ensure_ascii else 1), "the result of tojson")


def _chk_lipsum(n: Any = 5, html: Any = True, min: Any = 20, max: Any = 100, *_a: Any, **_k: Any) -> None:  # noqa: A002
    if isinstance(n, int) and isinstance(max, int) and n * max > 100_000:
        raise _too_large("lipsum()", 100_000, "words")


def _chk_strftime(format: Any = "", *_a: Any, **_k: Any) -> None:  # noqa: A002
    if isinstance(format, str):  # one directive (2 characters) gives at most ~30
        _check_chars(len(format) * 16, "the result of strftime_now()")


_METHOD_CHECKS: dict[str, Callable[..., tuple | None]] = {
    "ljust": _chk_width, "rjust": _chk_width, "center": _chk_width, "zfill": _chk_width,
    "expandtabs": _chk_expandtabs, "replace": _chk_replace, "translate": _chk_translate, "join": _chk_join_method,
    "format": _chk_str_format, "format_map": _chk_format_map,
}
_FILTER_CHECKS: dict[str, Callable[..., tuple | None]] = {
    "center": _chk_width, "replace": _chk_replace, "join": _chk_join_filter, "format": _chk_percent,
    "indent": _chk_indent, "wordwrap": _chk_wordwrap, "urlize": _chk_urlize, "batch": _chk_batch,
    "slice": _chk_slice, "list": _chk_items, "sort": _chk_items, "unique": _chk_items, "groupby": _chk_items,
    "string": _chk_repr, "pprint": _chk_repr, "tojson": _chk_tojson,
}


def _guarded(original: Callable, check: Callable[..., tuple | None]) -> Callable:
    """``original`` (a filter or global), checking the deadline and ``check(args)`` before each call."""
    skip = 1 if getattr(original, "jinja_pass_arg", None) is not None else 0  # Jinja's context/environment

    @functools.wraps(original)  # copies jinja_pass_arg, so Jinja passes the same first argument
    def guarded(*args: Any, **kwargs: Any) -> Any:
        _tick()
        replaced = check(*args[skip:], **kwargs)
        return original(*args[:skip], *(args[skip:] if replaced is None else replaced), **kwargs)

    return guarded


@jinja2.pass_environment
def _filter_sum(environment: Any, iterable: Any, attribute: Any = None, start: Any = 0) -> Any:
    """Jinja's ``sum``, with the ``+`` check on every step (``[[x] * n] * n | sum(start=[])`` squares)."""
    if attribute is not None:
        iterable = map(make_attrgetter(environment, attribute), iterable)
    total = start
    for item in iterable:
        _tick()
        _check_binop("+", total, item)
        total = total + item
    return total


@jinja2.pass_context  # pass_context: never evaluated at compile time
def _timed_iter(_context: Any, iterable: Any) -> Iterator:
    """A ``{% for %}`` iterable, checking the deadline on each iteration (``loop.length`` still works: Jinja counts
    what is left when it cannot ``len()`` it)."""
    for item in iterable:
        _tick()
        yield item


@jinja2.pass_eval_context
def _checked_tilde(eval_ctx: Any, items: tuple) -> str:
    _check_join("", list(items), "a string")
    return markup_join(items) if eval_ctx.autoescape else str_join(items)


def _checked_concat(chunks: Iterable[str]) -> str:
    """``environment.concat``: joins the output of the template, a block, a macro or ``{% set %}...{% endset %}``,
    counting as it goes (a loop can yield many big strings)."""
    out, total = [], 0
    for chunk in chunks:
        total += len(chunk)
        _check_chars(total, "the rendered text")
        out.append(chunk)
    return "".join(out)


def _finalize(value: Any) -> Any:
    """Applied to every ``{{ expression }}`` before ``str()``: refuses a container whose text would be huge."""
    if not isinstance(value, (str, int, float)) and value is not None:
        _check_chars(_size(value), "the printed value")
    return value


_ITER, _TILDE = "_pyserve_timed_iter", "_pyserve_checked_tilde"


class _UntrustedEnvironment(ChatEnvironment):
    intercepted_binops = frozenset({"+", "*", "**", "%"})
    concat = staticmethod(_checked_concat)

    def __init__(self) -> None:
        super().__init__(finalize=_finalize)
        self.globals["lipsum"] = _guarded(self.globals["lipsum"], _chk_lipsum)
        self.globals["strftime_now"] = _guarded(strftime_now, _chk_strftime)
        self.filters["sum"] = _filter_sum
        for name, check in _FILTER_CHECKS.items():
            self.filters[name] = _guarded(self.filters[name], check)
        self.filters[_ITER] = _timed_iter
        self.filters[_TILDE] = _checked_tilde

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        for loop in list(tree.find_all(nodes.For)):
            loop.iter = nodes.Filter(loop.iter, _ITER, [], [], None, None, lineno=loop.lineno)
        for tilde in list(tree.find_all(nodes.Concat)):  # `a ~ b ~ c` becomes `~ (checked join of a, b, c)`
            items = nodes.Tuple(tilde.nodes, "load", lineno=tilde.lineno)
            tilde.nodes = [nodes.Filter(items, _TILDE, [], [], None, None, lineno=tilde.lineno)]
        tree.set_environment(self)
        return tree

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _tick()
        _check_binop(operator, left, right)
        return super().call_binop(context, operator, left, right)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - as Jinja's
        _tick()
        method = getattr(__obj, "__wrapped__", __obj)  # the sandbox hands out str.format/format_map wrapped
        if isinstance(method, types.BuiltinMethodType) and isinstance(method.__self__, str):
            check = _METHOD_CHECKS.get(method.__name__)
            replaced = check(method.__self__, *args, **kwargs) if check else None
            args = args if replaced is None else replaced
        return super().call(__context, __obj, *args, **kwargs)


class UntrustedChatTemplate(ChatTemplate):
    """A :class:`ChatTemplate` for a template sent by a client: same API and output, rendered with a deadline and
    size checks; a source over ``MAX_TEMPLATE_CHARS`` is refused."""

    environment = _UntrustedEnvironment()

    def __init__(self, source: str, *, bos_token: str | None, eos_token: str | None,
                 extra_context: Mapping | None = None) -> None:
        if isinstance(source, str) and len(source) > MAX_TEMPLATE_CHARS:
            raise ChatTemplateError(f"the chat template is too long (more than {MAX_TEMPLATE_CHARS:,} characters)",
                                    kind="input")
        super().__init__(source, bos_token=bos_token, eos_token=eos_token, extra_context=extra_context)

    def render(self, messages: list[dict], *, add_generation_prompt: bool = True, tools: list | None = None,
               chat_template_kwargs: Mapping | None = None, now: datetime | None = None) -> str:
        token = _DEADLINE.set(time.monotonic() + RENDER_TIMEOUT_S)
        try:
            return super().render(messages, add_generation_prompt=add_generation_prompt, tools=tools,
                                  chat_template_kwargs=chat_template_kwargs, now=now)
        finally:
            _DEADLINE.reset(token)
