"""/v1/chat/completions: messages → the chat template → one prompt → a ChatCompletionResponse or SSE body."""
from __future__ import annotations

from typing import AsyncIterator, Optional, Union

import trio

from .chat_template import ChatTemplate, ChatTemplateError
from .context import RequestContext
from .errors import bad_request
from .protocol import ChatCompletionRequest, ChatMessage
from .responses import (AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionResponse,
                        ChoiceLogprobs, DeltaMessage, Usage, now)
from .served_model import ServedModel
from .serving_common import Choice, chat_logprobs, collect, engine_requests, stream_events, vllm_prompt_logprobs
from .untrusted_template import UntrustedChatTemplate


class ChatServing:
    def __init__(self, model: ServedModel):
        self.model = model

    async def create(self, req: ChatCompletionRequest,
                     ctx: RequestContext) -> Union[ChatCompletionResponse, AsyncIterator[bytes]]:
        self.model.check_name(req.model)
        self.model.check_text_size(req.text_bytes(), "messages")
        text = await self.render(req.messages, req.chat_template, req.chat_template_kwargs,
                                 req.add_generation_prompt, req.continue_final_message)
        rid = ctx.response_id("chatcmpl")
        ids = self.encode_rendered(text, req.add_special_tokens)
        requests, ticket = await engine_requests(self.model, ctx, rid, req, [ids], "messages")
        shape = _Shapes(self.model, req, rid, requests[0].params.n, ids)
        if not req.stream:
            return shape.response(*await collect(self.model, ctx, requests, ticket))
        return stream_events(self.model, ctx, requests, ticket, shape, req.include_usage)

    async def render(self, messages: list[ChatMessage], template: Optional[str], kwargs: Optional[dict],
                     add_generation_prompt: bool = True, continue_final_message: Optional[bool] = None) -> str:
        """The prompt text, rendered in a worker thread (a template may be slow); with continue_final_message,
        cut after the last message's content, which the model then continues."""
        kind = self._template_kind(template)
        source = template if template is not None else self.model.chat_template
        special = self.model.tokenizer.special_texts()
        dicts = [m.for_template() for m in messages]

        def work() -> str:
            t = kind(source, bos_token=special.get("bos_token") or None, eos_token=special.get("eos_token") or None)
            return t.render(dicts, add_generation_prompt=add_generation_prompt, chat_template_kwargs=kwargs)

        try:
            text = await trio.to_thread.run_sync(work, abandon_on_cancel=True)
        except ChatTemplateError as e:
            raise bad_request(str(e), param="chat_template" if template is not None else "messages",
                              code="chat_template_error") from None
        return _open_final_message(text, dicts[-1]) if continue_final_message else text

    def _template_kind(self, template: Optional[str]) -> type:
        if template is None:
            if self.model.chat_template is None:
                raise bad_request(self.model.no_template_reason, param="messages", code="no_chat_template")
            return ChatTemplate
        if not self.model.trust_request_chat_template:
            raise bad_request("a chat template sent with the request is refused: the server runs model templates "
                              "only unless it is started with --trust-request-chat-template", param="chat_template",
                              code="chat_template_not_allowed")
        return UntrustedChatTemplate

    def encode_rendered(self, text: str, add_special: Optional[bool] = None) -> list[int]:
        """The rendered prompt's ids: the vocabulary's BOS added unless add_special is False (vLLM's
        add_special_tokens); never a second one when the template wrote its own (the tokenizer's rule)."""
        return self.model.tokenizer.encode(text, add_special=add_special is not False, parse_special=True)


def _open_final_message(text: str, final: dict) -> str:
    """The rendered chat cut right after the final message's content, as transformers does for
    continue_final_message (the template's end-of-turn after it is dropped)."""
    content = final.get("content") or ""
    for needle in (content, content.strip()):
        at = text.rfind(needle) if needle else -1
        if at >= 0:
            return text[:at + len(needle)]
    raise bad_request("continue_final_message is set but the final message's content does not appear in the "
                      "rendered prompt", param="messages")


class _Shapes:
    """The response and chunk shapes of one chat request."""

    def __init__(self, model: ServedModel, req: ChatCompletionRequest, rid: str, n: int, prompt_ids: list[int]):
        self.model, self.rid, self.created, self.n = model, rid, now(), n
        self.prompt_ids, self.prompt_top = prompt_ids, req.prompt_logprobs
        self.top = req.logprobs_wanted()  # alternatives per token, None: no logprobs
        self.include_usage = req.include_usage

    def _logprobs(self, token_ids: list[int], entries: list[dict]) -> Optional[ChoiceLogprobs]:
        if self.top is None:
            return None
        return ChoiceLogprobs.model_construct(content=chat_logprobs(self.model, token_ids, entries, self.top),
                                              refusal=None)

    def response(self, choices: dict[int, Choice], u: Usage) -> ChatCompletionResponse:
        out = [ChatChoice.model_construct(
            index=idx, message=AssistantMessage.model_construct(role="assistant", content=c.text, refusal=None),
            logprobs=self._logprobs(c.token_ids, c.logprobs), finish_reason=c.finish_reason)
            for idx, c in sorted(choices.items())]
        extra = {}
        plp = next((c.prompt_logprobs for c in choices.values() if c.prompt_logprobs is not None), None)
        if self.prompt_top is not None and plp is not None:
            extra["prompt_logprobs"] = vllm_prompt_logprobs(self.model, self.prompt_ids, plp, self.prompt_top)
        return ChatCompletionResponse.model_construct(id=self.rid, object="chat.completion", created=self.created,
                                                      model=self.model.name, system_fingerprint=None, choices=out,
                                                      usage=u, **extra)

    def _chunk(self, choices: list, **extra) -> ChatCompletionChunk:
        if self.include_usage and "usage" not in extra:
            extra["usage"] = None
        return ChatCompletionChunk.model_construct(id=self.rid, object="chat.completion.chunk", created=self.created,
                                                   model=self.model.name, system_fingerprint=None, choices=choices,
                                                   **extra)

    def _choice(self, idx: int, delta: DeltaMessage, logprobs=None, finish_reason=None) -> ChatChunkChoice:
        return ChatChunkChoice.model_construct(index=idx, delta=delta, logprobs=logprobs, finish_reason=finish_reason)

    def first(self) -> list:
        return [self._chunk([self._choice(i, DeltaMessage.model_construct(role="assistant", content=""))])
                for i in range(self.n)]

    def delta(self, idx: int, out) -> list:
        res = []
        if out.text_delta or (self.top is not None and out.token_ids_delta):
            lp = self._logprobs(out.token_ids_delta, out.logprobs_delta or [])
            res.append(self._chunk([self._choice(idx, DeltaMessage.model_construct(content=out.text_delta), lp)]))
        if out.finish_reason:
            res.append(self._chunk([self._choice(idx, DeltaMessage.model_construct(), None, out.finish_reason)]))
        return res

    def usage(self, u: Usage) -> ChatCompletionChunk:
        return self._chunk([], usage=u)
