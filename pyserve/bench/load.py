"""The load of a run: closed-loop levels (N requests always in flight) and open-loop levels (Poisson arrivals);
capacity.py searches over them."""
from __future__ import annotations

import argparse
import asyncio
import math
import random
import sys
import time
from typing import Awaitable, Callable, Optional

from tqdm import tqdm

from .client import RequestResult, Target, send_request
from .prometheus import metrics_delta
from .prompts import PromptSource
from .report import level_report
from .stats import summarize


class Runner:
    """Runs levels against one target and keeps their reports (`levels`), each with the server's metrics deltas
    when it has a Prometheus `GET /metrics`."""

    def __init__(self, args: argparse.Namespace, client, target: Target, source: PromptSource,
                 metrics_url: Optional[str]):
        self.args, self.client, self.target, self.source = args, client, target, source
        self.metrics_url = metrics_url
        self.levels: list[dict] = []
        self.rng = random.Random(args.seed + 1)

    def _n_prompts(self, concurrency: int) -> Optional[int]:
        if self.args.num_prompts is not None:
            return self.args.num_prompts
        if self.args.duration is not None:
            return None
        return max(16, 4 * concurrency)

    def _deadline(self, start: float) -> Optional[float]:
        return start + self.args.duration if self.args.duration is not None else None

    def _progress(self, total: Optional[int], desc: str) -> tqdm:
        return tqdm(total=total, desc=desc, file=sys.stderr, unit="req", leave=False, disable=self.args.no_progress)

    async def _scrape(self) -> Optional[str]:
        if not self.metrics_url:
            return None
        try:
            resp = await self.client.get(self.metrics_url, timeout=5.0, headers=self.target.headers)
            if resp.status_code == 200 and "html" not in resp.headers.get("content-type", ""):
                return resp.text
        except Exception:
            pass
        self.metrics_url = None  # the server has none: stop asking
        return None

    async def _add_metrics(self, rep: dict, before: Optional[str]) -> None:
        after = await self._scrape() if before is not None else None
        if after is None:
            return
        try:
            rep["server_metrics"] = metrics_delta(before, after)
        except ValueError:  # not Prometheus text after all
            self.metrics_url = None

    async def _timed(self, prompt: str, results: list[RequestResult], progress: tqdm,
                     arrival: Optional[float] = None) -> None:
        r = await send_request(self.client, self.target, prompt, arrival)
        results.append(r)
        progress.update(1)
        if not r.ok:
            progress.set_postfix(errors=sum(not x.ok for x in results))

    async def _finish(self, rep: dict, before: Optional[str]) -> dict:
        await self._add_metrics(rep, before)
        self.levels.append(rep)
        return rep

    async def closed_level(self, concurrency: int) -> dict:
        """`concurrency` workers, each sending its next request when the last one ends."""
        n = self._n_prompts(concurrency)
        await self.source.fill(n if n is not None else min(2 * concurrency + 16, 1024))
        results: list[RequestResult] = []
        issued = 0
        before = await self._scrape()
        progress = self._progress(n, f"concurrency {concurrency}")
        start = time.perf_counter()
        deadline = self._deadline(start)

        async def worker() -> None:
            nonlocal issued
            while (n is None or issued < n) and (deadline is None or time.perf_counter() < deadline):
                issued += 1
                await self._timed(await self.source.get(), results, progress)

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        wall = time.perf_counter() - start
        progress.close()
        rep = level_report(results, wall, concurrency)
        rep["mode"] = "closed"
        return await self._finish(rep, before)

    async def open_level(self, rate: float, cap: Optional[int]) -> dict:
        """Poisson arrivals at `rate` requests/s (inf: all at once), at most `cap` in flight (None: no cap).
        A request's TTFT and e2e count from its arrival, so the wait for a slot under the cap is part of them
        (its queue_wait, summarized under "queue_wait"): an overloaded rate shows, wherever its requests queue."""
        n = self.args.num_prompts
        if n is None and self.args.duration is None:
            n = max(16, int(4 * rate * 4)) if math.isfinite(rate) else 64
        await self.source.fill(n if n is not None else min(int(2 * rate) + 16 if math.isfinite(rate) else 64, 1024))
        results: list[RequestResult] = []
        sem = asyncio.Semaphore(cap) if cap else None
        inflight = peak = 0
        before = await self._scrape()
        progress = self._progress(n, f"rate {rate:g}/s")

        async def one(prompt: str, arrival: float) -> None:
            nonlocal inflight, peak
            if sem is not None:
                await sem.acquire()
            inflight += 1
            peak = max(peak, inflight)
            try:
                await self._timed(prompt, results, progress, arrival)
            finally:
                inflight -= 1
                if sem is not None:
                    sem.release()

        start = time.perf_counter()
        await asyncio.gather(*await self._arrivals(rate, n, start, one))
        wall = time.perf_counter() - start
        progress.close()
        rep = level_report(results, wall, cap if cap else peak)
        rep.update(mode="poisson", request_rate=rate if math.isfinite(rate) else None, peak_concurrency=peak,
                   queue_wait=summarize(r.queue_wait for r in results if r.ok))
        return await self._finish(rep, before)

    async def _arrivals(self, rate: float, n: Optional[int], start: float,
                        one: Callable[[str, float], Awaitable[None]]) -> list[asyncio.Future]:
        """Starts `one(prompt, arrival)` at Poisson arrival times (perf_counter s) from `start` until n are
        issued or the duration ends."""
        deadline = self._deadline(start)
        tasks: list[asyncio.Future] = []
        next_t = start
        while (n is None or len(tasks) < n) and (deadline is None or time.perf_counter() < deadline):
            if math.isfinite(rate) and tasks:
                next_t += self.rng.expovariate(rate)
                if deadline is not None and next_t >= deadline:
                    break
                delay = next_t - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            prompt = await self.source.get()
            tasks.append(asyncio.ensure_future(one(prompt, time.perf_counter())))
        return tasks
