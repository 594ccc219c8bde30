"""Chat-template rendering compatible with Hugging Face ``transformers``.

A model's chat template is a Jinja template that turns an OpenAI-style message
list into the prompt string the model was trained on.  This module reproduces
the environment ``transformers.apply_chat_template`` renders in, so that a
template shipped with a model (in its GGUF metadata or ``tokenizer_config.json``)
gives byte-for-byte the same prompt here:

* ``ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)`` with
  ``jinja2.ext.loopcontrols`` and a ``{% generation %}`` tag (rendered as its
  body), the default lenient ``Undefined``;
* globals ``raise_exception``, ``strftime_now`` (plus Jinja's own ``namespace``,
  ``dict``, ``range``, ...);
* ``tojson`` replaced by ``json.dumps(ensure_ascii=False, ...)`` (no HTML
  escaping, keys in insertion order, ``indent``/``separators`` supported);
* variables: the special tokens (``bos_token``/``eos_token`` only when the model
  has them), ``messages`` (``None``-valued keys dropped, as
  ``apply_chat_template`` does), ``tools``, ``documents`` (``None``),
  ``add_generation_prompt``, and finally the request's ``chat_template_kwargs``
  over all of those.

Templates can also arrive with a request, so rendering is hardened beyond the
Jinja sandbox: besides the sandbox's attribute/mutation rules, every render has
a wall-clock deadline and an operation budget, and the operations that can blow
up memory (string/list repetition and concatenation, ``**`` on integers,
``%``/``format`` widths, padding and joining methods and filters, printing huge
containers) are size-checked *before* they allocate.  Whatever goes wrong inside
a template surfaces as :class:`ChatTemplateError`, whose message is safe to
return to the client (the server answers 400 with it).
"""

from __future__ import annotations

import contextvars
import functools
import json
import re
import string
import time
import types
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.exceptions import TemplateError, TemplateSyntaxError
from jinja2.filters import make_attrgetter
from jinja2.runtime import Undefined, markup_join, str_join
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace, generate_lorem_ipsum
from jinja2.visitor import NodeTransformer

__all__ = [
    "ChatTemplate",
    "ChatTemplateError",
    "builtin_gemma_template",
    "clear_template_cache",
]

# --------------------------------------------------------------------------
# Limits.  Read at call time, so tests (or the server) can adjust them.
# --------------------------------------------------------------------------

#: Longest template source accepted (characters).
MAX_TEMPLATE_CHARS = 1 << 20
#: Longest string a template may build, including the rendered prompt.
MAX_CHARS = 1 << 24
#: Longest list a template may build, and most iterations of one loop.
MAX_ITEMS = 1 << 20
#: Largest integer (in bits) that ``*`` / ``**`` may produce.
MAX_INT_BITS = 1 << 16
#: Budget of sandbox operations (attribute lookups, calls, loop iterations, ...)
#: for one render.  Real templates use a few per message.
MAX_OPERATIONS = 10_000_000
#: Wall-clock limit for one render, in seconds.
RENDER_TIMEOUT_S = 5.0
#: Largest ``indent`` / ``separators`` accepted by ``tojson``.
MAX_JSON_INDENT = 64
#: Number of compiled templates kept (keyed by source).
TEMPLATE_CACHE_SIZE = 32


class ChatTemplateError(ValueError):
    """A chat template could not be compiled or rendered.

    ``str(err)`` is a user-facing message.  For the template's own
    ``raise_exception(msg)`` it is exactly ``msg``.  ``kind`` says what
    happened: ``"raised"`` (the template called ``raise_exception``),
    ``"syntax"`` (the template does not compile), ``"render"`` (an engine error
    while rendering: undefined value misuse, type error, sandbox violation, ...),
    ``"limit"`` (a resource limit was hit) or ``"input"`` (bad arguments).
    """

    def __init__(self, message: str, kind: str = "render") -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind

    def __str__(self) -> str:  # keep it the bare message even for odd args
        return self.message


class _TemplateRaised(TemplateError):
    """Raised by the template's ``raise_exception(...)`` global."""


class _LimitExceeded(Exception):
    """A resource limit was hit while rendering."""


# --------------------------------------------------------------------------
# Per-render budget (deadline, operation count, pinned clock)
# --------------------------------------------------------------------------


class _Budget:
    __slots__ = ("ops", "next_check", "deadline", "now")

    def __init__(self, now: datetime | None) -> None:
        self.ops = 0
        self.next_check = 1024
        self.deadline = time.monotonic() + RENDER_TIMEOUT_S
        self.now = now


_BUDGET: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar(
    "pyserve_chat_template_budget", default=None
)


def _tick(n: int = 1) -> None:
    budget = _BUDGET.get()
    if budget is None:  # compile-time constant folding: nothing to count
        return
    budget.ops += n
    if budget.ops >= budget.next_check:
        budget.next_check = budget.ops + 1024
        if budget.ops > MAX_OPERATIONS:
            raise _LimitExceeded(
                f"the template did too much work (more than {MAX_OPERATIONS:,} operations)"
            )
        if time.monotonic() > budget.deadline:
            raise _LimitExceeded(
                f"rendering took too long (more than {RENDER_TIMEOUT_S:g} s)"
            )


def _too_large(what: str, limit: int, unit: str = "characters") -> _LimitExceeded:
    return _LimitExceeded(f"{what} would be too large (more than {limit:,} {unit})")


def _check_chars(n: int, what: str = "a string") -> None:
    if n > MAX_CHARS:
        raise _too_large(what, MAX_CHARS)


def _check_items(n: int, what: str = "a list") -> None:
    if n > MAX_ITEMS:
        raise _too_large(what, MAX_ITEMS, "items")


def _text_size(obj: Any, limit: int | None = None) -> int:
    """Estimate ``len(str(obj))`` without building it; stops once past ``limit``.

    Strings count their length, containers their elements plus some overhead
    (so ``[big] * n`` counts ``big`` n times, as its repr would).  Anything else
    counts as a short repr.
    """
    if limit is None:
        limit = MAX_CHARS
    if isinstance(obj, str):
        return len(obj)
    if obj is None or isinstance(obj, (bool, float, Undefined)):
        return 8
    if isinstance(obj, int):
        return obj.bit_length() // 3 + 2
    total = 0
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, str):
            total += len(o) + 2
        elif isinstance(o, dict):
            total += 2 + 4 * len(o)
            if total > limit:
                return total
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, (list, tuple, set, frozenset)):
            total += 2 + 2 * len(o)
            if total > limit:
                return total
            stack.extend(o)
        elif isinstance(o, Namespace):
            total += 12
            stack.append(object.__getattribute__(o, "_Namespace__attrs"))
        elif isinstance(o, int) and not isinstance(o, bool):
            total += o.bit_length() // 3 + 2
        else:
            total += 16
        if total > limit:
            return total
    return total


def _json_size(obj: Any, indent: int, item_sep: int, key_sep: int, limit: int) -> int:
    """Estimate the length of ``json.dumps(obj, indent=..., separators=...)``."""
    total = 0
    stack = [(obj, 0)]
    while stack:
        o, depth = stack.pop()
        if isinstance(o, str):
            total += len(o) + 2
        elif isinstance(o, dict):
            n = len(o)
            total += 2 + n * (item_sep + key_sep + indent * (depth + 1)) + indent * depth
            if total > limit:
                return total
            stack.extend((k, depth + 1) for k in o.keys())
            stack.extend((v, depth + 1) for v in o.values())
        elif isinstance(o, (list, tuple)):
            n = len(o)
            total += 2 + n * (item_sep + indent * (depth + 1)) + indent * depth
            if total > limit:
                return total
            stack.extend((v, depth + 1) for v in o)
        elif isinstance(o, int) and not isinstance(o, bool):
            total += o.bit_length() // 3 + 2
        else:
            total += 8
        if total > limit:
            return total
    return total


def _bounded_list(iterable: Any, what: str = "a list") -> list:
    """``list(iterable)``, refusing more than ``MAX_ITEMS`` items."""
    if isinstance(iterable, list):
        _check_items(len(iterable), what)
        return iterable
    try:
        n = len(iterable)
    except Exception:
        n = None
    if n is not None:
        _check_items(n, what)
        return list(iterable)
    out = []
    for item in iterable:
        out.append(item)
        if len(out) > MAX_ITEMS:
            raise _too_large(what, MAX_ITEMS, "items")
        if not len(out) & 0xFF:
            _tick(256)
    return out


_PERCENT_SPEC = re.compile(
    r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?([a-zA-Z%])"
)
_DIGITS = re.compile(r"\d+")


def _check_percent_format(fmt: str, args: Any) -> None:
    """Size check for ``fmt % args`` (and the ``format`` filter)."""
    specs = 0
    widest = 0
    star = False
    for m in _PERCENT_SPEC.finditer(fmt):
        if m.group(3) == "%":
            continue
        specs += 1
        for g in (m.group(1), m.group(2)):
            if g == "*":
                star = True
            elif g:
                widest = max(widest, int(g) if len(g) < 12 else MAX_CHARS + 1)
    if not specs:
        return
    if isinstance(args, tuple):
        values = list(args)
    elif isinstance(args, Mapping):
        values = list(args.values())
    else:
        values = [args]
    if star:
        for v in values:
            if isinstance(v, int) and abs(v) > MAX_CHARS:
                raise _too_large("a formatted field", MAX_CHARS)
    _check_chars(widest, "a formatted field")
    biggest = max((_text_size(v) for v in values), default=0)
    _check_chars(len(fmt) + specs * (biggest + widest), "a formatted string")


def _check_str_format(fmt: str, args: tuple, kwargs: Mapping) -> None:
    """Size check for ``fmt.format(*args, **kwargs)``."""
    fields = 0
    widest = 0
    nested = False
    try:
        for _literal, field, spec, _conv in string.Formatter().parse(fmt):
            if field is None:
                continue
            fields += 1
            if spec:
                if "{" in spec:
                    nested = True
                for g in _DIGITS.findall(spec):
                    widest = max(widest, int(g) if len(g) < 12 else MAX_CHARS + 1)
    except ValueError:
        return  # malformed: the real call raises the proper error
    if not fields:
        return
    values = list(args) + list(kwargs.values())
    if nested:
        for v in values:
            if isinstance(v, int) and abs(v) > MAX_CHARS:
                raise _too_large("a formatted field", MAX_CHARS)
    _check_chars(widest, "a formatted field")
    biggest = max((_text_size(v) for v in values), default=0)
    _check_chars(len(fmt) + fields * (biggest + widest), "a formatted string")


def _check_replace(s: str, old: Any, new: Any, count: Any = -1) -> None:
    if not (isinstance(s, str) and isinstance(old, str) and isinstance(new, str)):
        return
    if len(new) <= len(old):
        return
    n = len(s) + 1 if old == "" else s.count(old)
    if isinstance(count, int) and count >= 0:
        n = min(n, count)
    _check_chars(len(s) + n * (len(new) - len(old)), "the result of replace()")


def _check_join(sep: str, items: list) -> None:
    total = len(sep) * max(len(items) - 1, 0)
    _check_chars(total, "the result of join()")
    for item in items:
        total += _text_size(item)
        if total > MAX_CHARS:
            raise _too_large("the result of join()", MAX_CHARS)


# --------------------------------------------------------------------------
# Operators, method calls, output
# --------------------------------------------------------------------------

_SEQUENCES = (str, list, tuple)


def _check_binop(op: str, left: Any, right: Any) -> None:
    if op == "+":
        if isinstance(left, _SEQUENCES) and isinstance(right, _SEQUENCES):
            if isinstance(left, str):
                _check_chars(len(left) + len(right))
            else:
                _check_items(len(left) + len(right))
    elif op == "*":
        seq, count = None, None
        if isinstance(left, _SEQUENCES) and isinstance(right, int):
            seq, count = left, right
        elif isinstance(right, _SEQUENCES) and isinstance(left, int):
            seq, count = right, left
        if seq is not None:
            n = len(seq) * max(count, 0)
            if isinstance(seq, str):
                _check_chars(n)
            else:
                _check_items(n)
        elif isinstance(left, int) and isinstance(right, int):
            if left.bit_length() + right.bit_length() > MAX_INT_BITS:
                raise _too_large("an integer", MAX_INT_BITS, "bits")
    elif op == "**":
        if isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
            if right > MAX_INT_BITS or right * left.bit_length() > MAX_INT_BITS:
                raise _too_large("an integer", MAX_INT_BITS, "bits")
    elif op == "%":
        if isinstance(left, str):
            _check_percent_format(left, right)


_PAD_METHODS = frozenset({"ljust", "rjust", "center", "zfill"})


def _check_call(obj: Any, args: tuple, kwargs: dict) -> tuple:
    """Size checks for str methods called from a template; may return new args."""
    target = getattr(obj, "__wrapped__", obj)  # str.format comes pre-wrapped by the sandbox
    if not isinstance(target, types.BuiltinMethodType):
        return args
    s = getattr(target, "__self__", None)
    if not isinstance(s, str):
        return args
    name = target.__name__
    if name in _PAD_METHODS:
        width = args[0] if args else kwargs.get("width")
        if isinstance(width, int):
            _check_chars(width, f"the result of {name}()")
    elif name == "expandtabs":
        size = args[0] if args else kwargs.get("tabsize", 8)
        if isinstance(size, int) and size > 1:
            _check_chars(len(s) + s.count("\t") * size, "the result of expandtabs()")
    elif name == "replace":
        if len(args) >= 2:
            _check_replace(s, *args[:3])
    elif name == "join":
        if args:
            items = _bounded_list(args[0])
            _check_join(s, items)
            args = (items,) + tuple(args[1:])
    elif name == "translate":
        table = args[0] if args else None
        if isinstance(table, Mapping):
            longest = max(
                (len(v) for v in table.values() if isinstance(v, str)), default=1
            )
            _check_chars(len(s) * max(longest, 1), "the result of translate()")
    elif name == "format":
        _check_str_format(s, args, kwargs)
    elif name == "format_map":
        if args and isinstance(args[0], Mapping):
            _check_str_format(s, (), args[0])
    return args


def _checked_concat(seq: Any) -> str:
    """``environment.concat``: joins block, macro and call-block output."""
    if not isinstance(seq, list):
        seq = list(seq)
    _check_chars(sum(map(len, seq)))
    return "".join(seq)


def _finalize(value: Any) -> Any:
    """Applied to every ``{{ expression }}`` before ``str()``: refuse huge reprs."""
    if isinstance(value, (str, int, float, Undefined)) or value is None:
        return value
    _check_chars(_text_size(value), "printed value")
    return value


# --------------------------------------------------------------------------
# Globals and filters
# --------------------------------------------------------------------------


def _raise_exception(message: Any = "") -> None:
    raise _TemplateRaised(message)


def _strftime_now(format: Any) -> str:  # noqa: A002 - template-facing name
    budget = _BUDGET.get()
    now = budget.now if budget is not None and budget.now is not None else None
    if now is None:
        now = datetime.now()
    if isinstance(format, str):
        _check_chars(len(format) * 16, "the result of strftime_now()")
    return now.strftime(format)


def _lipsum(n: int = 5, html: bool = True, min: int = 20, max: int = 100) -> str:  # noqa: A002
    if isinstance(n, int) and isinstance(max, int) and n * max > 100_000:
        raise _too_large("lipsum()", 100_000, "words")
    return generate_lorem_ipsum(n, html, min, max)


def _tojson(
    x: Any,
    ensure_ascii: bool = False,
    indent: Any = None,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    """transformers' ``tojson``: ``json.dumps`` without Jinja's HTML escaping."""
    if isinstance(indent, int) and not isinstance(indent, bool):
        indent_len = indent
    elif isinstance(indent, str):
        indent_len = len(indent)
    else:
        indent_len = 0
    if indent_len > MAX_JSON_INDENT:
        raise _too_large("the tojson indent", MAX_JSON_INDENT)
    item_sep, key_sep = 2, 2
    if isinstance(separators, (list, tuple)) and len(separators) == 2:
        item_sep = len(separators[0]) if isinstance(separators[0], str) else 2
        key_sep = len(separators[1]) if isinstance(separators[1], str) else 2
        if item_sep + key_sep > MAX_JSON_INDENT:
            raise _too_large("the tojson separators", MAX_JSON_INDENT)
    size = _json_size(x, indent_len, item_sep, key_sep, MAX_CHARS)
    if ensure_ascii:
        size *= 2
    _check_chars(size, "the result of tojson")
    return json.dumps(
        x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _filter_sum(environment: Any, iterable: Any, attribute: Any = None, start: Any = 0) -> Any:
    if attribute is not None:
        iterable = map(make_attrgetter(environment, attribute), iterable)
    total = start
    for item in iterable:
        _tick()
        _check_binop("+", total, item)
        total = total + item
    return total


_filter_sum = jinja2.pass_environment(_filter_sum)


def _filter_list(value: Any) -> list:
    if isinstance(value, str):
        _check_items(len(value))
    return list(_bounded_list(value))


# Checkers for the built-in filters that can amplify their input.  Each takes
# the filter's own arguments (without the context/environment argument) and
# returns replacement positional arguments, or None to keep them.


def _chk_center(value: Any = "", width: Any = 80, *_a: Any, **_k: Any) -> None:
    if isinstance(width, int):
        _check_chars(width, "the result of center")


def _chk_indent(s: Any = "", width: Any = 4, *_a: Any, **_k: Any) -> None:
    s = s if isinstance(s, str) else str(s) if isinstance(s, (int, float)) else ""
    w = width if isinstance(width, int) else len(width) if isinstance(width, str) else 0
    _check_chars(len(s) + (s.count("\n") + 1) * max(w, 0), "the result of indent")


def _chk_format(value: Any = "", *args: Any, **kwargs: Any) -> None:
    if isinstance(value, str):
        _check_percent_format(value, kwargs or args)


def _chk_replace(s: Any = "", old: Any = "", new: Any = "", count: Any = None) -> None:
    _check_replace(s, old, new, -1 if count is None else count)


def _chk_join(value: Any = (), d: Any = "", attribute: Any = None) -> tuple:
    items = _bounded_list(value)
    sep = d if isinstance(d, str) else ""
    if attribute is None:
        _check_join(sep, items)
    else:
        _check_chars(len(sep) * max(len(items) - 1, 0), "the result of join")
    return (items, d, attribute)


def _chk_wordwrap(s: Any = "", width: Any = 79, break_long_words: Any = True,
                  wrapstring: Any = None, *_a: Any, **_k: Any) -> None:
    if isinstance(s, str) and isinstance(wrapstring, str) and len(wrapstring) > 1:
        _check_chars(len(s) * (1 + len(wrapstring)), "the result of wordwrap")


def _chk_batch(value: Any = (), linecount: Any = 1, fill_with: Any = None) -> None:
    if fill_with is not None and isinstance(linecount, int):
        _check_items(linecount, "a batch")


def _chk_slice(value: Any = (), slices: Any = 1, fill_with: Any = None) -> tuple:
    if isinstance(slices, int):
        _check_items(slices, "the number of slices")
    return (_bounded_list(value), slices, fill_with)


def _chk_materialize(value: Any = (), *args: Any, **_k: Any) -> tuple | None:
    if isinstance(value, (str, Mapping)):
        _check_items(len(value))
        return None
    return (_bounded_list(value),) + args


def _chk_string(value: Any = "", *_a: Any, **_k: Any) -> None:
    _check_chars(_text_size(value), "the result of string")


def _chk_urlize(value: Any = "", trim_url_limit: Any = None, nofollow: Any = False,
                target: Any = None, rel: Any = None, *_a: Any, **_k: Any) -> None:
    extra = sum(len(x) for x in (target, rel) if isinstance(x, str))
    if isinstance(value, str) and extra:
        _check_chars(len(value) + (len(value) // 4 + 1) * (extra + 64), "the result of urlize")


_FILTER_CHECKS = {
    "center": _chk_center,
    "indent": _chk_indent,
    "format": _chk_format,
    "replace": _chk_replace,
    "join": _chk_join,
    "wordwrap": _chk_wordwrap,
    "batch": _chk_batch,
    "slice": _chk_slice,
    "sort": _chk_materialize,
    "unique": _chk_materialize,
    "reverse": _chk_materialize,
    "groupby": _chk_materialize,
    "string": _chk_string,
    "pprint": _chk_string,
    "urlize": _chk_urlize,
}


def _guard_filter(original: Any, check: Any) -> Any:
    skip = 1 if getattr(original, "jinja_pass_arg", None) is not None else 0

    @functools.wraps(original)  # copies jinja_pass_arg, so Jinja passes the same context
    def guarded(*args: Any, **kwargs: Any) -> Any:
        _tick()
        new_args = check(*args[skip:], **kwargs)
        if new_args is not None:
            args = args[:skip] + tuple(new_args)
        return original(*args, **kwargs)

    return guarded


class _GuardedIterable:
    """Wraps every ``{% for %}`` iterable: counts iterations, keeps ``len()``."""

    __slots__ = ("_iterable",)

    def __init__(self, iterable: Any) -> None:
        self._iterable = iterable

    def __len__(self) -> int:
        return len(self._iterable)

    def __iter__(self) -> Any:
        n = 0
        for item in self._iterable:
            n += 1
            if n > MAX_ITEMS:
                raise _LimitExceeded(f"a loop ran more than {MAX_ITEMS:,} times")
            _tick()
            yield item


@jinja2.pass_context  # pass_context: never evaluated at compile time
def _guard_iter(_context: Any, iterable: Any) -> Any:
    return _GuardedIterable(iterable)


@jinja2.pass_eval_context
def _guard_concat(eval_ctx: Any, items: tuple) -> str:
    total = 0
    for item in items:
        total += _text_size(item)
        if total > MAX_CHARS:
            raise _too_large("a string", MAX_CHARS)
    return markup_join(items) if eval_ctx.autoescape else str_join(items)


_ITER_FILTER = "_pyserve_guard_iter"
_CONCAT_FILTER = "_pyserve_guard_concat"


class _Instrument(NodeTransformer):
    """Routes loop iterables and ``~`` concatenation through the guards."""

    def visit_For(self, node: nodes.For) -> nodes.For:
        self.generic_visit(node)
        node.iter = nodes.Filter(node.iter, _ITER_FILTER, [], [], None, None, lineno=node.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Node:
        self.generic_visit(node)
        items = nodes.Tuple(list(node.nodes), "load", lineno=node.lineno)
        return nodes.Filter(items, _CONCAT_FILTER, [], [], None, None, lineno=node.lineno)


# --------------------------------------------------------------------------
# The environment
# --------------------------------------------------------------------------


class _GenerationExtension(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}`` (transformers' AssistantTracker),
    which marks assistant output for training masks; here it just renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_generation_body"), [], [], body).set_lineno(lineno)

    def _generation_body(self, caller: Any) -> str:
        return caller()


class _ChatEnvironment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"+", "*", "**", "%"})
    concat = staticmethod(_checked_concat)

    def __init__(self) -> None:
        super().__init__(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[_GenerationExtension, jinja2.ext.loopcontrols],
            finalize=_finalize,
        )
        self.globals["raise_exception"] = _raise_exception
        self.globals["strftime_now"] = _strftime_now
        self.globals["lipsum"] = _lipsum
        self.filters["tojson"] = _tojson
        self.filters["sum"] = _filter_sum
        self.filters["list"] = _filter_list
        for name, check in _FILTER_CHECKS.items():
            self.filters[name] = _guard_filter(self.filters[name], check)
        self.filters[_ITER_FILTER] = _guard_iter
        self.filters[_CONCAT_FILTER] = _guard_concat

    def _parse(self, source: str, name: str | None, filename: str | None) -> nodes.Template:
        tree = super()._parse(source, name, filename)
        tree = _Instrument().visit(tree)
        tree.set_environment(self)
        return tree

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        _tick()
        _check_binop(operator, left, right)
        return super().call_binop(context, operator, left, right)

    def getattr(self, obj: Any, attribute: str) -> Any:
        _tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        _tick()
        return super().getitem(obj, argument)

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
        _tick()
        args = _check_call(__obj, args, kwargs)
        return ImmutableSandboxedEnvironment.call(__self, __context, __obj, *args, **kwargs)


_ENV = _ChatEnvironment()


@functools.lru_cache(maxsize=TEMPLATE_CACHE_SIZE)
def _compile(source: str) -> jinja2.Template:
    try:
        return _ENV.from_string(source)
    except TemplateSyntaxError as exc:
        where = f" (line {exc.lineno})" if exc.lineno else ""
        raise ChatTemplateError(
            f"chat template syntax error{where}: {exc.message}", kind="syntax"
        ) from None
    except RecursionError:
        raise ChatTemplateError(
            "invalid chat template: it is nested too deeply", kind="syntax"
        ) from None
    except Exception as exc:  # e.g. Python's own compiler limits
        raise ChatTemplateError(
            f"invalid chat template: {type(exc).__name__}: {exc}", kind="syntax"
        ) from None


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
    kind = "render"
    if isinstance(exc, _LimitExceeded):
        kind, detail = "limit", str(exc)
    elif isinstance(exc, RecursionError):
        kind, detail = "limit", "recursion too deep"
    elif isinstance(exc, MemoryError):
        kind, detail = "limit", "out of memory"
    elif isinstance(exc, TemplateError):
        detail = exc.message or type(exc).__name__
    else:
        detail = f"{type(exc).__name__}: {exc}"
    line = _template_line(exc, template)
    where = f" (template line {line})" if line else ""
    return ChatTemplateError(f"chat template error{where}: {detail}", kind=kind)


def _clean_messages(messages: Any) -> list:
    if isinstance(messages, (str, bytes, Mapping)) or messages is None:
        raise ChatTemplateError("messages must be a list of message objects", kind="input")
    cleaned = []
    for message in messages:
        if isinstance(message, Mapping):
            cleaned.append({k: v for k, v in message.items() if v is not None})
        else:
            cleaned.append(message)
    return cleaned


# --------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------


class ChatTemplate:
    """A compiled chat template plus the model's special tokens.

    ``bos_token`` / ``eos_token`` of ``None`` mean the model has no such token:
    the variable is then left undefined (not set to an empty string).
    ``extra_context`` adds further template variables (other special tokens,
    say); the explicit tokens and the per-render variables take precedence.

    Compilation is cached by source (LRU of ``TEMPLATE_CACHE_SIZE``), so
    building a ``ChatTemplate`` per request for a client-supplied template is
    cheap.  A syntax error raises :class:`ChatTemplateError` here.
    ``render`` is thread-safe.
    """

    def __init__(
        self,
        source: str,
        *,
        bos_token: str | None,
        eos_token: str | None,
        extra_context: Mapping | None = None,
    ) -> None:
        if not isinstance(source, str):
            raise ChatTemplateError("the chat template must be a string", kind="input")
        if len(source) > MAX_TEMPLATE_CHARS:
            raise ChatTemplateError(
                f"the chat template is too long (more than {MAX_TEMPLATE_CHARS:,} characters)",
                kind="input",
            )
        self.source = source
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.extra_context = dict(extra_context) if extra_context else {}
        self._template = _compile(source)

    def render(
        self,
        messages: list[dict],
        *,
        add_generation_prompt: bool = True,
        tools: list | None = None,
        chat_template_kwargs: Mapping | None = None,
        now: datetime | None = None,
    ) -> str:
        """Render ``messages`` to the prompt string.

        ``tools`` is passed as the ``tools`` variable (``None`` when absent, as
        transformers does); ``chat_template_kwargs`` (e.g. ``enable_thinking``)
        are set last, over the special tokens and the other variables;
        ``now`` pins what ``strftime_now()`` sees (default: local time).
        """
        variables: dict[str, Any] = dict(self.extra_context)
        if self.bos_token is not None:
            variables["bos_token"] = self.bos_token
        if self.eos_token is not None:
            variables["eos_token"] = self.eos_token
        variables["messages"] = _clean_messages(messages)
        variables["tools"] = tools
        variables["documents"] = None
        variables["add_generation_prompt"] = add_generation_prompt
        if chat_template_kwargs:
            for key, value in chat_template_kwargs.items():
                if not isinstance(key, str) or not key.isidentifier():
                    raise ChatTemplateError(
                        f"chat_template_kwargs: invalid variable name {key!r}", kind="input"
                    )
                if key == "messages":
                    raise ChatTemplateError(
                        "chat_template_kwargs cannot replace 'messages'", kind="input"
                    )
                variables[key] = value
        return _render(self._template, variables, now)


def _render(template: jinja2.Template, variables: dict, now: datetime | None) -> str:
    token = _BUDGET.set(_Budget(now))
    try:
        context = template.new_context(variables)
        out: list[str] = []
        total = 0
        for chunk in template.root_render_func(context):
            total += len(chunk)
            if total > MAX_CHARS:
                raise _too_large("the rendered prompt", MAX_CHARS)
            out.append(chunk)
        return "".join(out)
    except _TemplateRaised as exc:
        message = exc.args[0] if exc.args else ""
        raise ChatTemplateError(str(message), kind="raised") from None
    except ChatTemplateError:
        raise
    except Exception as exc:
        raise _render_error(exc, template) from exc
    finally:
        _BUDGET.reset(token)


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
