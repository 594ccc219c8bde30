"""AsyncLLM (trio) with the real model: streams equal LLM.generate, cancellation frees blocks, slow consumers
get merged deltas, clean shutdown with streams in flight.

One loaded engine (the session `llm`) serves every test but the open/close ones: each test wraps it in its
own AsyncLLM (an EngineLoop thread and a router task, cheap), since a trio run cannot outlive its test.
"""
import pytest
import trio

from pyserve import SamplingParams
from pyserve.engine.async_llm import AsyncLLM
from support.async_engine import settled
from support.prompts import PROMPTS

GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, logprobs=2)
LONG = SamplingParams(temperature=0, max_tokens=200, ignore_eos=True)
GC_CLOSED = pytest.mark.filterwarnings("ignore:Async generator.*garbage collected:ResourceWarning")


@pytest.fixture(scope="module")
def reference(llm):
    """LLM.generate's greedy output per prompt: (text, token_ids, logprobs)."""
    outs = llm.generate(PROMPTS, GREEDY)
    return [(o.outputs[0].text, o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs]


async def collect(engine, prompt, params=GREEDY, request_id=None):
    outs = [o async for o in engine.generate(prompt, params, request_id=request_id)]
    text = "".join(o.text_delta for o in outs)
    ids = [t for o in outs for t in o.token_ids_delta]
    lps = None if params.logprobs is None else [lp for o in outs for lp in o.logprobs_delta]
    return text, ids, lps, outs


async def test_stream_equals_llm_generate(llm, reference):
    with trio.fail_after(60):
        async with AsyncLLM.open(llm) as engine:
            text, ids, lps, outs = await collect(engine, PROMPTS[0], request_id="r1")
            assert (text, ids, lps) == reference[0]
            assert all(o.request_id == "r1" for o in outs)
            assert [o.finish_reason for o in outs] == [None] * (len(outs) - 1) + ["length"]
            assert all(o.prompt_token_ids == outs[0].prompt_token_ids for o in outs)
            await settled(engine)


async def test_eight_concurrent_streams(llm, reference):
    results = {}

    async def one(engine, i):
        results[i] = (await collect(engine, PROMPTS[i]))[:3]

    with trio.fail_after(60):
        async with AsyncLLM.open(llm) as engine:
            async with trio.open_nursery() as nursery:
                for i in range(len(PROMPTS)):
                    nursery.start_soon(one, engine, i)
            assert [results[i] for i in range(len(PROMPTS))] == reference
            await settled(engine)


async def _stream_until(engine, n_outputs, on_nth):
    """Consumes a long stream; at the n-th output calls on_nth(); returns engine steps at that moment."""
    got = 0
    async for out in engine.generate(PROMPTS[0], LONG):
        assert out.finish_reason is None
        got += 1
        if got == n_outputs:
            await on_nth()
    raise AssertionError("the stream was expected to be cut off")


async def _assert_freed_within(engine, steps_before, max_steps):
    """Everything freed, and the engine ran at most max_steps forward steps meanwhile: the step in flight,
    then the one that applies the abort (no forward of its own when nothing else runs). Where trio's
    finalizer closes an abandoned generator (a few scheduler ticks later), a little slack."""
    s = await settled(engine)
    assert s["steps"] - steps_before <= max_steps, (steps_before, s)


@pytest.mark.parametrize("where", ["in_generator", "in_consumer"])
@GC_CLOSED
async def test_cancel_scope_mid_stream_frees_blocks(llm, where):
    # in_generator: the cancel lands at the generator's own await → trio.Cancelled in its finally.
    # in_consumer: the consumer's own await is cancelled while the generator sits at `yield` → trio closes the
    # abandoned generator (GeneratorExit) → the same finally.
    with trio.fail_after(60):
        async with AsyncLLM.open(llm) as engine:
            with trio.CancelScope() as scope:
                async def cut():
                    assert engine.stats()["blocks_used"] > 0
                    scope.cancel()
                    if where == "in_consumer":
                        await trio.sleep(0)
                await _stream_until(engine, 3, cut)
            assert scope.cancelled_caught
            steps = engine.stats()["steps"]
            await _assert_freed_within(engine, steps, 2 if where == "in_generator" else 6)
            # the engine is still usable afterwards
            assert (await collect(engine, PROMPTS[1]))[1]


async def test_aclose_mid_stream_frees_blocks(llm):
    with trio.fail_after(60):
        async with AsyncLLM.open(llm) as engine:
            agen = engine.generate(PROMPTS[0], LONG, request_id="closing")
            for _ in range(3):
                out = await agen.__anext__()
                assert out.finish_reason is None
            assert engine.stats()["streams"] == 1
            await agen.aclose()
            steps = engine.stats()["steps"]
            await _assert_freed_within(engine, steps, 2)


class Boom(Exception):
    pass


@GC_CLOSED
async def test_consumer_exception_frees_blocks(llm):
    async def consumer(engine):
        n = 0
        async for _ in engine.generate(PROMPTS[0], LONG):
            n += 1
            if n == 3:
                raise Boom

    with trio.fail_after(60):
        async with AsyncLLM.open(llm) as engine:
            with pytest.raises(Boom):
                await consumer(engine)
            steps = engine.stats()["steps"]
            await _assert_freed_within(engine, steps, 6)


async def test_slow_consumer_merges_deltas_and_never_stalls_others(llm, reference):
    slow_params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True, logprobs=2)
    slow_ref = llm.generate(PROMPTS[2], slow_params)[0].outputs[0]
    fast_done = trio.Event()

    with trio.fail_after(60):
        async with AsyncLLM.open(llm) as engine:
            slow_outs = []

            async def fast():
                text, ids, lps, _ = await collect(engine, PROMPTS[0])
                assert (text, ids, lps) == reference[0]
                fast_done.set()

            async def slow():
                agen = engine.generate(PROMPTS[2], slow_params, request_id="slow")
                try:
                    slow_outs.append(await agen.__anext__())
                    # Read nothing more until the fast stream is done and the engine has finished this
                    # request too: the engine ran on without waiting for this consumer.
                    await fast_done.wait()
                    await settled_running(engine)
                    while not any(st.closed for st in engine._streams.values() if st.request_id == "slow"):
                        await trio.sleep(0.01)  # the router has routed the final output too
                    async for out in agen:
                        slow_outs.append(out)
                finally:
                    await agen.aclose()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(slow)
                nursery.start_soon(fast)

            # the remaining 39+ tokens arrived as one merged delta
            assert len(slow_outs) == 2
            assert "".join(o.text_delta for o in slow_outs) == slow_ref.text
            assert [t for o in slow_outs for t in o.token_ids_delta] == slow_ref.token_ids
            assert [lp for o in slow_outs for lp in o.logprobs_delta] == slow_ref.logprobs
            assert slow_outs[-1].finish_reason == "length"
            await settled(engine)


async def settled_running(engine, max_polls=1000):
    for _ in range(max_polls):
        s = engine.stats()
        if (s["running"], s["waiting"], s["blocks_used"]) == (0, 0, 0):
            return
        await trio.sleep(0.01)
    raise AssertionError(engine.stats())


async def test_stop_strings(llm, reference):
    full_text = reference[5][0]
    stop = full_text[len(full_text) // 3: len(full_text) // 3 + 4]
    assert stop.strip(), full_text
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, stop=[stop])
    ref = llm.generate(PROMPTS[5], params)[0].outputs[0]
    assert ref.finish_reason == "stop" and ref.text == full_text[: full_text.index(stop)]

    with trio.fail_after(60):
        async with AsyncLLM.open(llm) as engine:
            text, ids, _, outs = await collect(engine, PROMPTS[5], params, request_id="s")
            assert (text, ids) == (ref.text, ref.token_ids)
            assert outs[-1].finish_reason == "stop"
            assert stop not in text
            # the engine request was aborted after the match; the same id may be reused at once and gets
            # nothing of the old request's outputs
            text2, ids2, _, outs2 = await collect(engine, PROMPTS[5], params, request_id="s")
            assert (text2, ids2, outs2[-1].finish_reason) == (ref.text, ref.token_ids, "stop")
            await settled(engine)


async def test_bad_requests_raise_at_once_and_leave_nothing(llm):
    n_ctx = llm.engine.config["n_ctx"]
    with trio.fail_after(60):
        async with AsyncLLM.open(llm) as engine:
            bad = [
                ([2] * 10, SamplingParams(max_tokens=n_ctx), "exceeds the context length"),
                ([2] * (n_ctx + 1), SamplingParams(max_tokens=1), "exceeds the context length"),
                ([2, 10**7], SamplingParams(max_tokens=4), "outside the vocabulary"),
                ([2, -1], SamplingParams(max_tokens=4), "outside the vocabulary"),
                ([], SamplingParams(max_tokens=4), "empty"),
                ("hi", SamplingParams(n=100), "n must be in"),  # n > 1 forks; more than max_num_seqs cannot run
            ]
            for prompt, params, match in bad:
                agen = engine.generate(prompt, params, request_id="bad")
                with pytest.raises(ValueError, match=match):
                    await agen.__anext__()
                s = engine.stats()
                assert (s["streams"], s["running"], s["waiting"], s["blocks_used"]) == (0, 0, 0, 0)
                assert "bad" not in engine._active
            # a duplicate id while the first is streaming
            first = engine.generate(PROMPTS[0], LONG, request_id="dup")
            await first.__anext__()
            with pytest.raises(ValueError, match="duplicate request id"):
                await engine.generate(PROMPTS[1], GREEDY, request_id="dup").__anext__()
            await first.aclose()
            await settled(engine)
            # the id "bad" was never taken
            assert (await collect(engine, PROMPTS[0], request_id="bad"))[1]


async def test_abort_by_request_id(llm):
    with trio.fail_after(60):
        async with AsyncLLM.open(llm) as engine:
            outs = []
            async for out in engine.generate(PROMPTS[0], LONG, request_id="x"):
                outs.append(out)
                if len(outs) == 2:
                    engine.abort("x")
            assert outs[-1].finish_reason == "abort"
            await settled(engine)


async def test_open_and_exit_with_streams_in_flight(model_path):
    finals = {}

    async def consume(engine, i, started):
        async for out in engine.generate(PROMPTS[i], LONG):
            started.set()
            if out.finish_reason:
                finals[i] = out.finish_reason

    with trio.fail_after(60):
        async with trio.open_nursery() as outer:  # the consumers outlive the engine
            async with AsyncLLM.open(model_path, n_threads=2) as engine:
                for i in range(4):
                    started = trio.Event()
                    outer.start_soon(consume, engine, i, started)
                    await started.wait()
                # and one generator that is started and then simply dropped
                dangling = engine.generate(PROMPTS[5], LONG)
                await dangling.__anext__()
                assert engine.stats()["streams"] == 5
        assert finals == {i: "abort" for i in range(4)}
        s = engine.stats()
        assert (s["running"], s["waiting"], s["blocks_used"]) == (0, 0, 0)
        await dangling.aclose()
        with pytest.raises(RuntimeError, match="closed"):
            await engine.generate(PROMPTS[0]).__anext__()


async def test_exception_in_body_closes_cleanly(llm):
    async def consume(engine, i):
        async for _ in engine.generate(PROMPTS[i], LONG):
            pass

    raised = False
    with trio.fail_after(60):
        try:
            async with AsyncLLM.open(llm) as engine:
                async with trio.open_nursery() as nursery:
                    for i in range(4):
                        nursery.start_soon(consume, engine, i)
                    while engine.stats()["running"] < 4:
                        await trio.sleep(0.01)
                    raise Boom
        except* Boom:
            raised = True
    assert raised
    with trio.fail_after(60):
        s = engine.stats()
        assert (s["running"], s["waiting"], s["blocks_used"], s["streams"]) == (0, 0, 0, 0)


async def test_request_stream_merges_undelivered_deltas():
    from pyserve.engine.async_llm import RequestStream
    from pyserve.engine.output_processor import Delta

    s = RequestStream("r", [None])  # one sample (its text state is not used here)
    s.push(0, Delta("a", [1], [{1: -0.1}]))
    s.push(0, Delta("", [2], [{2: -0.2}]))  # a token with no text yet (a partial UTF-8 character)
    s.push(0, Delta("bc", [3], [{3: -0.3}]))
    [(_, d)] = await s.get()
    assert (d.text, d.token_ids, d.logprobs, d.finish_reason) == ("abc", [1, 2, 3], [{1: -0.1}, {2: -0.2}, {3: -0.3}], None)
    assert not s.closed and not s.finished

    async def late_push():
        await trio.sleep(0.01)
        s.push(0, Delta("d", [4], None))
        s.push(0, Delta("e", [], None, "length"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(late_push)
        [(_, d)] = await s.get()  # parks until the router pushes
    assert (d.text, d.token_ids, d.logprobs, d.finish_reason) == ("de", [4], None, "length")
    assert s.closed and s.finished

    # a cancelled get() leaves the stream usable
    with trio.move_on_after(0.01):
        await s.get()
    s.push(0, Delta("f", [5]))
    assert (await s.get())[0][1].text == "f"
