"""`pyserve serve --kv-cache-dir`: a conversation's prompt survives a server restart — the first request after
it reads the prompt's blocks back from disk (cached_tokens, /metrics) and says what a cold server says; a
prompt the client marks for reuse (Anthropic's cache_control, OpenAI's prompt_cache_key) is written through to
disk at once."""
import random

import httpx
import openai

from support.live_server import MODEL, Server, poll, stats


def ask(server, text: str):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)
    r = client.completions.create(model=MODEL, prompt=text, max_tokens=6, temperature=0)
    return r.choices[0].text, r.usage.prompt_tokens_details.cached_tokens, r.usage.prompt_tokens


def test_a_prompt_survives_a_restart(tmp_path):
    rng = random.Random(7)
    text = " ".join(f"w{rng.randrange(10**6)}" for _ in range(150))
    runs = []
    for _ in range(2):
        s = Server("--kv-cache-dir", str(tmp_path / "kv"), "--kv-cache-disk", "256M").wait_ready()
        try:
            runs.append(ask(s, text))
            runs[-1] += (stats(s),)
        finally:
            assert s.stop() == 0, "".join(s.stderr)[-3000:]  # a clean stop saves the cached blocks
    (first, cold, n, _), (second, cached, _, m) = runs
    assert cold == 0 and cached == (n - 1) // 16 * 16 and second == first
    assert m["kv_disk_hits_total"] == cached // 16 and m["kv_disk_bytes"] > 0 and m["kv_disk_blocks"] >= cached // 16
    assert list((tmp_path / "kv").glob("*.kvb"))


def test_cache_breakpoints_and_cache_keys_write_the_prompt_through(tmp_path):
    rng = random.Random(8)
    texts = [" ".join(f"w{rng.randrange(10**6)}" for _ in range(120)) for _ in range(3)]
    s = Server("--kv-cache-dir", str(tmp_path / "kv")).wait_ready()
    try:
        url = s.url
        plain = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": texts[0]}]}
        assert httpx.post(url + "/v1/messages", json=plain, timeout=60).status_code == 200
        assert stats(s)["kv_disk_written_bytes_total"] == 0  # no hint: nothing goes to disk before an eviction
        files = lambda: len(list((tmp_path / "kv").glob("*.kvb")))  # noqa: E731 - written by the tier's thread
        marked = {**plain, "messages": [{"role": "user", "content": [
            {"type": "text", "text": texts[1], "cache_control": {"type": "ephemeral"}}]}]}
        assert httpx.post(url + "/v1/messages", json=marked, timeout=60).status_code == 200
        first = poll(files, what="the marked prompt on disk")
        keyed = {"model": MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": texts[2]}],
                 "prompt_cache_key": "agent-7"}
        assert httpx.post(url + "/v1/chat/completions", json=keyed, timeout=60).status_code == 200
        poll(lambda: files() > first, what="the keyed prompt on disk")
    finally:
        assert s.stop() == 0, "".join(s.stderr)[-3000:]
