"""A streamed /v1/completions read chunk by chunk: its text and its logprobs' lists joined (for tests that
hold the streamed form to the whole one)."""
from __future__ import annotations

import json

import httpx


def streamed_logprobs(server, body: dict, timeout: float = 120) -> tuple[str, dict]:
    text, lp = "", {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    with httpx.stream("POST", server.url + "/v1/completions", json=dict(body, stream=True), timeout=timeout) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choice = json.loads(line[6:])["choices"][0]
                text += choice["text"]
                for k in lp:
                    lp[k] += (choice["logprobs"] or {}).get(k, [])
    return text, lp
