"""SIGTERM with 32 streams in flight: every stream ends with a final chunk and [DONE] within the drain
timeout, no KV block is left in use, the process exits 0.

A real `pyserve serve` process (the default model) on a loopback port, --drain-timeout 3. Half the streams
are short (they may finish inside the drain: a finish_reason chunk), half are long (cut at the deadline:
the "server shutting down" error chunk), on both endpoints.
"""
from __future__ import annotations

import json
import signal
import time

import httpx
import trio

from support.live_server import CHAT, Server

DRAIN = 3.0
N_STREAMS = 32


def final_chunk_ok(event) -> bool:
    if not isinstance(event, dict):
        return False
    if "error" in event:
        return event["error"]["message"] == "server shutting down"
    choices = event.get("choices") or []
    return bool(choices) and choices[-1].get("finish_reason") is not None


def test_sigterm_with_32_streams():
    srv = Server("--drain-timeout", str(DRAIN), "--max-num-seqs", "64")
    try:
        srv.wait_ready()
        events: dict[int, list] = {i: [] for i in range(N_STREAMS)}
        ended: dict[int, float] = {}
        errors: dict[int, str] = {}
        t_signal: list[float] = []
        after_signal: dict = {}

        async def main():
            started = trio.Event()
            first_seen: set[int] = set()
            limits = httpx.Limits(max_connections=N_STREAMS + 4, max_keepalive_connections=0)
            async with httpx.AsyncClient(base_url=srv.url, timeout=60, limits=limits) as http:
                async def one(i: int):
                    long = i % 2 == 0
                    body = {"max_tokens": 4000 if long else 8, "temperature": 0.7, "seed": i, "stream": True,
                            "ignore_eos": long}
                    if i % 4 < 2:
                        path, body = "/v1/completions", dict(body, prompt=f"Story number {i}: once upon a time")
                    else:
                        path, body = "/v1/chat/completions", dict(body, messages=CHAT)
                    try:
                        async with http.stream("POST", path, json=body) as r:
                            assert r.status_code == 200, await r.aread()
                            async for line in r.aiter_lines():
                                if not line.startswith("data: "):
                                    continue
                                payload = line[6:]
                                events[i].append(payload if payload == "[DONE]" else json.loads(payload))
                                if i not in first_seen and payload != "[DONE]":
                                    first_seen.add(i)
                                    if len(first_seen) == N_STREAMS:
                                        started.set()
                    except Exception as e:  # noqa: BLE001 - recorded, asserted below
                        errors[i] = f"{type(e).__name__}: {e}"
                    ended[i] = time.monotonic()

                async with trio.open_nursery() as nursery:
                    for i in range(N_STREAMS):
                        nursery.start_soon(one, i)
                    with trio.fail_after(120):
                        await started.wait()
                    srv.proc.send_signal(signal.SIGTERM)
                    t_signal.append(time.monotonic())
                    # the server logs this line in the same step that makes it refuse new requests
                    with trio.fail_after(10):
                        while not any("SIGTERM: draining" in line for line in srv.stderr):
                            await trio.sleep(0.01)
                    # a new request during the drain: 503, not queued
                    try:
                        r = await http.post("/v1/completions", json={"prompt": "late", "max_tokens": 2})
                        after_signal["status"] = r.status_code
                    except httpx.HTTPError as e:  # the listener may already be closed
                        after_signal["status"] = f"{type(e).__name__}"

        trio.run(main)
        assert not errors, errors
        for i, ev in events.items():
            assert ev and ev[-1] == "[DONE]", (i, ev[-3:])
            assert ev.count("[DONE]") == 1, i
            assert len(ev) >= 2 and final_chunk_ok(ev[-2]), (i, ev[-2])
            assert ended[i] - t_signal[0] < DRAIN + 2.0, (i, ended[i] - t_signal[0])
        cut = [i for i, ev in events.items() if "error" in ev[-2]]
        assert set(range(0, N_STREAMS, 2)) <= set(cut), cut  # the long ones ran to the deadline
        last = max(ended.values()) - t_signal[0]
        print(f"{N_STREAMS} streams: {N_STREAMS - len(cut)} finished, {len(cut)} cut at the deadline; "
              f"last [DONE] {last:.2f} s after SIGTERM (drain {DRAIN} s)")
        assert after_signal["status"] in (503, "ConnectError", "RemoteProtocolError"), after_signal
        code = srv.proc.wait(DRAIN + 20)
        log = "".join(srv.stderr)
        assert code == 0, log
        assert "engine stopped: 0 running, 0 waiting, 0 kv blocks in use" in log, log[-3000:]
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()
            srv.proc.wait()
