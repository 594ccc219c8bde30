"""/v1/completions: prompts (text or token ids) → engine requests → a CompletionResponse or an SSE body."""
from __future__ import annotations

from typing import AsyncIterator, Optional, Union

from .context import RequestContext
from .protocol import CompletionRequest
from .responses import CompletionChoice, CompletionLogprobs, CompletionResponse, Usage, now
from .served_model import ServedModel
from .serving_common import (Choice, collect, completion_logprobs, engine_requests, stream_events,
                             vllm_prompt_logprobs)


class CompletionServing:
    def __init__(self, model: ServedModel):
        self.model = model

    async def create(self, req: CompletionRequest,
                     ctx: RequestContext) -> Union[CompletionResponse, AsyncIterator[bytes]]:
        self.model.check_name(req.model)
        prompts = [self._ids(p, req.add_special_tokens is not False) for p in req.prompts]
        rid = ctx.response_id("cmpl")
        requests, ticket = await engine_requests(self.model, ctx, rid, req, prompts, "prompt")
        shape = _Shapes(self.model, req, rid, prompts)
        if not req.stream:
            return shape.response(*await collect(self.model, ctx, requests, ticket))
        return stream_events(self.model, ctx, requests, ticket, shape, req.include_usage)

    def _ids(self, prompt: Union[str, list[int]], add_special: bool) -> list[int]:
        if not isinstance(prompt, str):
            return prompt
        self.model.check_text_size(len(prompt.encode()), "prompt")
        return self.model.tokenizer.encode(prompt, add_special=add_special, parse_special=True)


class _Shapes:
    """The response and chunk shapes of one completions request."""

    def __init__(self, model: ServedModel, req: CompletionRequest, rid: str, prompts: list[list[int]]):
        self.model, self.req, self.rid, self.created = model, req, rid, now()
        self.texts = req.prompts  # the echo of a text prompt is its text; of ids, their decoding
        self.prompts = prompts
        self.offsets: dict[int, int] = {}  # choice → text offset of its next token

    def echo(self, index: int) -> str:
        p = index // self.req.n_choices
        if isinstance(self.texts[p], str):
            return self.texts[p]
        return self.model.tokenizer.decode(self.prompts[p], skip_special=self.req.skip_special_tokens is not False)

    def _logprobs(self, token_ids: list[int], entries: list[dict], offset: int):
        """(the logprobs of these tokens or None, the text offset after them)."""
        if self.req.logprobs is None:
            return None, offset
        return completion_logprobs(self.model, token_ids, entries, self.req.logprobs, offset)

    def _with_prompt(self, idx: int, plp: Optional[list], lp):
        """Echo + logprobs: the prompt tokens' entries (first None) ahead of the generated ones, and the offset
        after the prompt part (token texts, as vLLM counts them); else (lp, None)."""
        if not (self.req.echo and lp is not None and plp is not None):
            return lp, None
        head, end = completion_logprobs(self.model, self.prompts[idx // self.req.n_choices], plp,
                                        self.req.logprobs, 0)
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
            lp, _ = self._logprobs(c.token_ids, c.logprobs, 0)
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
        """A chunk for text, for the end, and for tokens whose logprobs were asked even while their text is
        held back (a partial UTF-8 character, a possible stop string): every entry goes out once, in order."""
        first = idx not in self.offsets
        lp, self.offsets[idx] = self._logprobs(out.token_ids_delta, out.logprobs_delta or [], self.offsets.get(idx, 0))
        if first:
            lp, end = self._with_prompt(idx, out.prompt_logprobs, lp)
            if end is not None:
                self.offsets[idx] += end
        if not out.text_delta and not out.finish_reason and lp is None:
            return []
        return [self._chunk([CompletionChoice.model_construct(index=idx, text=out.text_delta, logprobs=lp,
                                                              finish_reason=out.finish_reason,
                                                              **self._extras(idx, out.prompt_logprobs))])]

    def usage(self, u: Usage) -> CompletionResponse:
        return self._body([], usage=u)


def _joined(head, tail, shift: int):
    """The prompt part's logprobs, then the generated part's with its offsets moved past the prompt."""
    return CompletionLogprobs.model_construct(
        tokens=head.tokens + tail.tokens, token_logprobs=head.token_logprobs + tail.token_logprobs,
        top_logprobs=head.top_logprobs + tail.top_logprobs,
        text_offset=head.text_offset + [o + shift for o in tail.text_offset])
