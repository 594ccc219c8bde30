"""AsyncLLM hand-off cost: trio-side CPU per streamed token (router + per-request streams + consumers).

    PYTHONPATH=. python scripts/bench_async.py [--streams 64] [--tokens 64] [--threads 1] [--mode both]

real:      the real engine on its EngineLoop thread; N concurrent greedy streams. The trio thread's own CPU
           time (time.thread_time: wake-ups, drain() and its pybind conversion, detokenizer + stop strings,
           merging into streams, the consumers' `async for`) divided by the tokens delivered. The engine's
           threads are not counted. Use --threads 1 on a 2-core box so the trio thread has a core.
synthetic: the EngineLoop replaced by a Python stand-in that "steps" instantly (one output per live
           request per eventfd wake-up, real tokens of the model replayed): the same trio-side path with no
           engine at all, so many streams and tokens run in a second. Its drain() builds the outputs in
           Python (objects with StepOutput's fields), roughly what the binding does in C++.

Prints µs/token, with the share spent in RequestState.process (detokenizer + stop strings).
"""
from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass

import trio

from pyserve import LLM, SamplingParams
from pyserve.engine import output_processor
from pyserve.engine.async_llm import AsyncLLM

PROMPTS = ["Once upon a time", "The capital of France is", "def fibonacci(n):", "In 1492, Columbus",
           "Water boils at", "My favourite recipe for soup", "1, 2, 3, 4,", "The quick brown fox"]


@dataclass(slots=True)
class _Output:
    """_engine.StepOutput's fields, for the stand-in's drain()."""
    request_id: str
    token: int
    logprob: float
    top: list
    finish_reason: str
    n_prompt: int
    index: int
    scheduled_ts: float
    step_ts: float
    n_cached: int
    embedding: object
    prompt_logprobs: object


class ProcessTimer:
    """Wraps RequestState.process to add up the time spent in it (a ~0.2 µs wrapper per call)."""

    def __init__(self):
        self.total = 0.0
        self.orig = output_processor.RequestState.process

    def __enter__(self):
        orig, timer = self.orig, self

        def timed(state, *a):
            t = time.perf_counter()
            try:
                return orig(state, *a)
            finally:
                timer.total += time.perf_counter() - t

        output_processor.RequestState.process = timed
        return self

    def __exit__(self, *exc):
        output_processor.RequestState.process = self.orig


class FakeLoop:
    """EngineLoop's interface, stepping instantly: each drain() is one step of every live request."""

    def __init__(self, token_streams: list[list[int]]):
        self.fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        self.token_streams = token_streams
        self.live: dict[str, list] = {}  # eid → [tokens, position, max_tokens, n_prompt]
        self.n = 0
        self.wakeups = 0

    def start(self): pass

    def stop(self): pass

    def _signal(self):
        os.eventfd_write(self.fd, 1)

    def add(self, eid, ids, sampling, max_tokens, ignore_eos, stop_ids, **_kw):
        self.live[eid] = [self.token_streams[self.n % len(self.token_streams)], 0, max_tokens, len(ids)]
        self.n += 1
        self._signal()

    def abort(self, eid):
        self.live.pop(eid, None)

    def drain(self):
        try:
            os.eventfd_read(self.fd)
        except BlockingIOError:
            pass
        self.wakeups += 1
        out = []
        now = time.monotonic()  # the step's timestamps (scheduled_ts, step_ts)
        for eid, st in list(self.live.items()):
            toks, pos, max_tokens, n_prompt = st
            st[1] = pos + 1
            done = pos + 1 >= max_tokens
            out.append(_Output(eid, toks[pos % len(toks)], -0.5, [], "length" if done else "", n_prompt, 0, now, now,
                               0, None, None))
            if done:
                del self.live[eid]
        if self.live:
            self._signal()  # the next "step" is ready at once
        return out


async def run_streams(engine: AsyncLLM, n_streams: int, params: SamplingParams) -> int:
    counts = [0] * n_streams

    async def one(i):
        async for out in engine.generate(PROMPTS[i % len(PROMPTS)], params):
            counts[i] += len(out.token_ids_delta)

    async with trio.open_nursery() as nursery:
        for i in range(n_streams):
            nursery.start_soon(one, i)
    return sum(counts)


async def measure(engine: AsyncLLM, n_streams: int, params: SamplingParams) -> dict:
    with ProcessTimer() as pt:
        w0, c0 = time.perf_counter(), time.thread_time()
        tokens = await run_streams(engine, n_streams, params)
        wall, cpu = time.perf_counter() - w0, time.thread_time() - c0
    return {"tokens": tokens, "wall": wall, "cpu": cpu, "process": pt.total}


def report(mode: str, n_streams: int, r: dict, extra: str = "") -> None:
    n = r["tokens"]
    print(f"{mode:9s} streams={n_streams:4d} tokens={n:6d} wall={r['wall']:.2f}s ({n / r['wall']:.0f} tok/s)  "
          f"trio-side {1e6 * r['cpu'] / n:.1f} µs/token, of which RequestState.process "
          f"{1e6 * r['process'] / n:.1f}, hand-off (router+stream+consumer) {1e6 * (r['cpu'] - r['process']) / n:.1f}"
          f"{extra}")


async def main_async(args, llm: LLM) -> None:
    params = SamplingParams(temperature=0, max_tokens=args.tokens, ignore_eos=True)
    if args.mode in ("real", "both"):
        async with AsyncLLM.open(llm) as engine:
            await run_streams(engine, 2, SamplingParams(temperature=0, max_tokens=4))  # warm-up
            r = await measure(engine, args.streams, params)
            s = engine.stats()
        report("real", args.streams, r, f"  [engine steps={s['steps']}]")
    if args.mode in ("synthetic", "both"):
        ref = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
        token_streams = [o.outputs[0].token_ids for o in ref]
        for n_streams in args.synthetic_streams:
            runs = []
            for _ in range(args.repeat):
                fake = FakeLoop(token_streams)

                class FakeAsyncLLM(AsyncLLM):
                    def __init__(self, llm):
                        super().__init__(llm)
                        self.loop = fake  # the real EngineLoop made above is never started

                async with FakeAsyncLLM.open(llm) as engine:
                    r = await measure(engine, n_streams, SamplingParams(temperature=0, max_tokens=args.synthetic_tokens,
                                                                        ignore_eos=True))
                os.close(fake.fd)
                r["wakeups"] = fake.wakeups
                runs.append(r)
            r = sorted(runs, key=lambda r: r["cpu"] / r["tokens"])[len(runs) // 2]  # the median run
            report("synthetic", n_streams, r, f"  [{r['tokens'] / r['wakeups']:.0f} outputs/wake-up; median of "
                                              f"{len(runs)}]")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--threads", type=int, default=1, help="engine threads (real mode)")
    ap.add_argument("--streams", type=int, default=64, help="concurrent streams (real mode)")
    ap.add_argument("--tokens", type=int, default=64, help="tokens per stream (real mode)")
    ap.add_argument("--synthetic-streams", type=int, nargs="+", default=[1, 64, 512])
    ap.add_argument("--synthetic-tokens", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=5, help="synthetic runs per stream count (the median is printed)")
    ap.add_argument("--mode", choices=["real", "synthetic", "both"], default="both")
    args = ap.parse_args()
    llm = LLM(args.model, n_threads=args.threads)
    trio.run(main_async, args, llm)


if __name__ == "__main__":
    main()
