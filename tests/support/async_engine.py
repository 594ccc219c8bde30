"""What tests of AsyncLLM wait for: an engine that holds nothing (bounded polling of its stats)."""
from __future__ import annotations

import trio


async def settled(engine, max_polls=1000):
    """Polls (bounded) until the engine holds nothing; returns the stats."""
    for _ in range(max_polls):
        s = engine.stats()
        if (s["blocks_used"], s["running"], s["waiting"], s["streams"]) == (0, 0, 0, 0):
            return s
        await trio.sleep(0.01)
    raise AssertionError(f"the engine did not settle: {engine.stats()}")
