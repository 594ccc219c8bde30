"""Speculative decoding over HTTP: `pyserve serve` drafts by default (its step-time target aside), answers exactly as with
`--speculative-ngram 0` (the openai SDK, streamed and not, logprobs included), and counts drafted and
accepted tokens in /metrics under vLLM's names; a bad value of the flag is a usage error."""
from __future__ import annotations

import os
import subprocess
import sys

import httpx
import openai
import pytest

from pyserve.bench.launch import PYSERVE_HOME, ServerProcess
from pyserve.bench.prometheus import parse_metrics, total

RECORD = "Name: Ada Lovelace\nBorn: 10 December 1815\nCity: London\nKnown for: the first computer program\n"
PROMPTS = ["Record:\n" + RECORD + "\nThe record again, word for word:\n",
           "Settings:\nhost = localhost\nport = 8080\nworkers = 4\n\nThe same settings:\nhost ="]


@pytest.fixture(scope="module")
def server():
    """The default server but for its step-time target: on a loaded machine a decode step alone can take longer
    than the default 20 ms target, which then leaves no time for drafted rows (by design); without the target
    only the drafted rows' own price decides, and on these grounded prompts they pay on any machine."""
    s = ServerProcess("--target-itl", "0").wait_ready()
    yield s
    assert s.stop() == 0, "".join(s.stderr)


@pytest.fixture(scope="module")
def plain():
    s = ServerProcess("--speculative-ngram", "0").wait_ready()
    yield s
    assert s.stop() == 0, "".join(s.stderr)


def sdk(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def spec_counters(server) -> tuple[float, float, float]:
    samples, types = parse_metrics(httpx.get(server.url + "/metrics").text)
    assert types["pyserve:spec_decode_num_draft_tokens"] == "counter"
    return (total(samples, "pyserve:spec_decode_num_draft_tokens_total"),
            total(samples, "pyserve:spec_decode_num_accepted_tokens_total"),
            total(samples, "pyserve:spec_decode_draft_acceptance_rate"))


def completion(server, prompt: str, stream: bool):
    c = sdk(server).completions.create(model=server.model, prompt=prompt, max_tokens=60, temperature=0,
                                       logprobs=2, stream=stream)
    if not stream:
        ch = c.choices[0]
        return ch.text, ch.logprobs.tokens, ch.logprobs.token_logprobs, ch.finish_reason
    text, tokens, lps, reason = "", [], [], None
    for chunk in c:
        for ch in chunk.choices:
            text += ch.text
            if ch.logprobs:
                tokens += ch.logprobs.tokens
                lps += ch.logprobs.token_logprobs
            reason = ch.finish_reason or reason
    return text, tokens, lps, reason


def test_default_server_drafts_and_answers_as_without(server, plain):
    drafted0, accepted0, _ = spec_counters(server)
    for p in PROMPTS:
        for stream in (False, True):
            assert completion(server, p, stream) == completion(plain, p, stream)
    drafted, accepted, rate = spec_counters(server)
    # how much is drafted hangs on the forward times this machine measures (the pricing's claims are held on a
    # fixed cost model in test_spec_decode.py); that these grounded prompts draft at all does not
    assert drafted > drafted0 and accepted > accepted0
    assert 0 < rate <= 1 and rate == pytest.approx(accepted / drafted)
    assert spec_counters(plain)[:2] == (0, 0)


def test_chat_with_sampling_and_a_seed_is_the_same(server, plain):
    def chat(s):
        r = sdk(s).chat.completions.create(model=s.model, messages=[{"role": "user", "content": PROMPTS[0]}],
                                           max_tokens=48, temperature=0.8, seed=5, n=2)
        return [c.message.content for c in r.choices]
    assert chat(server) == chat(plain)


@pytest.mark.parametrize("flag,value,says", [("--speculative-ngram", "-1", "integer >= 0"),
                                             ("--speculative-ngram", "x", "an integer"),
                                             ("--speculative-config", '{"method": "eagle"}', "only 'ngram'"),
                                             ("--speculative-config", "{not json", "Expecting")])
def test_a_bad_value_is_a_usage_error(flag, value, says):
    env = dict(os.environ, PYTHONPATH=PYSERVE_HOME)  # the pyserve these tests import, built or installed
    r = subprocess.run([sys.executable, "-m", "pyserve", "serve", flag, value], capture_output=True, text=True,
                       env=env, cwd=PYSERVE_HOME, timeout=60)
    assert r.returncode == 2 and flag in r.stderr and says in r.stderr
