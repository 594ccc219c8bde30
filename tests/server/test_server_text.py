"""Text over the wire: streamed deltas concatenate to the non-streamed text byte for byte (emoji, CJK,
accents), and stop strings that straddle tokens never leak into the stream."""
import json

import httpx
import pytest

from support.live_server import Server

# Prompts whose greedy continuations (llama.cpp's reference) hold CJK, emoji and accented text.
PROMPTS = [
    "她说：“我们明天",                              # CJK
    "My favourite emojis are 😀, 🎉 and",          # emoji, some split over byte-fallback tokens
    "Le café où j'ai rencontré ma sœur était",      # accents
]


@pytest.fixture(scope="module")
def server():
    s = Server().wait_ready()
    yield s
    assert s.stop() == 0, "".join(s.stderr)


def complete(url: str, **body) -> dict:
    r = httpx.post(url + "/v1/completions", json={"temperature": 0, "max_tokens": 40, **body}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def stream_text(url: str, **body) -> tuple[str, list[str], str]:
    deltas, finish = [], None
    with httpx.stream("POST", url + "/v1/completions", timeout=120,
                      json={"temperature": 0, "max_tokens": 40, "stream": True, **body}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            ev = json.loads(line[6:])
            for ch in ev["choices"]:
                deltas.append(ch["text"])
                finish = ch["finish_reason"] or finish
    return "".join(deltas), deltas, finish


@pytest.mark.parametrize("prompt", PROMPTS)
def test_stream_concatenation_equals_full_text(server, prompt):
    full = complete(server.url, prompt=prompt)["choices"][0]["text"]
    streamed, deltas, _ = stream_text(server.url, prompt=prompt)
    assert streamed.encode() == full.encode()
    assert all("\ufffd" not in d for d in deltas) or "\ufffd" in full  # never half a character on the wire
    assert any(ord(c) > 127 for c in full)  # the case really exercises non-ASCII text


def test_stop_string_straddling_tokens_never_streamed(server):
    prompt = "Once upon a time, in a small village at the edge of a great forest, there lived"
    full = complete(server.url, prompt=prompt, ignore_eos=True)["choices"][0]["text"]
    stop = full[10:17]  # seven characters: in this text they span token boundaries
    streamed, deltas, finish = stream_text(server.url, prompt=prompt, stop=[stop], ignore_eos=True)
    assert streamed == full[: full.index(stop)]
    assert finish == "stop"
    assert stop not in "".join(deltas)
    plain = complete(server.url, prompt=prompt, stop=[stop], ignore_eos=True)["choices"][0]
    assert plain["text"] == streamed and plain["finish_reason"] == "stop"


def test_usage_reports_prefix_cache_hits(server):
    prompt = "The history of the city begins with " + "a long and winding account, " * 12
    cold = complete(server.url, prompt=prompt, max_tokens=2)["usage"]
    warm = complete(server.url, prompt=prompt, max_tokens=2)["usage"]
    assert cold["prompt_tokens"] == warm["prompt_tokens"] > 48
    assert cold["prompt_tokens_details"]["cached_tokens"] == 0
    # every full 16-token block but the one holding the last prompt token comes from the cache
    assert warm["prompt_tokens_details"]["cached_tokens"] == (warm["prompt_tokens"] - 1) // 16 * 16
