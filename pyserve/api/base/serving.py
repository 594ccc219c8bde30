"""What chat and completions share: prompts to engine requests, the fan-in of streamed choices (collected
or streamed as SSE), usage, and logprob formatting. Each endpoint's module adds only its own shapes.

One response's life: `engine_requests` checks each prompt against the engine (a 400 before anything is
sent) and asks the edge to admit it (a 429); `collect` or `stream_events` then runs the engine requests in
`choice_outputs`, tells the request's observer what happens, and releases the admission ticket in its
`finally` — which a client's disconnect reaches as Cancelled, aborting every engine request on the way.
"""
from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass, field
from typing import AsyncIterator, Optional, Protocol

from ...engine.detokenizer import IncrementalDetokenizer
from ...engine.output_processor import ranked
from ...engine.structured import StructuredOutputsParams
from .context import Demand, RequestContext
from .errors import OpenAIError, from_constraint, from_engine, server_error
from .replies import CompletionLogprobs, PromptLogprob, TokenLogprob, TopLogprob, Usage, usage
from .sampling import SamplingRequest
from .served_model import ServedModel
from .streaming import DONE, KEEP_ALIVE, SHUTDOWN, STALLED, EngineRequest, EventStream, StallWatch, choice_outputs

log = logging.getLogger("pyserve.server")
_engine_ids = itertools.count()


# ---- prompts to engine requests ----

def max_tokens_for(model: ServedModel, asked: Optional[int], n_prompt: int) -> int:
    """The completion bound the request `asked` for this prompt; the rest of the model's length when it sent
    none (at least 1: the engine then refuses a prompt that leaves no room, context_length_exceeded)."""
    return asked if asked is not None else max(model.max_model_len - n_prompt, 1)


async def engine_requests(model: ServedModel, ctx: RequestContext, rid: str, req: SamplingRequest,
                          prompts: list[list[int]], prompt_param: str,
                          constraint: Optional[tuple[StructuredOutputsParams, str]] = None,
                          keep_special: bool = False) -> tuple[list[EngineRequest], object]:
    """One engine request per prompt (its n choices forked in the engine), each checked by the engine (its
    constraint compiled first: the request's own, or `constraint` with the field it came from), then admitted
    by the edge. Returns them with the admission ticket. (to_sampling_params: what keep_special means.)"""
    so, field_name = constraint or req.structured()
    await check_constraint(model, so, field_name)
    out, n = [], req.n_choices
    asked, asked_field = req.max_new_tokens()
    for p, ids in enumerate(prompts):
        try:
            params = req.to_sampling_params(max_tokens_for(model, asked, len(ids)), so, keep_special)
            params.cache_salt = ctx.cache_salt(params.cache_salt)
            model.engine.check(ids, params)
        except ValueError as e:
            raise from_engine(e, prompt_param, asked_field if asked is not None else None) from None
        out.append(EngineRequest(p * n, ids, params, f"{rid}-{p}.{next(_engine_ids)}"))  # unique: a client
        # may send one X-Request-Id twice
    demand = Demand([(len(r.prompt_ids), r.params.max_tokens) for r in out for _ in range(n)],
                    asked)
    return out, ctx.admit(demand)


async def check_constraint(model: ServedModel, so: Optional[StructuredOutputsParams], field_name: str) -> None:
    """Compiles a request's constraint (cached: the engine request reuses it): a 400 naming the field that
    carried it, with the compiler's message, when it does not compile or asks what cannot be enforced."""
    try:
        await model.engine.compile_grammar(so)
    except ValueError as e:
        raise from_constraint(e, field_name) from None


def _failed(out) -> bool:
    return isinstance(out, Exception) or out.finish_reason not in (None, "stop", "length")


def _engine_failure(out) -> OpenAIError:
    if isinstance(out, Exception):
        return from_engine(out)
    log.error("engine request %s ended with %r", out.request_id, out.finish_reason)
    return server_error(f"the engine failed the request: {out.finish_reason}")


# ---- usage ----

@dataclass
class UsageCounter:
    n_prompt: int
    completion: int = 0
    cached: int = 0

    def add(self, out) -> None:
        self.completion += len(out.token_ids_delta)
        self.cached = max(self.cached, out.cached_tokens)

    def usage(self) -> Usage:
        return usage(self.n_prompt, self.completion, self.cached)


def prompt_tokens(requests: list[EngineRequest]) -> int:
    return sum(len(r.prompt_ids) for r in requests)


# ---- non-streamed ----

@dataclass
class Choice:
    text: str = ""
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict] = field(default_factory=list)
    finish_reason: Optional[str] = None
    prompt_logprobs: Optional[list] = None  # per prompt token (None first), when asked
    stop_reason: Optional[str] = None  # the stop string that ended it (vLLM's)
    deltas: list[tuple[str, list[int]]] = field(default_factory=list)  # (text, token ids) per delta: the reasoning split

    def add(self, out) -> None:
        self.text += out.text_delta
        self.deltas.append((out.text_delta, out.token_ids_delta))
        self.token_ids += out.token_ids_delta
        self.logprobs += out.logprobs_delta or ()
        self.finish_reason = out.finish_reason or self.finish_reason
        self.stop_reason = out.stop_reason or self.stop_reason
        if out.prompt_logprobs is not None:
            self.prompt_logprobs = out.prompt_logprobs


async def collect(model: ServedModel, ctx: RequestContext, requests: list[EngineRequest],
                  ticket) -> tuple[dict[int, Choice], Usage]:
    """Runs every choice to its end: {choice index: Choice} and the usage."""
    choices = {r.first_index + i: Choice() for r in requests for i in range(r.params.n)}
    counter = UsageCounter(prompt_tokens(requests))
    obs, outcome = ctx.observer, "abort"
    obs.start(counter.n_prompt, stream=False)
    try:
        async with choice_outputs(model.engine, requests, ctx.draining) as recv:
            async for batch in recv:
                if batch[0] is SHUTDOWN:
                    raise server_error("server shutting down", 503)
                for idx, out in batch:
                    if _failed(out):
                        raise _engine_failure(out)
                    choices[idx].add(out)
                    counter.add(out)
                obs.received(sum(obs.output(out) for _, out in batch))
        outcome = "ok"
    except Exception:
        outcome = "error"
        raise
    finally:
        ticket.release()
        obs.end(outcome)
    return choices, counter.usage()


# ---- streamed ----

class ChunkMaker(Protocol):
    """An endpoint's streamed shapes."""

    def first(self) -> list:
        """Chunks sent at once, before any token."""

    def delta(self, index: int, out) -> list:
        """The chunks of one choice's delta (a StreamOutput)."""

    def usage(self, u: Usage):
        """The closing usage chunk (sent when the client asked for it)."""

    def progress(self, index: int, p) -> list:
        """The chunks that report the prompt's progress (a PromptProgress; asked with return_progress)."""


def stream_events(model: ServedModel, ctx: RequestContext, requests: list[EngineRequest], ticket,
                  chunks: ChunkMaker, include_usage: bool) -> EventStream:
    """The streamed response: every engine step's chunks in one batch, then the usage chunk if asked, then
    DONE. Errors end the stream with an error event and DONE; Cancelled (the client left) ends it silently."""
    return EventStream(_events(model, ctx, requests, ticket, chunks, include_usage))


async def _events(model: ServedModel, ctx: RequestContext, requests: list[EngineRequest], ticket,
                  chunks: ChunkMaker, include_usage: bool) -> AsyncIterator[list]:
    counter = UsageCounter(prompt_tokens(requests))
    stall = StallWatch(ctx.stall_timeout, ctx.on_stall)
    obs, outcome = ctx.observer, "abort"
    obs.start(counter.n_prompt, stream=True)  # here, not before: a body never started never runs its finally
    try:
        yield chunks.first()
        async with choice_outputs(model.engine, requests, ctx.draining, stall, ctx.sse_keepalive) as recv:
            async for batch in recv:
                if batch[0] is SHUTDOWN or batch[0] is STALLED:
                    outcome = "error"
                    yield [_interrupted(batch[0]).body(), DONE]
                    return
                if batch[0] is KEEP_ALIVE:  # written as any batch: a client that does not read stalls it too
                    stall.writing()
                    yield batch
                    stall.written()
                    continue
                events, k, failure = _batch_events(obs, batch, chunks, counter)
                if failure is not None:
                    outcome = "error"
                    yield events + [failure.body(), DONE]
                    return
                obs.writing(k)
                stall.writing()
                yield events
                stall.written()
        yield ([chunks.usage(counter.usage())] if include_usage else []) + [DONE]
        outcome = "ok"
    except Exception as e:  # noqa: BLE001 - a bug; the client still gets a well-formed end
        log.exception("stream failed")
        outcome = "error"
        yield [server_error(f"internal error: {type(e).__name__}: {e}").body(), DONE]
    finally:
        ticket.release()
        obs.end(outcome)


def _interrupted(sentinel) -> OpenAIError:
    if sentinel is SHUTDOWN:
        return server_error("server shutting down", 503)
    return server_error("client stopped reading: request aborted", 408)  # (counted when the watch fired)


def _batch_events(obs, batch: list, chunks: ChunkMaker, counter: UsageCounter) -> tuple[list, int, Optional[OpenAIError]]:
    """The events of a batch's deltas up to its first failure, their token count, and that failure."""
    events, k = [], 0
    for idx, out in batch:
        if _failed(out):
            return events, k, _engine_failure(out)
        k += obs.output(out)
        counter.add(out)
        if out.prompt_progress is not None:
            events.extend(chunks.progress(idx, out.prompt_progress))
        events.extend(chunks.delta(idx, out))
    return events, k, None


# ---- logprobs ----

def _top(entry: dict[int, float], k: int) -> list[tuple[int, float]]:
    return ranked(entry)[:k]


class Pieces:
    """The one rule of a completion's `text`, `tokens` and `text_offset`, echoed prompt and generated part
    alike: each token's entry is the text it adds — what the detokenizer writes for it, so the entries join to
    the text and the running length of the entries is where each starts. A token adds "" for a special
    (control / unknown) token while skip_special_tokens is on (the default, as the generated text does: an
    echoed `<bos>` adds nothing, the echo starts with the prompt, and lm-eval still gets one entry per prompt
    token), "" while its bytes leave a character incomplete (a byte-fallback token; the one completing it
    carries the character), and "" for the stop token that ends a choice (it writes no text); where nothing
    precedes them (`prompt_ids` render nothing) the first text loses a SentencePiece space prefix, as decode
    and the detokenizer drop it. One per echoed prompt and per choice, fed its tokens in order."""

    def __init__(self, model: ServedModel, skip_special: bool, prompt_ids: list[int] = ()):
        self.detok = IncrementalDetokenizer(model.tokenizer, prompt_ids, skip_special)

    def take(self, token_ids: list[int], silent_last: bool = False, final: bool = False) -> list[str]:
        """The entries of the next tokens; `final`: the last ones (what is still held back goes on the last
        token that wrote, as the detokenizer flushes it into the last text)."""
        fed = token_ids[:-1] if silent_last and token_ids else token_ids
        out = [self.detok.add(t) for t in fed]
        if final and (rest := self.detok.flush()):
            if out:
                out[-1] += rest
            else:
                out.append(rest)
        return out + [""] * (len(token_ids) - len(out))


def clip(pieces: list[str], room: int) -> list[str]:
    """The entries cut to the first `room` characters of their text (a stop string cut the text short: the
    tokens that wrote it keep their places, with what of them is left, "" past the end)."""
    out = []
    for p in pieces:
        out.append(p[:max(room, 0)])
        room -= len(p)
    return out


def piece_name(model: ServedModel, tid: int, skip_special: bool) -> str:
    """A token's own text, alone (a top alternative's name)."""
    return model.tokenizer.piece(tid, skip_special).decode("utf-8", errors="replace")


def completion_logprobs(model: ServedModel, token_ids: list[int], pieces: list[str], entries: list, k: int,
                        skip_special: bool, offset: int) -> tuple[CompletionLogprobs, int]:
    """Completions' logprobs: each token's entry (`pieces`, Pieces' rule), its logprob, its top-k as
    {text: logprob} with the token itself always among them (so up to k + 1 entries, as OpenAI), its text
    offset. Returns them with the offset after the last token. An entry may be None (an echoed prompt's
    first token: nothing precedes it), and its logprob and top are then null, as lm-eval reads them."""
    tokens, token_lps, tops, offsets = [], [], [], []
    for tid, text, entry in zip(token_ids, pieces, entries):
        tokens.append(text)
        token_lps.append(None if entry is None else entry.get(tid))
        tops.append(None if entry is None else _tops_with(model, entry, tid, text, k, skip_special))
        offsets.append(offset)
        offset += len(text)
    return CompletionLogprobs.model_construct(tokens=tokens, token_logprobs=token_lps, top_logprobs=tops,
                                              text_offset=offsets), offset


def _tops_with(model: ServedModel, entry: dict, tid: int, name: str, k: int, skip_special: bool) -> dict[str, float]:
    """The top-k named by the same rule (a special alternative "" while skip_special_tokens is on), the token
    under its own `tokens` entry with its own logprob even where another shares that name: lm-eval's greedy
    check compares the best key with the token."""
    best = _top(entry, k)
    if all(t != tid for t, _ in best):
        best.append((tid, entry.get(tid)))
    out: dict[str, float] = {}
    for t, v in best:
        key = name if t == tid else piece_name(model, t, skip_special)
        if t == tid or key not in out:
            out[key] = v
    return out


def vllm_prompt_logprobs(model: ServedModel, prompt_ids: list[int], entries: list, k: int) -> list:
    """vLLM's `prompt_logprobs`: per prompt token None (the first) or {token id: {logprob, rank, decoded_token}}
    for the token and its k best alternatives; the prompt token's rank is unknown (None) when it is not
    among those k."""
    out = []
    for tid, entry in zip(prompt_ids, entries):
        if entry is None:
            out.append(None)
            continue
        outside = len(entry) > k  # the prompt token was added beside the k best
        best = [t for t, _ in ranked(entry) if not (outside and t == tid)]
        rank = {t: i + 1 for i, t in enumerate(best)}
        out.append({str(t): PromptLogprob.model_construct(logprob=v, rank=rank.get(t),
                                                          decoded_token=model.token_text(t)[0])
                    for t, v in entry.items()})
    return out


def chat_logprobs(model: ServedModel, token_ids: list[int], entries: list[dict], k: int) -> list[TokenLogprob]:
    """Chat's logprobs: per token its text, logprob, bytes and top-k alternatives."""
    content = []
    for tid, entry in zip(token_ids, entries):
        text, b = model.token_text(tid)
        top = [TopLogprob.model_construct(token=tt, logprob=v, bytes=list(tb))
               for tt, tb, v in ((*model.token_text(t), v) for t, v in _top(entry, k))]
        content.append(TokenLogprob.model_construct(token=text, logprob=entry.get(tid), bytes=list(b),
                                                    top_logprobs=top))
    return content
