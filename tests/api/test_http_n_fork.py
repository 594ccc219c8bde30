"""HTTP n > 1 goes through the engine's fork: n samples cost one prompt of KV and one prefill, whatever the
prompt length (the server in-process on a loopback port, the real model, httpx as the client)."""
from __future__ import annotations

import json
import random
from functools import partial

import httpx
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

import pyserve
from pyserve.engine.async_llm import AsyncLLM

N, MAX_TOKENS, PROMPT_LEN, BLOCK = 4, 8, 1000, 16  # 62 full blocks of 16 and 8 tokens in a 63rd


async def _serving(llm, body_of_test):
    async with AsyncLLM.open(llm) as engine:
        cfg = Config()
        cfg.bind, cfg.accesslog = ["127.0.0.1:0"], None
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(partial(serve, pyserve.create_app(engine), cfg, shutdown_trigger=stop.wait))
            async with httpx.AsyncClient(base_url=binds[0], timeout=60) as http:
                await body_of_test(engine, http)
            stop.set()


def _prompt(seed: int) -> list[int]:
    rng = random.Random(seed)  # token ids no other test sends: the prefix cache cannot serve them
    return [2] + [rng.randrange(1000, 200000) for _ in range(PROMPT_LEN - 1)]


async def test_streamed_n4_shares_one_prompt_of_kv(llm):
    async def body(engine, http):
        before = engine.stats()["tokens_computed"]
        seen = []
        req = {"prompt": _prompt(1), "n": N, "max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0.8,
               "seed": 3, "stream": True, "stream_options": {"include_usage": True}}
        async with http.stream("POST", "/v1/completions", json=req) as r:
            assert r.status_code == 200
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    seen.append(engine.stats()["blocks_used"])
                    chunk = json.loads(line[6:])
        # the samples hold the 62 shared full blocks and one copy each of the partial 63rd, never 4 prompts
        assert max(seen) == PROMPT_LEN // BLOCK + N, seen
        # one prefill of the prompt, then each sample's 7 decode steps (its first token came from the prefill)
        assert engine.stats()["tokens_computed"] - before == PROMPT_LEN + N * (MAX_TOKENS - 1)
        assert chunk["usage"]["prompt_tokens"] == PROMPT_LEN and chunk["usage"]["completion_tokens"] == N * MAX_TOKENS
        assert engine.stats()["blocks_used"] == 0

    with trio.fail_after(120):
        await _serving(llm, body)


async def test_chat_n3_prefills_once_and_seeds_each_choice(llm):
    async def body(engine, http):
        before = engine.stats()["tokens_computed"]
        req = {"messages": [{"role": "user", "content": "Name a colour."}], "n": 3, "max_tokens": 6,
               "ignore_eos": True, "temperature": 1.0, "seed": 11}
        r = await http.post("/v1/chat/completions", json=req)
        assert r.status_code == 200, r.text
        out = r.json()
        n_prompt = out["usage"]["prompt_tokens"]
        assert sorted(c["index"] for c in out["choices"]) == [0, 1, 2]
        assert engine.stats()["tokens_computed"] - before == n_prompt + 3 * 5
        # choice i is sampled with seed + i, as a request of n=1 with that seed
        for i, choice in enumerate(sorted(out["choices"], key=lambda c: c["index"])):
            one = (await http.post("/v1/chat/completions", json=dict(req, n=1, seed=11 + i))).json()
            assert one["choices"][0]["message"]["content"] == choice["message"]["content"]

    with trio.fail_after(120):
        await _serving(llm, body)
