"""Tenants do not share what they should not: with several API keys each key's prompts are cached for it alone
(unless --shared-prefix-cache), and a request's cache_salt (vLLM's) keeps its prompts apart within a key. A
prefix-cache hit is visible in time to first token, so a shared cache would let one client probe another's
prompts; `usage.prompt_tokens_details.cached_tokens` shows what was reused."""
import random

import httpx
import openai
import pytest

from support.live_server import MODEL, Server


def _server(*extra):
    s = Server("--api-key", "key-one", "--api-key", "key-two", *extra).wait_ready()
    return s


@pytest.fixture(scope="module")
def keyed():
    s = _server()
    yield s
    assert s.stop() == 0, "".join(s.stderr)[-3000:]


def prompt(seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(f"w{rng.randrange(10**6)}" for _ in range(60))


def cached(server, key: str, text: str, **extra) -> tuple[int, str]:
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0)
    r = client.completions.create(model=MODEL, prompt=text, max_tokens=4, temperature=0, extra_body=extra)
    return r.usage.prompt_tokens_details.cached_tokens, r.choices[0].text


def test_each_key_caches_its_own_prompts(keyed):
    text = prompt(1)
    runs = [cached(keyed, key, text) for key in ("key-one", "key-two", "key-one", "key-two")]
    hits = [c for c, _ in runs]
    assert hits[:2] == [0, 0] and hits[2] > 0 and hits[3] == hits[2]
    assert len({t for _, t in runs}) == 1


def test_a_cache_salt_is_a_cache_of_its_own_within_a_key(keyed):
    text = prompt(2)
    hits = [cached(keyed, key, text, cache_salt=salt)[0]
            for key, salt in (("key-one", "s1"), ("key-one", "s2"), ("key-one", "s1"), ("key-two", "s1"))]
    assert hits[:2] == [0, 0] and hits[2] > 0 and hits[3] == 0


def test_anthropic_requests_are_their_keys_too(keyed):
    body = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": prompt(3)}]}
    reads = [httpx.post(keyed.url + "/v1/messages", json=body, headers={"x-api-key": key}, timeout=60)
             .json()["usage"]["cache_read_input_tokens"] for key in ("key-one", "key-two", "key-two")]
    assert reads[:2] == [0, 0] and reads[2] > 0


def test_a_shared_prefix_cache_is_shared_across_keys():
    s = _server("--shared-prefix-cache")
    try:
        text = prompt(4)
        hits = [cached(s, key, text)[0] for key in ("key-one", "key-two")]
        salted = [cached(s, key, text, cache_salt="mine")[0] for key in ("key-one", "key-two")]
    finally:
        assert s.stop() == 0, "".join(s.stderr)[-3000:]
    assert hits[0] == 0 and hits[1] > 0
    assert salted[0] == 0 and salted[1] > 0  # one salt across keys: the keys share it
