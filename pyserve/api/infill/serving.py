"""llama.cpp's /infill: the request's prefix, suffix and extra files laid out in the model's FIM tokens
(fim.py), run as a completion of those token ids (base/serving.py's engine requests, collect and stream), and
answered in llama.cpp's /completion shapes (protocol.py)."""
from __future__ import annotations

from typing import AsyncIterator

from ..base.context import RequestContext
from ..base.replies import Usage
from ..base.served_model import ServedModel
from ..base.serving import Choice, collect, engine_requests, stream_events
from ..base.streaming import DONE, EventStream
from ..completions.fim import FimParts, check_sizes, fim_prompt
from ..completions.serving import silent_ids
from .protocol import InfillRequest, InfillResponse, InfillTimings


class InfillServing:
    def __init__(self, model: ServedModel):
        self.model = model

    async def create(self, req: InfillRequest, ctx: RequestContext):
        self.model.check_name(req.model)
        ids = self._prompt(req)
        creq = req.completion_request(ids)
        requests, ticket = await engine_requests(self.model, ctx, ctx.response_id("infill"), creq, [ids],
                                                 "input_prefix")
        shape = _Shapes(self.model, req, ids, requests[0].params, silent_ids(self.model, requests[0].params))
        if not req.stream:
            choices, u = await collect(self.model, ctx, requests, ticket)
            return shape.final(choices[0], u)
        events = stream_events(self.model, ctx, requests, ticket, shape, include_usage=True)
        return EventStream(_without_done(events.batches))

    def _prompt(self, req: InfillRequest) -> list[int]:
        extra = req.extra_files()
        check_sizes(self.model, {"input_prefix": len(req.input_prefix.encode()),
                                 "input_suffix": len(req.input_suffix.encode()),
                                 "input_extra": sum(len(f.encode()) + len(t.encode()) for f, t in extra),
                                 "prompt": len((req.prompt or "").encode())})
        prompt_ids = self.model.tokenizer.encode(req.prompt or "", add_special=False, parse_special=True)
        return fim_prompt(self.model, FimParts(req.input_prefix, req.input_suffix, extra, prompt_ids),
                          req.bound(), "input_suffix")


async def _without_done(batches: AsyncIterator[list]) -> AsyncIterator[list]:
    """llama.cpp's /infill stream ends with its final object, not OpenAI's `[DONE]`."""
    try:
        async for batch in batches:
            yield [e for e in batch if e is not DONE]
    finally:
        await batches.aclose()


class _Shapes:
    """The /infill objects of one request: a step per delta with text, the final one from the usage."""

    def __init__(self, model: ServedModel, req: InfillRequest, prompt_ids: list[int], params, silent: frozenset):
        self.model, self.req, self.prompt_ids, self.params, self.silent = model, req, prompt_ids, params, silent
        self.seen = Choice()  # what was streamed so far (the final object's stop_type reads it)

    def first(self) -> list:
        return []

    def delta(self, idx: int, out) -> list:
        self.seen.add(out)
        if not out.text_delta and not (self.req.n_probs and out.token_ids_delta):
            return []  # (a token's probabilities go out even where its text is held back: part of a character)
        step = {"index": 0, "content": out.text_delta, "tokens": self._tokens(out.token_ids_delta), "stop": False,
                "id_slot": 0, "tokens_predicted": len(self.seen.token_ids), "tokens_evaluated": len(self.prompt_ids)}
        if self.req.n_probs:
            step["completion_probabilities"] = self._probs(out.token_ids_delta, out.logprobs_delta or [])
        return [step]

    def progress(self, idx: int, p) -> list:
        return [{"index": 0, "content": "", "tokens": [], "stop": False, "id_slot": 0,
                 "tokens_predicted": len(self.seen.token_ids), "tokens_evaluated": len(self.prompt_ids),
                 "prompt_progress": p.to_dict()}]

    def usage(self, u: Usage) -> InfillResponse:
        return self._final(self.seen, u, streamed=True)

    def final(self, c: Choice, u: Usage) -> InfillResponse:
        return self._final(c, u, streamed=False)

    def _final(self, c: Choice, u: Usage, streamed: bool) -> InfillResponse:
        stop_type, word = self._stop(c)
        probs = {} if streamed or not self.req.n_probs else {
            "completion_probabilities": self._probs(c.token_ids, c.logprobs)}
        return InfillResponse.model_construct(**probs,
            index=0, content="" if streamed else c.text, tokens=[] if streamed else self._tokens(c.token_ids),
            id_slot=0, stop=True, model=self.model.name, tokens_predicted=u.completion_tokens,
            tokens_evaluated=u.prompt_tokens, generation_settings=self._settings(),
            prompt=self.model.tokenizer.decode(self.prompt_ids, skip_special=False), has_new_line="\n" in c.text,
            truncated=False, stop_type=stop_type, stopping_word=word,
            tokens_cached=u.prompt_tokens + u.completion_tokens,
            timings=InfillTimings.model_construct(cache_n=_cached(u), prompt_n=u.prompt_tokens - _cached(u),
                                                  predicted_n=u.completion_tokens))

    def _probs(self, ids: list[int], logprobs: list[dict]) -> list[dict]:
        """llama.cpp's completion_probabilities: per token its id, text, bytes and logprob, and the n_probs most
        likely tokens in its place (the engine's {token: logprob}: the chosen one first, then the top ones)."""
        out = []
        for tid, alts in zip(ids, logprobs):
            top = sorted(alts.items(), key=lambda kv: -kv[1])[:self.req.n_probs]
            out.append({**self._prob(tid, alts[tid]), "top_logprobs": [self._prob(i, lp) for i, lp in top]})
        return out

    def _prob(self, tid: int, logprob: float) -> dict:
        data = self.model.tokenizer.piece(tid, False)
        return {"id": tid, "token": data.decode("utf-8", "ignore"), "bytes": list(data), "logprob": logprob}

    def _tokens(self, ids: list[int]) -> list[int]:
        return list(ids) if self.req.return_tokens else []

    def _stop(self, c: Choice) -> tuple[str, str]:
        """(llama.cpp's stop_type, the stop string that ended it or "")."""
        if c.finish_reason == "length":
            return "limit", ""
        if c.token_ids and c.token_ids[-1] in self.silent:
            return "eos", ""
        rest = self.model.tokenizer.decode(c.token_ids)[len(c.text):]  # the text the stop string cut off
        return "word", next((s for s in self.params.stop if rest.startswith(s)), "")

    def _settings(self) -> dict:
        p = self.params
        return {"n_predict": self.req.bound() if self.req.bound() is not None else -1, "seed": p.seed,
                "temperature": p.temperature, "top_k": p.top_k, "top_p": p.top_p, "min_p": p.min_p,
                "repeat_penalty": p.repetition_penalty, "presence_penalty": p.presence_penalty,
                "frequency_penalty": p.frequency_penalty, "stop": list(p.stop), "ignore_eos": p.ignore_eos,
                "max_tokens": p.max_tokens, "stream": bool(self.req.stream)}


def _cached(u: Usage) -> int:
    return u.prompt_tokens_details.cached_tokens or 0
