"""Tool-call parsers (pyserve/api/chat/tool_parsers): each family's output parsed whole, and streamed token by token
through real vocabularies (llama.cpp's qwen2, llama-bpe and gemma-4 test vocabularies in tests/data/vocab, decoded by the
engine's incremental detokenizer with special tokens kept) — the stream, accumulated the way openai-python does it,
equals the whole parse; the stream's deltas have OpenAI's shape; malformed output is content."""

from __future__ import annotations

import itertools
import json
import random

import pytest
from openai.lib.streaming.chat import ChatCompletionStreamState
from openai.types.chat import ChatCompletionChunk

from pyserve.api.chat.tool_parsers import (TOOL_PARSERS, StreamDelta, detect_tool_parser, get_tool_parser,
                                           mistral_call_id, new_call_id)
from pyserve.api.chat.tools import ToolPlan
from pyserve.engine.detokenizer import IncrementalDetokenizer
from support.gguf_vocab import vocab_tokenizer

W = '{"city": "Paris", "unit": "celsius"}'
T = '{"tz": "Europe/Paris"}'
U = '{"city": "Zürich", "note": "naïve \\"quoted\\" 😀 \\u00e9\\n", "days": [1, 2.5, -3e2], "ok": true, "x": null}'
LEAD = "Let me check that for you."

# family → case → (model output, content, [(name, arguments)])
CASES = {
    "hermes": {
        "one": (f'<tool_call>\n{{"name": "get_weather", "arguments": {W}}}\n</tool_call>', None,
                [("get_weather", W)]),
        "text_first": (f'{LEAD}\n<tool_call>\n{{"name": "get_weather", "arguments": {W}}}\n</tool_call>',
                       LEAD + "\n", [("get_weather", W)]),
        "parallel": (f'<tool_call>\n{{"name": "get_weather", "arguments": {W}}}\n</tool_call>\n<tool_call>\n'
                     f'{{"name": "get_time", "arguments": {T}}}\n</tool_call>', None,
                     [("get_weather", W), ("get_time", T)]),
        "unicode": (f'<tool_call>\n{{"arguments": {U}, "name": "note"}}\n</tool_call>', None, [("note", U)]),
        "no_close_tag": (f'<tool_call>\n{{"name": "get_weather", "arguments": {W}}}', None, [("get_weather", W)]),
        "text": ("It is sunny in Paris <b>today</b>.", "It is sunny in Paris <b>today</b>.", []),
    },
    "llama3_json": {
        "one": (f'{{"name": "get_weather", "parameters": {W}}}', None, [("get_weather", W)]),
        "text_first": (f'{LEAD}<|python_tag|>{{"name": "get_weather", "parameters": {W}}}', LEAD,
                       [("get_weather", W)]),
        "parallel": (f'{{"name": "get_weather", "parameters": {W}}}; {{"type": "function", "name": "get_time", '
                     f'"parameters": {T}}}', None, [("get_weather", W), ("get_time", T)]),
        "unicode": (f'<|python_tag|>{{"name": "note", "parameters": {U}}}', None, [("note", U)]),
        "json_answer": ('{"temperature": 22, "name": "Paris"}', '{"temperature": 22, "name": "Paris"}', []),
        "text": ("It is 22 °C.", "It is 22 °C.", []),
    },
    "mistral": {
        "one": (f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {W}}}]', None, [("get_weather", W)]),
        "text_first": (f'{LEAD}[TOOL_CALLS][{{"name": "get_weather", "arguments": {W}, "id": "abc123xyz"}}]',
                       LEAD, [("get_weather", W)]),
        "parallel": (f'[TOOL_CALLS][{{"name": "get_weather", "arguments": {W}}}, {{"name": "get_time", '
                     f'"arguments": {T}}}]', None, [("get_weather", W), ("get_time", T)]),
        "v11_parallel": (f'[TOOL_CALLS]get_weather[ARGS]{W}[TOOL_CALLS]get_time[ARGS]{T}', None,
                         [("get_weather", W), ("get_time", T)]),
        "v11_text_first": (f'{LEAD}[TOOL_CALLS]note[CALL_ID]a1b2c3d4e[ARGS]{U}', LEAD, [("note", U)]),
        "text": ("[1] It is sunny [TOOL] x", "[1] It is sunny [TOOL] x", []),
    },
    "pythonic": {
        "one": ('[get_weather(city="Paris", unit="celsius")]', None, [("get_weather", W)]),
        "text_first": (f'{LEAD}\n[get_weather(city="Paris", unit="celsius")]', LEAD + "\n", [("get_weather", W)]),
        "parallel": ("[get_weather(city='Paris', unit='celsius'), get_time(tz=\"Europe/Paris\")]", None,
                     [("get_weather", W), ("get_time", T)]),
        "literals": ('[note(city="Zürich", note=\'naïve "quoted" 😀 é\\n\', days=[1, 2.5, -3e2], ok=True, x=None), '
                     'now()]', None,
                     [("note", '{"city": "Zürich", "note": "naïve \\"quoted\\" 😀 é\\n", "days": [1, 2.5, -300.0], '
                               '"ok": true, "x": null}'), ("now", "{}")]),
        "text": ("Options: [a, b] or [1, 2].\n[see below]", "Options: [a, b] or [1, 2].\n[see below]", []),
        "unclosed_list": ('[get_weather(city="Paris", unit="celsius")', None, [("get_weather", W)]),  # whole calls
    },
    "granite": {
        "one": (f'<|tool_call|>[{{"name": "get_weather", "arguments": {W}}}]', None, [("get_weather", W)]),
        "text_first": (f'{LEAD}<|tool_call|>[{{"name": "get_weather", "arguments": {W}}}]', LEAD,
                       [("get_weather", W)]),
        "parallel": (f'<|tool_call|>[{{"name": "get_weather", "arguments": {W}}}, {{"name": "get_time", '
                     f'"arguments": {T}}}]', None, [("get_weather", W), ("get_time", T)]),
        "junk_after_call": ('<|tool_call|>[{"name": "now"}, 3]', ", 3]", [("now", "{}")]),
    },
    "glm45": {
        "one": ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>unit</arg_key>\n"
                "<arg_value>celsius</arg_value>\n</tool_call>", None, [("get_weather", W)]),
        "text_first": (f"{LEAD}\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n"
                       "<arg_key>unit</arg_key>\n<arg_value>celsius</arg_value>\n</tool_call>", LEAD + "\n",
                       [("get_weather", W)]),
        "parallel": ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>unit</arg_key>"
                     "\n<arg_value>celsius</arg_value>\n</tool_call>\n<tool_call>get_time\n<arg_key>tz</arg_key>\n"
                     "<arg_value>Europe/Paris</arg_value>\n</tool_call>", None, [("get_weather", W), ("get_time", T)]),
        # GLM-4.7 writes the tags without newlines
        "compact": ("<tool_call>get_time<arg_key>tz</arg_key><arg_value>Europe/Paris</arg_value></tool_call>", None,
                    [("get_time", T)]),
        # without a schema a value is JSON or a Python literal where it spells one, else text
        "values": ("<tool_call>note\n<arg_key>days</arg_key>\n<arg_value>[1, 2.5, -3e2]</arg_value>\n<arg_key>ok</arg_key>\n"
                   "<arg_value>True</arg_value>\n<arg_key>x</arg_key>\n<arg_value>null</arg_value>\n<arg_key>code</arg_key>\n"
                   "<arg_value>if a < b:\n    print('</x>')</arg_value>\n</tool_call>", None,
                   [("note", '{"days": [1, 2.5, -300.0], "ok": true, "x": null, "code": "if a < b:\\n    print(\'</x>\')"}')]),
        "no_arguments": ("<tool_call>now\n</tool_call>", None, [("now", "{}")]),
        "text": ("It is <b>sunny</b> in Paris.", "It is <b>sunny</b> in Paris.", []),
    },
    "qwen3_coder": {
        "one": ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\ncelsius\n"
                "</parameter>\n</function>\n</tool_call>", None, [("get_weather", W)]),
        "text_first": (f"{LEAD}\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                       "<parameter=unit>\ncelsius\n</parameter>\n</function>\n</tool_call>", LEAD + "\n",
                       [("get_weather", W)]),
        "parallel": ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\n"
                     "celsius\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n<parameter=tz>\n"
                     "Europe/Paris\n</parameter>\n</function>\n</tool_call>", None,
                     [("get_weather", W), ("get_time", T)]),
        # a multi-line value keeps its inner newlines, loses the one on each side
        "code": ("<tool_call>\n<function=write>\n<parameter=text>\n\ndef f(a):\n    return a < 2  # </param>\n\n"
                 "</parameter>\n</function>\n</tool_call>", None,
                 [("write", '{"text": "\\ndef f(a):\\n    return a < 2  # </param>\\n"}')]),
        "no_close_tag": ("<tool_call>\n<function=get_time>\n<parameter=tz>\nEurope/Paris\n</parameter>\n</function>", None,
                         [("get_time", T)]),
        "text": ("Use <function=x> tags.", "Use <function=x> tags.", []),
    },
    "gemma4": {
        "one": ('<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,unit:<|"|>celsius<|"|>}<tool_call|>', None,
                [("get_weather", W)]),
        "text_first": (f'{LEAD}<|tool_call>call:get_weather{{city:<|"|>Paris<|"|>,unit:<|"|>celsius<|"|>}}<tool_call|>',
                       LEAD, [("get_weather", W)]),
        "parallel": ('<|tool_call>call:get_weather{city:<|"|>Paris<|"|>,unit:<|"|>celsius<|"|>}<tool_call|>'
                     '<|tool_call>call:get_time{tz:<|"|>Europe/Paris<|"|>}<tool_call|>', None,
                     [("get_weather", W), ("get_time", T)]),
        # strings are marked, not escaped; nested keys bare; None is what the template prints for a null
        "values": ('<|tool_call>call:note{city:<|"|>Zürich<|"|>,note:<|"|>naïve "quoted" 😀 é\n<|"|>,days:[1, 2.5, -3e2],'
                   'ok:true,x:None,opts:{deep:{a:[]},b:false}}<tool_call|>', None,
                   [("note", '{"city": "Zürich", "note": "naïve \\"quoted\\" 😀 é\\n", "days": [1, 2.5, -300.0], '
                             '"ok": true, "x": null, "opts": {"deep": {"a": []}, "b": false}}')]),
        "no_arguments": ("<|tool_call>call:now{}<tool_call|>", None, [("now", "{}")]),
        "no_close_tag": ('<|tool_call>call:get_time{tz:<|"|>Europe/Paris<|"|>}', None, [("get_time", T)]),
        "text": ("A call looks like call:f{}.", "A call looks like call:f{}.", []),
    },
    "openai": {  # gpt-oss's harmony: a commentary message addressed to the function
        "one": (f"<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{W}<|call|>", None,
                [("get_weather", W)]),
        "text_first": (f"<|channel|>commentary<|message|>{LEAD}<|end|><|start|>assistant to=functions.get_weather"
                       f"<|channel|>commentary json<|message|>{W}<|call|>", LEAD, [("get_weather", W)]),
        "recipient_after_channel": (f"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{W}",
                                    None, [("get_weather", W)]),
        "unicode": (f"<|start|>assistant to=functions.note<|channel|>commentary json<|message|>{U}<|call|>", None,
                    [("note", U)]),
        "text": ("Use <|channel|> markers? Not here.", "Use <|channel|> markers? Not here.", []),
    },
    "json_envelope": {
        "one": (f'{{"tool_calls": [{{"name": "get_weather", "arguments": {W}}}]}}', None, [("get_weather", W)]),
        "parallel": (f'{{"tool_calls": [{{"name": "get_weather", "arguments": {W}}}, {{"name": "get_time", '
                     f'"arguments": {T}}}]}}', None, [("get_weather", W), ("get_time", T)]),
        "response": ('{"response": "Naïve \\"café\\" 😀 \\ud83d\\ude00 \\u00e9\\n\\tok"}',
                     'Naïve "café" 😀 😀 é\n\tok', []),
        "text": ("Not an envelope.", "Not an envelope.", []),
    },
}
CASE_IDS = [(family, case) for family, cases in CASES.items() for case in cases]
VOCABS = ["qwen2", "llama-bpe", "gemma-4"]  # gemma-4: Gemma 4's markers are tokens of their own


def _ids():
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def _token_deltas(text: str, vocab: str) -> list[str]:
    """The text as the detokenizer hands it out, one token at a time (special tokens kept)."""
    tok = vocab_tokenizer(vocab)
    detok = IncrementalDetokenizer(tok, skip_special=False)
    pieces = [detok.add(t) for t in tok.encode(text, add_special=False, parse_special=True)]
    pieces.append(detok.flush())
    assert "".join(pieces) == text
    return pieces


def _stream(family: str, pieces: list[str]) -> list[StreamDelta]:
    parser = get_tool_parser(family)(_ids())
    return [parser.feed(p) for p in pieces] + [parser.finish()]


def _accumulate(deltas: list[StreamDelta]):
    """The message openai-python's stream helper assembles from these deltas sent as chunks."""
    state = ChatCompletionStreamState()
    chunks = [{"role": "assistant"}] + [
        {k: v for k, v in (("content", d.content), ("tool_calls", d.tool_calls)) if v} for d in deltas if d]
    for i, delta in enumerate(chunks):
        finish = ("tool_calls" if any(d.tool_calls for d in deltas) else "stop") if i == len(chunks) - 1 else None
        state.handle_chunk(ChatCompletionChunk.model_validate({
            "id": "c", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}))
    return state.get_final_completion().choices[0].message


def _check_shapes(deltas: list[StreamDelta]) -> None:
    """OpenAI's streamed shape: one entry per index in a delta; a call's first entry carries id, type and name,
    later ones only arguments; calls are numbered in order."""
    seen = 0
    for d in deltas:
        indices = [e["index"] for e in d.tool_calls]
        assert len(indices) == len(set(indices)), d
        for e in d.tool_calls:
            if e["index"] == seen:
                assert set(e) == {"index", "id", "type", "function"} and e["type"] == "function"
                assert set(e["function"]) == {"name", "arguments"} and e["function"]["name"]
                seen += 1
            else:
                assert e["index"] < seen and set(e) == {"index", "function"} and set(e["function"]) == {"arguments"}
                assert e["function"]["arguments"]


def _parse(family: str, text: str):
    return get_tool_parser(family)(_ids()).parse(text)


# --------------------------------------------------------------------------
# whole and streamed
# --------------------------------------------------------------------------


@pytest.mark.parametrize("family,case", CASE_IDS, ids=[f"{f}-{c}" for f, c in CASE_IDS])
def test_parse(family, case):
    text, content, calls = CASES[family][case]
    result = _parse(family, text)
    assert result.content == content
    assert [(c.name, c.arguments) for c in result.tool_calls] == calls
    assert [c.id for c in result.tool_calls] == [f"call_{i}" for i in range(len(calls))]
    for call in result.tool_calls:
        json.loads(call.arguments)


@pytest.mark.parametrize("vocab", VOCABS)
@pytest.mark.parametrize("family,case", CASE_IDS, ids=[f"{f}-{c}" for f, c in CASE_IDS])
def test_stream_adds_up_to_parse(family, case, vocab):
    text = CASES[family][case][0]
    deltas = _stream(family, _token_deltas(text, vocab))
    _check_shapes(deltas)
    message = _accumulate(deltas)
    expected = _parse(family, text)
    assert message.content == expected.content
    assert [(c.id, c.function.name, c.function.arguments) for c in message.tool_calls or ()] == \
           [(c.id, c.name, c.arguments) for c in expected.tool_calls]


@pytest.mark.parametrize("family,case", CASE_IDS, ids=[f"{f}-{c}" for f, c in CASE_IDS])
def test_stream_character_by_character(family, case):
    text = CASES[family][case][0]
    deltas = _stream(family, list(text))
    _check_shapes(deltas)
    assert "".join(d.content for d in deltas) == (_parse(family, text).content or "")
    parser = get_tool_parser(family)(_ids())
    parser.feed(text)
    parser.finish()
    assert parser.tool_calls == _parse(family, text).tool_calls  # one feed of it all: the same


MARKERS = {"hermes": "<tool_call>", "llama3_json": "<|python_tag|>", "mistral": "[TOOL_CALLS]",
           "granite": "<|tool_call|>", "glm45": "<tool_call>", "qwen3_coder": "<tool_call>", "gemma4": "<|tool_call>"}


@pytest.mark.parametrize("family", MARKERS)
def test_content_held_back_only_for_a_marker_prefix(family):
    text, content, _ = CASES[family]["text_first"]
    marker, sent, fed = MARKERS[family], "", ""
    parser = get_tool_parser(family)(_ids())
    for piece in _token_deltas(text, "qwen2"):
        fed += piece
        sent += parser.feed(piece).content
        if len(fed) <= len(content):
            held = max(k for k in range(len(marker)) if fed.endswith(marker[:k]))
            assert sent == fed[:len(fed) - held]


@pytest.mark.parametrize("family,case", [("hermes", "one"), ("llama3_json", "text_first"), ("mistral", "one"),
                                         ("mistral", "v11_text_first"), ("granite", "one"),
                                         ("json_envelope", "one")])
def test_arguments_stream_as_generated(family, case):
    """After each token, the call's arguments so far are all of its arguments' text that was generated."""
    text, _, [(name, args)] = CASES[family][case]
    start = text.index(args)
    parser, fed = get_tool_parser(family)(_ids()), 0
    for piece in _token_deltas(text, "llama-bpe"):
        parser.feed(piece)
        fed += len(piece)
        if fed > start:
            assert [c.name for c in parser.tool_calls] == [name]
            assert parser.tool_calls[0].arguments == args[:fed - start]


def test_pythonic_arguments_stream_per_keyword():
    parser, got = get_tool_parser("pythonic")(_ids()), []
    for piece in ['[get_weather(ci', 'ty="Par', 'is", ', 'unit="cel', 'sius")', ']']:
        got.append([(e.get("id"), e["function"].get("name"), e["function"]["arguments"])
                    for e in parser.feed(piece).tool_calls])
    assert got == [[], [], [("call_0", "get_weather", '{"city": "Paris"')], [], [(None, None, ', "unit": "celsius"}')],
                   []]


@pytest.mark.parametrize("family,pieces", [
    ("glm45", ["<tool_", "call>get_weather\n<arg_", "key>city</arg_key>\n<arg_value>Par", "is</arg_val", "ue>\n<arg_key>",
               "unit</arg_key><arg_value>celsius</arg_value>", "\n</tool_", "call>"]),
    ("gemma4", ["<|tool_", "call>call:get_weather{", 'city:<|"|>Par', 'is<|"', '|>,', 'unit:<|"|>celsius<|"|>', "}<tool_call|>"]),
    ("qwen3_coder", ["<tool_", "call>\n<function=get_weather>", "\n<parameter=city>\nPar", "is\n</param", "eter>\n<par",
                     "ameter=unit>\ncelsius\n</parameter>", "\n</function>\n</tool_call>"])])
def test_tag_arguments_stream_per_argument(family, pieces):
    """Markers split across chunks: the header once the name is whole, each argument once its tag closes."""
    parser, got = get_tool_parser(family)(_ids()), []
    for piece in pieces:
        got.append([(e.get("id"), e["function"].get("name"), e["function"]["arguments"])
                    for e in parser.feed(piece).tool_calls])
    sent = [(i, entry) for i, entries in enumerate(got) for entry in entries]
    assert sent == [(1, ("call_0", "get_weather", "")), (4, (None, None, '{"city": "Paris"')),
                    (5, (None, None, ', "unit": "celsius"')), (len(pieces) - 1, (None, None, "}"))]
    assert parser.finish() == StreamDelta() and parser.tool_calls[0].arguments == W


WEATHER_TOOL = {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "hourly": {"type": "boolean"},
    "zip": {"type": ["string", "null"]}}}}


@pytest.mark.parametrize("family,text", [
    ("glm45", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value> 1984 </arg_value>\n<arg_key>days</arg_key>\n"
              "<arg_value>3</arg_value>\n<arg_key>hourly</arg_key>\n<arg_value>True</arg_value>\n<arg_key>zip</arg_key>\n"
              "<arg_value>75001</arg_value>\n<arg_key>extra</arg_key>\n<arg_value>{\"a\": 1}</arg_value>\n</tool_call>"),
    ("qwen3_coder", "<tool_call>\n<function=get_weather>\n<parameter=city>\n 1984 \n</parameter>\n<parameter=days>\n3\n"
                    "</parameter>\n<parameter=hourly>\nTrue\n</parameter>\n<parameter=zip>\n75001\n</parameter>\n"
                    "<parameter=extra>\n{\"a\": 1}\n</parameter>\n</function>\n</tool_call>")])
def test_tag_values_typed_by_the_tools_schema(family, text):
    """A parameter the schema types as a string keeps its text (spaces too); the others are read as values."""
    [call] = get_tool_parser(family)(_ids(), tools=[WEATHER_TOOL]).parse(text).tool_calls
    assert json.loads(call.arguments) == {"city": " 1984 ", "days": 3, "hourly": True, "zip": "75001",
                                          "extra": {"a": 1}}
    [call] = get_tool_parser(family)(_ids()).parse(text).tool_calls  # no tools: every value is read
    assert json.loads(call.arguments)["city"] == 1984


def test_a_requests_plan_gives_its_parser_the_tools():
    """A native template's parser (tools.ToolPlan) types the arguments by the request's tools."""
    text = "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>1984</arg_value>\n</tool_call>"
    parser = ToolPlan("auto", True, [WEATHER_TOOL], True, "glm45").parser(_ids())
    assert parser.parse(text).tool_calls[0].arguments == '{"city": "1984"}'


def test_response_string_streams_decoded():
    parser = get_tool_parser("json_envelope")(_ids())
    pieces = ['{"resp', 'onse": "caf', '\\u00', 'e9 \\', 'n \\ud83d', '\\ude00', '!"}']
    assert [parser.feed(p).content for p in pieces] == ["", "caf", "", "é ", "\n ", "😀", "!"]
    assert parser.finish() == StreamDelta()


def test_stream_feed_of_nothing_and_finish_twice():
    parser = get_tool_parser("hermes")(_ids())
    assert parser.feed("") == StreamDelta()
    assert parser.feed("Hi <tool") == StreamDelta("Hi ")
    assert parser.finish() == StreamDelta("<tool")
    assert parser.finish() == StreamDelta()
    parser = get_tool_parser("hermes")(_ids())
    assert (parser.feed(" \n"), parser.finish(), parser.finish()) == (StreamDelta(), StreamDelta(" \n"), StreamDelta())


# --------------------------------------------------------------------------
# malformed output
# --------------------------------------------------------------------------

MALFORMED = {
    "hermes": ["<tool_call>not json</tool_call>", '<tool_call>{"arguments": {"a": 1}}</tool_call>',
               '<tool_call>{"name": 42, "arguments": {}}</tool_call>', '<tool_call>{"name": ""}</tool_call>', "<tool_call>", "Hi <tool_call",
               '<tool_call>{"name" "f"}</tool_call> and <tool_call>[1]</tool_call>'],
    "llama3_json": ['{"city": "Paris"}', '<|python_tag|>brave_search.call(query="x")', "{", '{"name": }'],
    "mistral": ["[TOOL_CALLS]", "[TOOL_CALLS][1, 2]", "[TOOL_CALLS]get weather[ARGS]{}", "[TOOL_CALLS][ARGS]{}"],
    "pythonic": ["[1, 2, 3]", '[print("hi")]', "[f(a=b)]", "[f(a=float('nan'))]", "[f(**x)]", "[f(a={1, 2})]",
                 "[f(a=1 b=2)]"],
    "granite": ["<|tool_call|>", "<|tool_call|>{}", '<|tool_call|>[{"name": 1}]'],
    "glm45": ["<tool_call>", "Hi <tool_call", "<tool_call>\n</tool_call>", "<tool_call>get weather\n</tool_call>",
              "<tool_call><arg_key>a</arg_key><arg_value>1</arg_value></tool_call>", "<tool_call>f"],
    "qwen3_coder": ["<tool_call>", "<tool_call>\nplain text\n</tool_call>", "<tool_call>\n<function>\n</function>",
                    "<tool_call>\n<function=get weather>\n</function>", "<tool_call>\n<function=f",
                    "<tool_call>\n<function=>\n</function>\n</tool_call>"],
    "gemma4": ["<|tool_call>", "Hi <|tool_call", "<|tool_call>call:", "<|tool_call>get_weather{}<tool_call|>",
               "<|tool_call>call:get weather{}<tool_call|>", "<|tool_call>call:f", "<|tool_call>call:{}<tool_call|>"],
    "openai": ["<|channel|>commentary", "Hi <|start|>assistant", "<|start|>assistant to=functions.f<|channel|>commentary"],
    "json_envelope": ['{"answer": 1}', '{"tool_calls": "x"}', '{"response": 3}', '{"response": "\\q"}', "[]",
                      '{"tool_calls": [{"arguments": {}}]}'],
}
MALFORMED_IDS = [(f, t) for f, texts in MALFORMED.items() for t in texts]


@pytest.mark.parametrize("family,text", MALFORMED_IDS)
def test_malformed_is_content(family, text):
    result = _parse(family, text)
    assert (result.content, result.tool_calls) == (text, [])
    deltas = _stream(family, _token_deltas(text, "qwen2"))
    assert "".join(d.content for d in deltas) == text and not any(d.tool_calls for d in deltas)


# output that breaks after a call's name: a stream had sent the call by then
BROKEN_AFTER_NAME = [("llama3_json", '{"name": "f", "parameters": {"a": 1}', '{"a": 1}'),
                     ("mistral", '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1', '{"a": 1'),
                     ("mistral", "[TOOL_CALLS]f[ARGS]{oops}", "{oops}"), ("pythonic", "[f(a=1, a=2)]", '{"a": 1'),
                     ("hermes", '<tool_call>{"name": "f", "arguments": {"a": 1}, "id" 3}</tool_call>', '{"a": 1}'),
                     ("glm45", "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n<arg_key>a</arg_key>\n"
                               "<arg_value>2</arg_value>\n</tool_call>", '{"a": 1'),
                     ("glm45", "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\nDone.", '{"a": 1'),
                     ("qwen3_coder", "<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n<parameter=a b>\n2\n"
                                     "</parameter>\n</function>\n</tool_call>", '{"a": 1'),
                     ("gemma4", "<|tool_call>call:f{a:1,b:oops}<tool_call|>", '{"a": 1'),
                     ("gemma4", "<|tool_call>call:f{a:1,a:2}<tool_call|>", '{"a": 1'),
                     ("gemma4", '<|tool_call>call:f{a:1 b:<|"|>x<|"|>}<tool_call|>', '{"a": 1'),
                     ("gemma4", "<|tool_call>call:f{oops}<tool_call|>", "")]


@pytest.mark.parametrize("family,text,arguments", BROKEN_AFTER_NAME)
def test_broken_after_the_name(family, text, arguments):
    """parse: content; a stream: the call as far as it went (what a grammar-constrained model never writes)."""
    result = _parse(family, text)
    assert (result.content, result.tool_calls) == (text, [])
    deltas = _stream(family, _token_deltas(text, "qwen2"))
    _check_shapes(deltas)
    [call] = _accumulate(deltas).tool_calls
    assert (call.function.name, call.function.arguments) == ("f", arguments)


@pytest.mark.parametrize("family,case", CASE_IDS, ids=[f"{f}-{c}" for f, c in CASE_IDS])
def test_every_truncation_is_handled(family, case):
    """A response cut anywhere (max_tokens): parse gives content and only calls that are whole; a stream
    cut there keeps the shape, and what it has of each call is the start of what the whole text gives."""
    text = CASES[family][case][0]
    whole = _parse(family, text).tool_calls
    for n in range(len(text)):
        result = _parse(family, text[:n])
        assert [(c.name, c.arguments) for c in result.tool_calls] == \
               [(c.name, c.arguments) for c in whole[:len(result.tool_calls)]]
    pieces = _token_deltas(text, "qwen2")
    for n in range(len(pieces)):
        deltas = _stream(family, pieces[:n])
        _check_shapes(deltas)
        message = _accumulate(deltas)
        for got, full in zip(message.tool_calls or (), whole):
            assert got.function.name == full.name and full.arguments.startswith(got.function.arguments)


@pytest.mark.parametrize("family", list(TOOL_PARSERS))
def test_random_text_never_raises(family):
    alphabet = ['{', '}', '[', ']', '"', ':', ',', ' ', '\n', 'a', '1', '\\', '(', ')', '=', ';', "'",
                '"name": "f"', '"arguments": ', '"parameters": ', '<tool_call>', '</tool_call>', '[TOOL_CALLS]',
                '[ARGS]', '<|python_tag|>', '<|tool_call|>', '"tool_calls": ', '"response": ', 'f(', 'x=1',
                '<arg_key>', '</arg_key>', '<arg_value>', '</arg_value>', '<function=', '<parameter=', '</parameter>',
                '</function>', '>', 'True', '<|tool_call>', 'call:', '<|"|>', '<tool_call|>', 'None']
    rng = random.Random(14)
    for _ in range(300):
        pieces = rng.choices(alphabet, k=rng.randrange(1, 30))
        text = "".join(pieces)
        result = _parse(family, text)
        for call in result.tool_calls:
            json.loads(call.arguments)
        deltas = _stream(family, pieces)
        _check_shapes(deltas)
        _accumulate(deltas)


# --------------------------------------------------------------------------
# registry and ids
# --------------------------------------------------------------------------


def test_registry_has_vllms_names():
    assert {"hermes", "llama3_json", "mistral", "pythonic", "glm45", "qwen3_coder", "gemma4"} <= set(TOOL_PARSERS)
    for name, cls in TOOL_PARSERS.items():
        assert get_tool_parser(name) is cls and cls.name == name
    with pytest.raises(ValueError, match="unknown tool call parser 'hermes2'; choose one of hermes, "):
        get_tool_parser("hermes2")


def test_default_ids_are_unique_within_a_response():
    text = CASES["hermes"]["parallel"][0]
    ids = [c.id for c in get_tool_parser("hermes")().parse(text).tool_calls]
    assert len(set(ids)) == 2 and all(i.startswith("call_") and len(i) == 29 for i in ids)
    assert new_call_id() != new_call_id()


def test_mistral_ids_are_what_its_templates_accept():
    ids = [c.id for c in get_tool_parser("mistral")().parse(CASES["mistral"]["parallel"][0]).tool_calls]
    assert len(set(ids)) == 2 and all(len(i) == 9 and i.isalnum() for i in ids)
    assert len(mistral_call_id()) == 9


def test_detect_none_without_template():
    assert detect_tool_parser(None) is None and detect_tool_parser("") is None
    assert detect_tool_parser("{% for m in messages %}{{ m.content }}{% endfor %}") is None
    assert detect_tool_parser("{{ oops") is None  # does not compile: no tools
