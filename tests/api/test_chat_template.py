"""Chat-template renderer: the Hugging Face reference fixtures plus behaviour tests, for the model's own templates
(``ChatTemplate``) and for templates sent in requests (``UntrustedChatTemplate``, which adds resource limits).

The fixtures are ``tests/data/chat_templates/`` (origin: tests/data/README.md): ``cases.jsonl`` and, in its
fields, ``tool_families.jsonl`` (the tool-calling conversations for GLM-4.6/4.7, Qwen3-Coder, Qwen3.5 and Gemma 4).
"""

from __future__ import annotations

import json
import time
from datetime import datetime

import pytest

from pyserve.api.template import chat_template as ct
from pyserve.api.template import untrusted_template as ut
from pyserve.api.template.chat_template import ChatTemplate, ChatTemplateError, builtin_gemma_template
from pyserve.api.template.untrusted_template import UntrustedChatTemplate
from support.chat_cases import CASES, FIXTURES, TEMPLATE_ERROR

BY_ID = {case["case"]: case for case in CASES}
# both kinds must render a model's template identically
KINDS = pytest.mark.parametrize("kind", [ChatTemplate, UntrustedChatTemplate], ids=["trusted", "untrusted"])


def _case_now(case: dict) -> datetime | None:
    return datetime.fromisoformat(case["now"]) if case["now"] else None


def _render_case(case: dict, kind: type = ChatTemplate, **overrides) -> str:
    template = kind(case["template"], bos_token=case["bos_token"], eos_token=case["eos_token"])
    kwargs = dict(
        add_generation_prompt=case["add_generation_prompt"],
        tools=case["tools"],
        now=_case_now(case),
    )
    kwargs.update(overrides)
    return template.render(case["messages"], **kwargs)


def test_fixture_file_present():
    assert all(path.is_file() for path in FIXTURES), f"missing reference fixtures: {FIXTURES}"
    assert len(CASES) == 60 + 15


# --------------------------------------------------------------------------
# The reference cases
# --------------------------------------------------------------------------


@KINDS
@pytest.mark.parametrize("case", CASES, ids=[c["case"] for c in CASES])
def test_reference_case(case, kind):
    if case["expected_error"] is None:
        assert _render_case(case, kind) == case["expected"]
    elif case["expected_error_type"] == TEMPLATE_ERROR:
        # the template's own raise_exception(...): exact message
        with pytest.raises(ChatTemplateError) as info:
            _render_case(case, kind)
        assert str(info.value) == case["expected_error"]
        assert info.value.kind == "raised"
    else:
        # engine error (UndefinedError, ...): the text is implementation-specific
        with pytest.raises(ChatTemplateError) as info:
            _render_case(case, kind)
        assert info.value.kind == "render"
        assert str(info.value)


# --------------------------------------------------------------------------
# Built-in Gemma template
# --------------------------------------------------------------------------


def test_builtin_gemma_is_the_gemma3_template():
    gemma_cases = [c for c in CASES if c["family"] == "gemma-3-it"]
    assert gemma_cases
    for case in gemma_cases:
        assert builtin_gemma_template() == case["template"]


def test_builtin_gemma_renders_two_turns_like_fixture():
    case = BY_ID["gemma-3-it/c_multiturn_gen"]
    template = ChatTemplate(builtin_gemma_template(), bos_token="<bos>", eos_token="<eos>")
    out = template.render(case["messages"], add_generation_prompt=True)
    assert out == case["expected"]
    assert out.startswith("<bos><start_of_turn>user\n")
    assert out.endswith("<end_of_turn>\n<start_of_turn>model\n")


def test_builtin_gemma_single_user():
    template = ChatTemplate(builtin_gemma_template(), bos_token="<bos>", eos_token="<eos>")
    out = template.render([{"role": "user", "content": " Hi there \n"}])
    assert out == "<bos><start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n"
    out = template.render([{"role": "user", "content": "Hi"}], add_generation_prompt=False)
    assert out == "<bos><start_of_turn>user\nHi<end_of_turn>\n"


# --------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "source",
    [
        "{% for m in messages %}{{ m.content }}",  # unclosed block
        "{{ messages[0] }",
        "{% if %}x{% endif %}",
        "{% nosuchtag %}",
        "{{ x | no_such_filter }}",
    ],
)
def test_syntax_error_raises(source):
    with pytest.raises(ChatTemplateError) as info:
        ChatTemplate(source, bos_token=None, eos_token=None)
    assert info.value.kind == "syntax"
    assert "chat template" in str(info.value)
    assert isinstance(info.value, ValueError)


def test_raise_exception_message_is_exact():
    template = ChatTemplate(
        "{{ raise_exception('Only user and assistant roles are supported!') }}",
        bos_token=None,
        eos_token=None,
    )
    with pytest.raises(ChatTemplateError) as info:
        template.render([])
    assert str(info.value) == "Only user and assistant roles are supported!"
    assert info.value.kind == "raised"


@pytest.mark.parametrize(
    "source",
    [
        "{{ messages[0].content + '!' }}",  # undefined + str
        "{{ messages[0].content.strip() }}",  # method on undefined
        "{{ 1 + 'a' }}",
        "{{ ''.__class__.__mro__ }}",  # sandbox
        "{{ messages.append(1) }}",  # immutable sandbox
        "{% include 'other' %}",
        "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",  # recursion
    ],
)
@KINDS
def test_engine_errors_become_chat_template_errors(source, kind):
    template = kind(source, bos_token=None, eos_token=None)
    with pytest.raises(ChatTemplateError) as info:
        template.render([{"role": "user"}])
    assert info.value.kind in ("render", "limit")
    assert str(info.value).startswith("chat template error")


# --------------------------------------------------------------------------
# Variables and environment
# --------------------------------------------------------------------------


def test_chat_template_kwargs_override():
    template = ChatTemplate(
        "{{ bos_token }}|{{ flag }}|{{ add_generation_prompt }}", bos_token="<s>", eos_token=None
    )
    assert template.render([]) == "<s>||True"
    out = template.render([], chat_template_kwargs={"bos_token": "B", "flag": 7})
    assert out == "B|7|True"
    out = template.render([], chat_template_kwargs={"add_generation_prompt": False})
    assert out == "<s>||False"


def test_chat_template_kwargs_enable_thinking_qwen3():
    case = BY_ID["qwen3/a_single_user"]
    default = _render_case(case)
    no_think = _render_case(case, chat_template_kwargs={"enable_thinking": False})
    assert default == case["expected"]
    assert no_think == case["expected"] + "<think>\n\n</think>\n\n"


def test_chat_template_kwargs_cannot_replace_messages():
    template = ChatTemplate("{{ messages|length }}", bos_token=None, eos_token=None)
    with pytest.raises(ChatTemplateError):
        template.render([], chat_template_kwargs={"messages": []})


def test_missing_special_token_is_undefined_not_empty():
    source = "{{ bos_token is defined }} {{ eos_token is defined }}"
    assert ChatTemplate(source, bos_token=None, eos_token="</s>").render([]) == "False True"
    assert ChatTemplate(source, bos_token="", eos_token=None).render([]) == "True False"


def test_extra_context():
    template = ChatTemplate(
        "{{ unk_token }}{{ bos_token }}", bos_token="<s>", eos_token=None,
        extra_context={"unk_token": "<unk>", "bos_token": "ignored"},
    )
    assert template.render([]) == "<unk><s>"


def test_none_valued_keys_are_dropped():
    template = ChatTemplate(
        "{% for m in messages %}{{ m.content is defined }}{{ m | length }};{% endfor %}",
        bos_token=None, eos_token=None,
    )
    messages = [
        {"role": "assistant", "content": None, "tool_calls": None},
        {"role": "user", "content": "x"},
    ]
    assert template.render(messages) == "False1;True2;"
    assert messages[0]["content"] is None  # caller's data untouched


def test_tools_variable_is_none_when_absent():
    template = ChatTemplate(
        "{{ tools is defined }} {{ tools is none }} {{ documents is none }}",
        bos_token=None, eos_token=None,
    )
    assert template.render([]) == "True True True"
    assert template.render([], tools=[]) == "True False True"


def test_strftime_now_uses_pinned_clock():
    template = ChatTemplate('{{ strftime_now("%d %b %Y %H:%M") }}', bos_token=None, eos_token=None)
    assert template.render([], now=datetime(2025, 3, 5, 9, 30)) == "05 Mar 2025 09:30"
    # default: local time
    assert template.render([])[-5:].count(":") == 1


def test_tojson_matches_transformers():
    template = ChatTemplate(
        "{{ x | tojson }}\n{{ x | tojson(indent=4) }}\n{{ x | tojson(separators=(',', ':')) }}",
        bos_token=None, eos_token=None,
    )
    x = {"b": "<tag> & 'q'", "a": "héllo"}
    out = template.render([], chat_template_kwargs={"x": x})
    assert out == "\n".join(
        [
            json.dumps(x, ensure_ascii=False),
            json.dumps(x, ensure_ascii=False, indent=4),
            json.dumps(x, ensure_ascii=False, separators=(",", ":")),
        ]
    )
    assert "<tag> & 'q'" in out and "héllo" in out


def test_environment_features():
    source = (
        "{%- set ns = namespace(n=0) -%}\n"
        "{%- for k, v in d.items() if k != 'skip' -%}\n"
        "{%- if loop.last %}{{ k }}={{ v }}{% else %}{{ k }}={{ v }},{% endif -%}\n"
        "{%- set ns.n = ns.n + 1 -%}\n"
        "{%- endfor %}|{{ ns.n }}|{{ dict(a=1)['a'] }}|{{ 'abc'[::-1] }}|"
        "{%- for i in range(5) %}{% if i == 3 %}{% break %}{% endif %}{% if i == 1 %}{% continue %}{% endif %}{{ i }}{% endfor %}|"
        "{% generation %}gen{% endgeneration %}|{{ '  x '.strip() }}{{ missing }}|{{ 'x' in missing }}"
    )
    template = ChatTemplate(source, bos_token=None, eos_token=None)
    out = template.render([], chat_template_kwargs={"d": {"a": 1, "skip": 2, "b": 3}})
    assert out == "a=1,b=3|2|1|cba|02|gen|x|False"


def test_trailing_newline_dropped_and_trim_blocks():
    template = ChatTemplate("{% if true %}\n  a\n{% endif %}\n", bos_token=None, eos_token=None)
    assert template.render([]) == "  a\n"


def test_compiled_templates_are_cached():
    ct.clear_template_cache()
    source = "{{ messages | length }}"
    a = ChatTemplate(source, bos_token=None, eos_token=None)
    b = ChatTemplate(source, bos_token="<s>", eos_token=None)
    assert a._template is b._template
    assert ct._compile.cache_info().hits >= 1
    assert ct._compile.cache_info().maxsize == 32


# --------------------------------------------------------------------------
# Resource limits: a hostile template must fail fast, not hang or exhaust memory
# --------------------------------------------------------------------------


@pytest.fixture
def tight_limits(monkeypatch):
    monkeypatch.setattr(ut, "RENDER_TIMEOUT_S", 1.0)


@pytest.mark.parametrize(
    "source",
    [
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "{% macro f(n) %}{% if n > 0 %}{{ f(n-1) }}{{ f(n-1) }}{% endif %}{% endmacro %}{{ f(60) }}",
        "{{ 'x' * 10**10 }}",
        "{{ 2 ** (10 ** 9) }}",
        "{% set ns = namespace(s='ab') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
        "{% set ns = namespace(s=[1]) %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
        "{% set b = 'x' * 10000000 %}{% set y %}{% for i in range(100) %}{{ b }}{% endfor %}{% endset %}",
        "{% set b = 'x' * 1000000 %}{{ [b] * 100000 }}",
        "{% set b = 'x' * 1000000 %}{{ ([b] * 100000) | tojson }}",
        "{% set b = 'x' * 1000000 %}{{ ([b] * 100000) | join }}",
        "{{ 'x'.ljust(10**10) }}",
        "{{ 'x' | center(10**10) }}",
        "{{ '%999999999999d' % 1 }}",
        "{{ '{:999999999999}'.format(1) }}",
        "{{ lipsum(10**6) }}",
        "{% set s = 'a' * 10000000 %}{{ s.replace('a', 'aaaaa') }}",
        # no sandbox hook sees these: a loop over a variable, and `~`
        "{% set r = range(100000) %}{% for i in r %}{% for j in r %}{% endfor %}{% endfor %}",
        "{% set s = 'x' * 10000000 %}{% set t = s ~ s %}",
    ],
)
def test_hostile_templates_fail_fast(tight_limits, source):
    template = UntrustedChatTemplate(source, bos_token=None, eos_token=None)
    start = time.monotonic()
    with pytest.raises(ChatTemplateError) as info:
        template.render([])
    assert time.monotonic() - start < 3
    assert info.value.kind in ("limit", "render")


def test_oversized_template_source_rejected(monkeypatch):
    monkeypatch.setattr(ut, "MAX_TEMPLATE_CHARS", 100)
    with pytest.raises(ChatTemplateError):
        UntrustedChatTemplate("x" * 101, bos_token=None, eos_token=None)
