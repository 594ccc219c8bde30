"""Writes tests/data/chat_templates/tool_families.jsonl: the tool-calling conversations of cases.jsonl (its
f_tools_list and f_tools_roundtrip, and a roundtrip with typed arguments) rendered by Hugging Face transformers
for the templates in tests/data/chat_templates/templates/, in cases.jsonl's fields.

A reference-data script, not a test: it needs transformers (5.24.0 made the file) and jinja2 (3.1.6), which
pyserve does not depend on; run it in a virtual environment of its own:

    python -m venv /tmp/tf && /tmp/tf/bin/pip install transformers==5.24.0 jinja2==3.1.6
    /tmp/tf/bin/python scripts/render_template_cases.py
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

from transformers.utils.chat_template_utils import render_jinja_template

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "chat_templates"
_LLAMA_CPP = ("ggml-org/llama.cpp models/templates/{file}, as vendored byte for byte in the llama-cpp-python 0.3.36 "
              "source package on PyPI (vendor/llama.cpp/models/templates/{file}, git blob {blob})")
# family -> (template file, where llama.cpp's copy says it is from, bos_token, eos_token)
FAMILIES = {
    "glm-4.6": ("GLM-4.6.jinja", "4a09db53c8ade84034d943e4ca36d89f16f938e8", None, "<|endoftext|>"),
    "glm-4.7-flash": ("GLM-4.7-Flash.jinja", "2ab98ef068d62829d17c5ade1827b9f013fa2bbf", None, "<|endoftext|>"),
    "qwen3-coder": ("Qwen3-Coder.jinja", "cde8c0e43db214322881e24a01c90aa8c77860c7", None, "<|im_end|>"),
    "qwen3.5": ("Qwen3.5-4B.jinja", "a585dec894e63da457d9440ec6aa7caa16d20860", None, "<|im_end|>"),
    "gemma-4": ("google-gemma-4-31B-it.jinja", "98da08eb6be6f7a353d390456a6c4cacf811c9ed", "<bos>", "<eos>"),
}
FORECAST = {"type": "function", "function": {
    "name": "get_forecast", "description": "The weather forecast for a location, by day.",
    "parameters": {"type": "object", "properties": {
        "location": {"type": "string", "description": "City and country, e.g. 'Paris, France'"},
        "days": {"type": "integer", "description": "How many days, 1 to 7."},
        "hourly": {"type": "boolean", "description": "Hour by hour."}}, "required": ["location", "days"]}}}


def _conversations() -> dict[str, tuple[list, list]]:
    """conversation name -> (messages, tools): cases.jsonl's own, and a typed variant of its roundtrip."""
    rows = {json.loads(line)["case"]: json.loads(line) for line in (DATA / "cases.jsonl").open(encoding="utf-8")}
    listing, roundtrip = rows["qwen3/f_tools_list"], rows["qwen3/f_tools_roundtrip"]
    typed = copy.deepcopy(roundtrip["messages"])
    typed[1]["tool_calls"][0]["function"] = {"name": "get_forecast",
                                             "arguments": {"location": "Paris, France", "days": 3, "hourly": True}}
    typed[2]["name"] = "get_forecast"
    return {"f_tools_list": (listing["messages"], listing["tools"]),
            "f_tools_roundtrip": (roundtrip["messages"], roundtrip["tools"]),
            "f_tools_roundtrip_typed": (typed, [FORECAST])}


def _case(family: str, conversation: str, messages: list, tools: list) -> dict:
    file, blob, bos, eos = FAMILIES[family]
    template = (DATA / "templates" / file).read_text(encoding="utf-8")
    specials = {k: v for k, v in (("bos_token", bos), ("eos_token", eos)) if v is not None}
    expected = render_jinja_template(conversations=[messages], tools=tools, chat_template=template,
                                     add_generation_prompt=True, **specials)[0][0]
    return {"family": family, "case": f"{family}/{conversation}",
            "template_source": _LLAMA_CPP.format(file=file, blob=blob), "template": template,
            "bos_token": bos, "eos_token": eos, "messages": messages, "tools": tools,
            "add_generation_prompt": True, "now": None, "expected": expected, "expected_error": None,
            "expected_error_type": None}


def main() -> None:
    with (DATA / "tool_families.jsonl").open("w", encoding="utf-8") as out:
        for family in FAMILIES:
            for conversation, (messages, tools) in _conversations().items():
                out.write(json.dumps(_case(family, conversation, messages, tools), ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
