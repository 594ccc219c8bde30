"""The chat-template cases of tests/data/chat_templates (rendered by Hugging Face transformers: origin in
tests/data/README.md): each a template, a conversation and the exact string (or error) expected."""
from __future__ import annotations

import json

from .paths import DATA

# a path of its own rather than the data_dir fixture: the cases parametrize tests at collection time
FIXTURES = [DATA / "chat_templates" / name for name in ("cases.jsonl", "tool_families.jsonl")]
TEMPLATE_ERROR = "jinja2.exceptions.TemplateError"


def _load_cases() -> list[dict]:
    cases = []
    for path in FIXTURES:
        with path.open(encoding="utf-8") as f:
            cases += [json.loads(line) for line in f if line.strip()]
    return cases


CASES = _load_cases()
