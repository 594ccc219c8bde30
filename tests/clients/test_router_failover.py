"""Failover behind `pyserve router` (sglang-router 0.3.2 with pyserve's defaults: cache_aware, health checks
every 2 s, retries, circuit breakers; pyserve/server/router_launch.py): two real replicas, a real router, real
streams on loopback ports.

What the router does when a replica dies under a stream (seen here, and in its source): it has forwarded the
replica's chunks as they came; when the replica's connection breaks it ends the client's response at once,
without the chunked body's last chunk, so the client's HTTP library reports an incomplete body
(httpx.RemoteProtocolError) -- no error chunk, no [DONE] (the router writes none), and never a hang. It does
not replay the stream elsewhere. Requests that had not started go to the other replica: a refused connection
is retried, and the router stops choosing the dead replica once 2 health checks fail.
"""
from __future__ import annotations

import json
import signal
import sys
import time

import httpx
import pytest
import trio

from pyserve.bench.launch import ServerProcess
from support.live_server import MODEL
from support.paths import SCRIPTS

sys.path.insert(0, str(SCRIPTS))
import router_traffic as rt

STREAMS, NEW_REQUESTS = 4, 6


@pytest.fixture(autouse=True)
def _router_installed():
    if not rt.router_installed():
        pytest.fail(rt.ROUTER_MISSING)


class Stream:
    """One streamed completion through the router: chunks seen, how it ended, when."""

    def __init__(self, i: int, max_tokens: int):
        self.body = {"model": MODEL, "prompt": f"Story number {i}: once upon a time", "max_tokens": max_tokens,
                     "ignore_eos": True, "stream": True}
        self.first = trio.Event()
        self.chunks, self.done, self.finish, self.error, self.ended = 0, False, None, None, None

    async def run(self, client: httpx.AsyncClient, url: str) -> None:
        try:
            async with client.stream("POST", url + "/v1/completions", json=self.body) as r:
                assert r.status_code == 200, await r.aread()
                async for line in r.aiter_lines():
                    self._line(line)
        except httpx.HTTPError as e:
            self.error = type(e).__name__
        self.ended = time.monotonic()

    def _line(self, line: str) -> None:
        if line == "data: [DONE]":
            self.done = True
        elif line.startswith("data: "):
            self.chunks += 1
            self.finish = json.loads(line[6:])["choices"][0]["finish_reason"] or self.finish
            self.first.set()


async def _poll(fetch, ok, timeout: float):
    """await fetch() every 100 ms until ok(value), for at most `timeout` s (then trio.TooSlowError)."""
    with trio.fail_after(timeout):
        while not ok(value := await fetch()):
            await trio.sleep(0.1)
    return value


async def _running(client: httpx.AsyncClient, replica: ServerProcess) -> int:
    return (await client.get(replica.url + "/get_load")).json()[0]["num_reqs"]


async def _health(client: httpx.AsyncClient, router: "rt.RouterProcess") -> dict[str, bool]:
    return {w["url"]: w["is_healthy"] for w in (await client.get(router.url + "/workers")).json()["workers"]}


async def _complete(client: httpx.AsyncClient, url: str, prompt: str) -> tuple[int, str]:
    r = await client.post(url + "/v1/completions", json={"model": MODEL, "prompt": prompt, "max_tokens": 8,
                                                         "temperature": 0})
    return r.status_code, r.json()["choices"][0]["text"] if r.status_code == 200 else r.text


async def _streams_on_both(client, d, streams, nursery, held: tuple = (0, 0)) -> list[int]:
    """Starts the streams; once all have a first chunk, how many each replica runs (beyond `held`, streams
    sent to it directly), asserting both run some."""
    for s in streams:
        nursery.start_soon(s.run, client, d.router.url)
    with trio.fail_after(60):
        for s in streams:
            await s.first.wait()
    counts = [await _running(client, r) - h for r, h in zip(d.replicas, held)]
    assert sum(counts) == len(streams) and min(counts) >= 1, counts  # cache_aware spread distinct prompts
    return counts


async def _new_requests(client, url: str, prompts: list[str], refs: dict) -> list:
    """The prompts at once; (status, whether the text is the reference) for each."""
    results = [None] * len(prompts)

    async def one(i: int) -> None:
        status, text = await _complete(client, url, prompts[i])
        results[i] = (status, text == refs[prompts[i]])

    async with trio.open_nursery() as n:
        for i in range(len(prompts)):
            n.start_soon(one, i)
    return results


def _prompts(streams: list[Stream]) -> list[str]:
    """Each stream's prompt again (the router's tree sends some to the replica about to fail) and new ones."""
    return [s.body["prompt"] for s in streams] + [f"Question {j}: why is the sky blue?" for j in range(2)]


async def _references(client, url: str, prompts: list[str]) -> dict[str, str]:
    return {p: (await _complete(client, url, p))[1] for p in prompts}


async def _bounded(scenario, d: "rt.Deployment") -> dict:
    with trio.fail_after(180):  # a stream the router left hanging would end the test here
        return await scenario(d)


async def _kill_scenario(d: "rt.Deployment") -> dict:
    out: dict = {}
    streams = [Stream(i, 400) for i in range(STREAMS)]
    async with httpx.AsyncClient(timeout=httpx.Timeout(60, read=30)) as client:
        refs = await _references(client, d.replicas[0].url, _prompts(streams))
        async with trio.open_nursery() as nursery:
            out["counts"] = await _streams_on_both(client, d, streams, nursery)
            d.replicas[1].proc.send_signal(signal.SIGKILL)
            out["killed_at"] = time.monotonic()
            out["new"] = await _new_requests(client, d.router.url, _prompts(streams), refs)
        out["streams"] = streams
        dead = d.replicas[1].url
        out["marked_out"] = await _poll(lambda: _health(client, d.router), lambda h: not h[dead], 15)
    return out


async def _rejoin(d: "rt.Deployment", port: int) -> int:
    """Restarts replica 1 on its port, then sends pairs of concurrent requests with unrelated prompts until it
    serves one, for at most 40 s (its circuit breaker may keep it out for 10 s after the attempts that failed
    at the kill); the pairs it took. In pairs: cache_aware sends a prompt it has no prefix for to the least
    loaded replica, the first of its registry on a tie, so one request at a time would all go to one replica
    (and the killed replica's entries in its cache tree are gone: the cut streams' prompts, sent again one at
    a time, all went to the other replica here)."""
    d.replicas[1] = ServerProcess("--port", str(port), threads=1).wait_ready()
    back = d.replicas[1]
    async with httpx.AsyncClient(timeout=60) as client:
        await _poll(lambda: _health(client, d.router), lambda h: h[back.url], 30)
        with trio.fail_after(40):
            for j in range(200):
                async with trio.open_nursery() as pair:
                    for k in range(2):
                        pair.start_soon(_complete, client, d.router.url, f"{chr(65 + (2 * j + k) % 26)}{j} came back")
                if (await rt.settle(back.url)).get("request_success_total", 0):
                    return j + 1
    raise AssertionError("the returned replica served none of 400 requests")


def test_replica_killed_mid_traffic():
    """SIGKILL one of two replicas under 4 streams: its streams end at once with an incomplete body (never a
    hang, never replayed), the others finish; requests sent just after the kill (including prompts the router's
    cache tree places on the dead replica) all get 200 with the right text from the other; the router marks
    the dead one out, and takes it back once it is restarted on its port."""
    with rt.Deployment(policy="cache_aware") as d:
        port = d.replicas[1].port
        out = trio.run(_bounded, _kill_scenario, d)
        cut = [s for s in out["streams"] if s.error]
        assert len(cut) == out["counts"][1], (out["counts"], [vars(s) for s in out["streams"]])
        assert all(s.error == "RemoteProtocolError" and s.chunks >= 1 and not s.done for s in cut)
        assert all(s.ended - out["killed_at"] < 10 for s in cut)  # at once, not at a timeout
        assert all(s.done and s.finish == "length" for s in out["streams"] if not s.error), \
            [vars(s) for s in out["streams"]]
        assert out["new"] == [(200, True)] * NEW_REQUESTS, (out["new"], d.router.log_tail())
        assert d.replicas[1].stop() == -signal.SIGKILL and rt.replica_down(d.replicas[0]) is None
        trio.run(_rejoin, d, port)  # raises unless it serves within 40 s
        assert d.stop() == [0, 0]


async def _hold(client, url: str, held: trio.CancelScope, task_status=trio.TASK_STATUS_IGNORED) -> None:
    """A long stream straight to a replica, until `held` is cancelled (it keeps that replica's drain going)."""
    body = {"prompt": "A very long story", "max_tokens": 4000, "ignore_eos": True, "stream": True}
    with held:
        async with client.stream("POST", url + "/v1/completions", json=body) as r:
            started = False
            async for line in r.aiter_lines():
                if not started and line.startswith("data: "):
                    task_status.started()
                    started = True


async def _drain_scenario(d: "rt.Deployment") -> dict:
    out: dict = {}
    streams = [Stream(i, 200) for i in range(STREAMS)]
    leaving = d.replicas[1]
    async with httpx.AsyncClient(timeout=httpx.Timeout(60, read=60)) as client:
        refs = await _references(client, d.replicas[0].url, _prompts(streams))
        async with trio.open_nursery() as nursery:
            held = trio.CancelScope()
            await nursery.start(_hold, client, leaving.url, held)
            out["counts"] = await _streams_on_both(client, d, streams, nursery, held=(0, 1))
            leaving.proc.send_signal(signal.SIGTERM)
            out["new"] = await _new_requests(client, d.router.url, _prompts(streams), refs)
            await _poll(lambda: _health(client, d.router), lambda h: not h[leaving.url], 15)
            out["alive_when_out"] = leaving.proc.poll() is None
            out["health_then"] = (await client.get(leaving.url + "/health")).json()
            held.cancel()
        out["streams"] = streams
    return out


def test_sigterm_leaves_rotation_before_drain_ends():
    """SIGTERM on one of two replicas under 4 streams (a fifth, straight to it, holds its drain open): the
    router marks it out while it still runs (its /health answers 503 'shutting down'), requests sent meanwhile
    all get 200 with the right text, every stream through the router finishes with [DONE], and the replica
    exits 0 when its drain ends."""
    with rt.Deployment(policy="cache_aware", server_args=("--drain-timeout", "60")) as d:
        out = trio.run(_bounded, _drain_scenario, d)
        assert out["alive_when_out"] and out["health_then"] == {"status": "shutting down"}
        assert out["new"] == [(200, True)] * NEW_REQUESTS, (out["new"], d.router.log_tail())
        assert all(s.done and s.finish == "length" for s in out["streams"]), \
            [vars(s) for s in out["streams"]]
        assert d.replicas[1].proc.wait(60) == 0
        assert any("503" in line and d.replicas[1].url in line for line in d.router.lines)
        assert d.stop()[0] == 0
