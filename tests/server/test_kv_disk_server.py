"""`pyserve serve --kv-cache-dir`: a conversation's prompt survives a server restart — the first request after
it reads the prompt's blocks back from disk (cached_tokens, /metrics) and says what a cold server says."""
import random

import openai

from support.live_server import MODEL, Server, stats


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
