"""/v1/completions: prompts (text or token ids) → engine requests → a CompletionResponse or an SSE body."""
from __future__ import annotations

from typing import Optional, Union

from ...engine.output_processor import RequestState
from ..base.context import RequestContext
from ..base.protocol import now
from ..base.replies import CompletionLogprobs, Usage
from ..base.served_model import ServedModel
from ..base.serving import (Choice, Pieces, clip, collect, completion_logprobs, engine_requests, stream_events,
                            vllm_prompt_logprobs)
from ..base.streaming import EventStream
from .fim import FimParts, check_sizes, fim_prompt
from .protocol import CompletionChoice, CompletionRequest, CompletionResponse


class CompletionServing:
    def __init__(self, model: ServedModel):
        self.model = model

    async def create(self, req: CompletionRequest,
                     ctx: RequestContext) -> Union[CompletionResponse, EventStream]:
        self.model.check_name(req.model)
        prompts = [self._ids(p, req) for p in req.prompts]
        rid = ctx.response_id("cmpl")
        requests, ticket = await engine_requests(self.model, ctx, rid, req, prompts, "prompt")
        shape = _Shapes(self.model, req, rid, prompts, silent_ids(self.model, requests[0].params))
        if not req.stream:
            return shape.response(*await collect(self.model, ctx, requests, ticket))
        return stream_events(self.model, ctx, requests, ticket, shape, req.include_usage)

    def _ids(self, prompt: Union[str, list[int]], req: CompletionRequest) -> list[int]:
        """The prompt's token ids; with a `suffix`, the fill-in-the-middle layout of prompt and suffix (fim.py)."""
        if isinstance(prompt, str):
            self.model.check_text_size(len(prompt.encode()), "prompt", factor=8 if req.suffix else 1)
        if req.suffix:
            check_sizes(self.model, {"suffix": len(req.suffix.encode())})
            return fim_prompt(self.model, FimParts(prompt, req.suffix), req.max_tokens, "suffix")
        if not isinstance(prompt, str):
            return prompt
        return self.model.tokenizer.encode(prompt, add_special=req.add_special_tokens is not False,
                                           parse_special=True)


def silent_ids(model: ServedModel, params) -> frozenset:
    """The ids that end a choice ("stop") without writing text: the output processor's own set."""
    return RequestState.for_params(model.tokenizer, [], params).stop_ids


class _Shapes:
    """The response and chunk shapes of one completions request. Its text, `tokens` and `text_offset` follow
    one rule (base/serving.py: Pieces): the echo is the prompt's pieces joined, each entry a piece."""

    def __init__(self, model: ServedModel, req: CompletionRequest, rid: str, prompts: list[list[int]],
                 silent_ids: frozenset):
        self.model, self.req, self.rid, self.created = model, req, rid, now()
        self.prompts, self.silent_ids = prompts, silent_ids
        self.skip = req.skip_special_tokens is not False
        self.echoes = [Pieces(model, self.skip).take(p, final=True) for p in prompts] if req.echo else None
        self.pieces: dict[int, Pieces] = {}  # choice → its tokens' entries so far
        self.written: dict[int, int] = {}  # choice → characters its released entries hold
        self.pending: dict[int, list] = {}  # choice → (token, entry, logprobs) its text does not cover yet
        self.text_len: dict[int, int] = {}  # choice → characters of its text so far (streamed)
        self.offsets: dict[int, int] = {}  # choice → text offset of its next token

    def echo(self, index: int) -> str:
        return "".join(self.echoes[index // self.req.n_choices])

    def _ready(self, idx: int, token_ids: list[int], entries: list, finish: Optional[str],
               text_len: int) -> list[tuple]:
        """The choice's (token, entry in `tokens`, logprobs entry) that its text (`text_len` characters so far)
        now covers, in order: a token whose text is held back (a possible stop string) waits with it, and at
        the end what is left is cut where the text ends (a stop string cut it); the token that ends it "stop"
        adds nothing."""
        if idx not in self.pieces:
            self.pieces[idx] = Pieces(self.model, self.skip, self.prompts[idx // self.req.n_choices])
        silent = finish == "stop" and bool(token_ids) and token_ids[-1] in self.silent_ids
        pending = self.pending.setdefault(idx, [])
        pending += zip(token_ids, self.pieces[idx].take(token_ids, silent, final=finish is not None), entries)
        written, n = self.written.get(idx, 0), 0
        if finish is not None:
            cut = clip([p for _, p, _ in pending], text_len - written)
            pending[:] = [(t, c, e) for (t, _, e), c in zip(pending, cut)]
            n = len(pending)
        while n < len(pending) and written + len(pending[n][1]) <= text_len:
            written, n = written + len(pending[n][1]), n + 1
        self.written[idx] = written if finish is None else text_len
        ready, pending[:] = pending[:n], pending[n:]
        return ready

    def _logprobs(self, idx: int, token_ids: list[int], entries: list[dict], offset: int, finish: Optional[str],
                  text_len: int):
        """(the logprobs of the tokens ready (`_ready`) or None, the text offset after them)."""
        if self.req.logprobs is None:
            return None, offset
        ready = self._ready(idx, token_ids, entries, finish, text_len)
        return completion_logprobs(self.model, [t for t, _, _ in ready], [p for _, p, _ in ready],
                                   [e for _, _, e in ready], self.req.logprobs, self.skip, offset)

    def _with_prompt(self, idx: int, plp: Optional[list], lp):
        """Echo + logprobs: the prompt tokens' entries (first None) ahead of the generated ones, and the offset
        after the prompt part (the echo's length); else (lp, None)."""
        if not (self.req.echo and lp is not None and plp is not None):
            return lp, None
        p = idx // self.req.n_choices
        head, end = completion_logprobs(self.model, self.prompts[p], self.echoes[p], plp, self.req.logprobs,
                                        self.skip, 0)
        return _joined(head, lp, end), end

    def _extras(self, idx: int, plp: Optional[list]) -> dict:
        """vLLM's prompt_logprobs field, when asked."""
        if self.req.prompt_logprobs is None or plp is None:
            return {}
        ids = self.prompts[idx // self.req.n_choices]
        return {"prompt_logprobs": vllm_prompt_logprobs(self.model, ids, plp, self.req.prompt_logprobs)}

    def _body(self, choices: list, **extra) -> CompletionResponse:
        return CompletionResponse.model_construct(id=self.rid, object="text_completion", created=self.created,
                                                  model=self.model.name, system_fingerprint=None, choices=choices,
                                                  **extra)

    def response(self, choices: dict[int, Choice], u: Usage) -> CompletionResponse:
        out = []
        for idx in sorted(choices):
            c = choices[idx]
            text = (self.echo(idx) if self.req.echo else "") + c.text
            lp, _ = self._logprobs(idx, c.token_ids, c.logprobs, 0, c.finish_reason, len(c.text))
            lp, _ = self._with_prompt(idx, c.prompt_logprobs, lp)
            out.append(CompletionChoice.model_construct(index=idx, text=text, finish_reason=c.finish_reason,
                                                        logprobs=lp, **self._extras(idx, c.prompt_logprobs)))
        return self._body(out, usage=u)

    def _chunk(self, choices: list) -> CompletionResponse:
        return self._body(choices, usage=None) if self.req.include_usage else self._body(choices)

    def first(self) -> list:
        if not self.req.echo:
            return []
        n = len(self.prompts) * self.req.n_choices
        return [self._chunk([CompletionChoice.model_construct(index=i, text=self.echo(i), logprobs=None,
                                                              finish_reason=None)]) for i in range(n)]

    def delta(self, idx: int, out) -> list:
        """A chunk for text, for the end, and for tokens whose logprobs were asked once their text is out (a
        token's entry waits while a possible stop string holds its text back): every entry goes out once, in
        order, with the text it is an entry of."""
        first = idx not in self.offsets
        self.text_len[idx] = self.text_len.get(idx, 0) + len(out.text_delta)
        lp, self.offsets[idx] = self._logprobs(idx, out.token_ids_delta, out.logprobs_delta or [],
                                               self.offsets.get(idx, 0), out.finish_reason, self.text_len[idx])
        if first:
            lp, end = self._with_prompt(idx, out.prompt_logprobs, lp)
            if end is not None:
                self.offsets[idx] += end
        if not out.text_delta and not out.finish_reason and (lp is None or not lp.tokens):
            return []
        return [self._chunk([CompletionChoice.model_construct(index=idx, text=out.text_delta, logprobs=lp,
                                                              finish_reason=out.finish_reason,
                                                              **self._extras(idx, out.prompt_logprobs))])]

    def usage(self, u: Usage) -> CompletionResponse:
        return self._body([], usage=u)

    def progress(self, idx: int, p) -> list:
        choice = CompletionChoice.model_construct(index=idx, text="", logprobs=None, finish_reason=None)
        extra = {"usage": None} if self.req.include_usage else {}
        return [self._body([choice], prompt_progress=p.to_dict(), **extra)]


def _joined(head, tail, shift: int):
    """The prompt part's logprobs, then the generated part's with its offsets moved past the prompt."""
    return CompletionLogprobs.model_construct(
        tokens=head.tokens + tail.tokens, token_logprobs=head.token_logprobs + tail.token_logprobs,
        top_logprobs=head.top_logprobs + tail.top_logprobs,
        text_offset=head.text_offset + [o + shift for o in tail.text_offset])
