"""/v1/completions, and what chat shares with it: prompt checks, jobs, logprobs, the streamed body."""
from __future__ import annotations

import dataclasses
import logging
from typing import AsyncIterator, Callable, Optional

from quart import Response

from ..server.metrics import current_timer
from .protocol import SEED_MASK, GenRequest, OpenAIError, bad_request, new_id, now, server_error, usage
from .sse import DONE, HEADERS, SHUTDOWN, STALLED, Job, StallWatch, choice_outputs, dumps, event

log = logging.getLogger("pyserve.server")


def json_response(obj, status: int = 200) -> Response:
    return Response(dumps(obj), status=status, content_type="application/json")


def error_response(err: OpenAIError) -> Response:
    return json_response(err.body(), err.status)


class Serving:
    """Shared by the chat and completions endpoints. `state` is the app's ServerState."""

    def __init__(self, state):
        self.state = state

    @property
    def engine(self):
        return self.state.require_engine()

    # ---- checks ----

    def check_model(self, req: GenRequest) -> str:
        if req.model is not None and req.model not in self.state.model_names():
            raise OpenAIError(f"The model `{req.model}` does not exist.", 404, "invalid_request_error", "model",
                              "model_not_found")
        return self.state.served_model_name

    def check_ids(self, ids: list[int], param: str = "prompt") -> None:
        if not ids:
            raise bad_request("the prompt is empty", param=param)
        n_vocab = self.state.n_vocab
        for t in ids:
            if not 0 <= t < n_vocab:
                raise bad_request(f"token id {t} is outside the vocabulary [0, {n_vocab})", param=param)

    def max_tokens(self, req: GenRequest, n_prompt: int, param: str = "max_tokens") -> int:
        n_ctx = self.state.max_model_len
        if req.max_tokens is None:
            if n_prompt >= n_ctx:
                raise bad_request(f"This model's maximum context length is {n_ctx} tokens. However, your prompt is "
                                  f"{n_prompt} tokens, leaving no room for the completion. Please reduce the length "
                                  f"of the prompt.", param="messages" if req.messages else "prompt",
                                  code="context_length_exceeded")
            return n_ctx - n_prompt
        if n_prompt + req.max_tokens > n_ctx:
            raise bad_request(f"This model's maximum context length is {n_ctx} tokens. However, you requested "
                              f"{n_prompt + req.max_tokens} tokens ({n_prompt} in the prompt, {req.max_tokens} in "
                              f"the completion). Please reduce the length of the prompt or completion.",
                              param=param, code="context_length_exceeded")
        return req.max_tokens

    def jobs(self, rid: str, req: GenRequest, prompt_ids: list[list[int]], param: str) -> list[Job]:
        jobs = []
        for p, ids in enumerate(prompt_ids):
            params = dataclasses.replace(req.params, max_tokens=self.max_tokens(req, len(ids), param), n=1)
            for i in range(req.n):
                index = p * req.n + i
                if req.params.seed is not None:
                    params_i = dataclasses.replace(params, seed=(req.params.seed + i) & SEED_MASK)
                else:
                    params_i = params
                jobs.append(Job(index, ids, params_i, f"{rid}-{index}"))
        self.state.admit(jobs, req)  # rate limits and queue admission (429); released when the request ends
        return jobs

    # ---- logprobs ----

    def token_text(self, tid: int) -> tuple[str, bytes]:
        b = self.state.tokenizer.token_bytes(tid)
        return b.decode("utf-8", errors="replace"), b

    def top_entries(self, entry: dict, k: int) -> list[tuple[int, float]]:
        return sorted(entry.items(), key=lambda kv: -kv[1])[:k]

    # ---- the two response shapes ----

    async def collect(self, jobs: list[Job]) -> dict[int, dict]:
        """Runs every job to the end: {index: {"text", "token_ids", "logprobs", "finish_reason"}}."""
        res = {j.index: {"text": "", "token_ids": [], "logprobs": [], "finish_reason": None, "cached": 0}
               for j in jobs}
        timer = current_timer(self.state.metrics)
        timer.start(jobs, stream=False)
        self.state.request_started()
        try:
            async with choice_outputs(self.engine, jobs, self.state.draining) as recv:
                async for batch in recv:
                    if batch[0] is SHUTDOWN:
                        raise server_error("server shutting down", 503)
                    k = 0
                    for idx, out in batch:
                        if isinstance(out, Exception) or out.finish_reason not in (None, "stop", "length"):
                            raise self.engine_error(out)
                        k += timer.output(out)
                        r = res[idx]
                        r["text"] += out.text_delta
                        r["token_ids"] += out.token_ids_delta
                        r["cached"] = max(r["cached"], out.cached_tokens)
                        if out.logprobs_delta:
                            r["logprobs"] += out.logprobs_delta
                        if out.finish_reason:
                            r["finish_reason"] = out.finish_reason
                    timer.received(k)
            timer.outcome = "ok"
            timer.pending = timer.n_tokens  # written with the response: TTFT and e2e when it is sent
        except BaseException as e:
            timer.outcome = "error" if isinstance(e, Exception) else "abort"  # Cancelled: the client went away
            raise
        finally:
            self.state.release(jobs)
            self.state.request_finished(res.values())
        return res

    def engine_error(self, e) -> OpenAIError:
        if not isinstance(e, Exception):  # an output the engine ended with an error (or an abort of its own)
            log.error("engine request %s ended with %r", e.request_id, e.finish_reason)
            return server_error(f"the engine failed the request: {e.finish_reason}")
        if isinstance(e, OpenAIError):
            return e
        if isinstance(e, ValueError):
            msg = str(e)
            code = "context_length_exceeded" if "exceeds the" in msg else None
            return bad_request(msg, code=code)
        log.exception("engine request failed", exc_info=e)
        return server_error(f"internal error: {type(e).__name__}: {e}")

    def stream(self, jobs: list[Job], first: Callable[[], list[dict]],
               chunks: Callable[[int, object], list[dict]], usage_chunk: Optional[Callable[[], dict]]) -> Response:
        """The SSE response. `first()` gives the chunks sent at once, `chunks(index, output)` those of one
        delta, `usage_chunk()` the closing usage chunk (or None)."""
        state = self.state
        engine = self.engine
        outputs: dict[int, list] = {j.index: [] for j in jobs}
        timer = current_timer(state.metrics)

        stall = StallWatch(state.config.stalled_client_timeout, state.client_stalled)

        async def body() -> AsyncIterator[bytes]:
            state.request_started()  # here, not before: a body never started never runs its finally
            timer.start(jobs, stream=True)
            try:
                yield b"".join(event(c) for c in first())
                async with choice_outputs(engine, jobs, state.draining, stall) as recv:
                    async for batch in recv:
                        if batch[0] is SHUTDOWN:
                            timer.outcome = "error"
                            yield event(server_error("server shutting down", 503).body()) + DONE
                            return
                        if batch[0] is STALLED:  # (counted when the watch fired)
                            timer.outcome = "error"
                            yield event(server_error("client stopped reading: request aborted", 408).body()) + DONE
                            return
                        buf = []
                        for idx, out in batch:
                            if isinstance(out, Exception) or out.finish_reason not in (None, "stop", "length"):
                                timer.outcome = "error"
                                buf.append(event(self.engine_error(out).body()))
                                yield b"".join(buf) + DONE
                                return
                            outputs[idx].append(out)
                            timer.pending += timer.output(out)  # written (and timed) by the ASGI send wrapper
                            buf.extend(event(c) for c in chunks(idx, out))
                        stall.writing()
                        yield b"".join(buf)
                        stall.written()
                tail = event(usage_chunk()) if usage_chunk is not None else b""
                yield tail + DONE
                timer.outcome = "ok"
            except Exception as e:  # noqa: BLE001 - a bug; the client still gets a well-formed end
                log.exception("stream failed")
                timer.outcome = "error"
                yield event(server_error(f"internal error: {type(e).__name__}: {e}").body()) + DONE
            finally:
                state.release(jobs)
                state.request_finished(
                    {"token_ids": [t for o in outs for t in o.token_ids_delta],
                     "finish_reason": outs[-1].finish_reason if outs else None} for outs in outputs.values())

        resp = Response(body(), status=200, headers=HEADERS)
        resp.timeout = None  # Quart's RESPONSE_TIMEOUT would cut long streams
        return resp


class CompletionServing(Serving):
    async def create(self, req: GenRequest) -> Response:
        model = self.check_model(req)
        tok = self.state.tokenizer
        prompt_ids, prompt_texts = [], []
        for p in req.prompts:
            if isinstance(p, str):
                ids = tok.encode(p, add_special=True, parse_special=True)
                prompt_texts.append(p)
            else:
                ids = p
                prompt_texts.append(None)
            self.check_ids(ids)
            prompt_ids.append(ids)
        rid, created = new_id("cmpl"), now()
        jobs = self.jobs(rid, req, prompt_ids, "max_tokens")
        n_prompt = sum(len(ids) for ids in prompt_ids)

        def echo_text(index: int) -> str:
            p = index // req.n
            if prompt_texts[p] is not None:
                return prompt_texts[p]
            return tok.decode(prompt_ids[p], skip_special=req.params.skip_special_tokens)

        def base(choices: list) -> dict:
            return {"id": rid, "object": "text_completion", "created": created, "model": model,
                    "system_fingerprint": None, "choices": choices}

        if not req.stream:
            res = await self.collect(jobs)
            choices = []
            for idx in sorted(res):
                r = res[idx]
                text = (echo_text(idx) if req.echo else "") + r["text"]
                lp = self.logprobs(r["token_ids"], r["logprobs"], req.logprobs, 0) if req.logprobs is not None else None
                choices.append({"index": idx, "text": text, "logprobs": lp, "finish_reason": r["finish_reason"]})
            out = base(choices)
            out["usage"] = usage(n_prompt, sum(len(r["token_ids"]) for r in res.values()),
                                 max(r["cached"] for r in res.values()))
            return json_response(out)

        offsets = {j.index: 0 for j in jobs}
        n_gen = {"n": 0, "cached": 0}

        def chunk(choices: list) -> dict:
            c = base(choices)
            if req.include_usage:
                c["usage"] = None
            return c

        def first() -> list[dict]:
            if not req.echo:
                return []
            return [chunk([{"index": j.index, "text": echo_text(j.index), "logprobs": None, "finish_reason": None}])
                    for j in jobs]

        def chunks(idx: int, out) -> list[dict]:
            n_gen["n"] += len(out.token_ids_delta)
            n_gen["cached"] = max(n_gen["cached"], out.cached_tokens)
            lp = None
            if req.logprobs is not None:
                lp = self.logprobs(out.token_ids_delta, out.logprobs_delta or [], req.logprobs, offsets[idx])
            offsets[idx] += len(out.text_delta)
            if not out.text_delta and not out.finish_reason:
                return []
            return [chunk([{"index": idx, "text": out.text_delta, "logprobs": lp,
                            "finish_reason": out.finish_reason}])]

        def usage_chunk() -> dict:
            c = base([])
            c["usage"] = usage(n_prompt, n_gen["n"], n_gen["cached"])
            return c

        return self.stream(jobs, first, chunks, usage_chunk if req.include_usage else None)

    def logprobs(self, token_ids: list[int], entries: list[dict], k: int, offset: int) -> dict:
        tokens, token_lps, tops, offsets = [], [], [], []
        for tid, entry in zip(token_ids, entries):
            text, _ = self.token_text(tid)
            tokens.append(text)
            token_lps.append(entry.get(tid))
            tops.append({self.token_text(t)[0]: lp for t, lp in self.top_entries(entry, k)})
            offsets.append(offset)
            offset += len(text)
        return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}
