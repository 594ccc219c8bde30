"""The embedding API: `pyserve.create_app(engine)` around an AsyncLLM the caller opened, served in-process by
Hypercorn's trio worker."""
from __future__ import annotations

from functools import partial

import httpx
import trio
from hypercorn.config import Config
from hypercorn.trio import serve

import pyserve
from pyserve.engine.async_llm import AsyncLLM


async def test_create_app_in_process():
    async with AsyncLLM.open(None, n_threads=2) as engine:
        app = pyserve.create_app(engine)
        cfg = Config()
        cfg.bind = ["127.0.0.1:0"]
        cfg.accesslog = None
        stop = trio.Event()
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(partial(serve, app, cfg, shutdown_trigger=stop.wait))
            async with httpx.AsyncClient(base_url=binds[0], timeout=30) as http:
                assert (await http.get("/health")).status_code == 200
                r = await http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}],
                                                                   "max_tokens": 3, "temperature": 0})
                assert r.status_code == 200, r.text
                body = r.json()
                assert body["choices"][0]["message"]["role"] == "assistant"
                assert body["usage"]["completion_tokens"] == 3
                # a streamed request cancelled from the client side leaves nothing behind in the engine
                async with http.stream("POST", "/v1/completions", json={"prompt": "Hi", "max_tokens": 500,
                                                                        "ignore_eos": True, "stream": True}) as s:
                    async for line in s.aiter_lines():
                        if line.startswith("data: {"):
                            break
                with trio.fail_after(5):
                    while engine.stats()["blocks_used"]:
                        await trio.sleep(0.01)
            stop.set()
