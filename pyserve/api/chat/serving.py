"""/v1/chat/completions: messages → the chat template → one prompt → a ChatCompletionResponse or SSE body."""
from __future__ import annotations

import functools
from typing import Optional, Union

import trio

from ..base.context import RequestContext
from ..base.errors import bad_request, from_template
from ..base.protocol import now
from ..base.replies import ChoiceLogprobs, Usage, with_reasoning_tokens
from ..base.served_model import ServedModel
from ..base.serving import (Choice, chat_logprobs, check_constraint, collect, engine_requests, stream_events,
                            vllm_prompt_logprobs)
from ..base.streaming import EventStream
from ..template.chat_template import ChatTemplate, ChatTemplateError, decode_tool_call_arguments
from ..template.untrusted_template import UntrustedChatTemplate
from .protocol import (AssistantMessage, ChatChoice, ChatChunkChoice, ChatCompletionChunk, ChatCompletionRequest,
                       ChatCompletionResponse, ChatPrompt, DeltaMessage)
from .reasoning import detect_reasoning_parser
from .reasoning.plan import ReasoningPlan, message_fields
from .tool_parsers import ParseResult, detect_tool_parser
from .tools import ToolPlan


class ChatServing:
    def __init__(self, model: ServedModel):
        self.model = model

    async def create(self, req: ChatCompletionRequest,
                     ctx: RequestContext) -> Union[ChatCompletionResponse, EventStream]:
        self.model.check_name(req.model)
        self.model.check_text_size(req.text_bytes(), "messages")
        plan = self.tool_plan(req)
        await check_constraint(self.model, plan.check(), "tools")
        prompt = await self.render(req, plan)
        ids = self.encode_rendered(prompt, req.add_special_tokens)
        rid = ctx.response_id("chatcmpl")
        tools = plan.constraint()
        thinking = self.reasoning_plan(req)
        # a parser that reads [TOOL_CALLS], <|python_tag|> or <|channel|> must see those control tokens in the text
        constraint = thinking.constraint(prompt, *((tools, "tools") if tools is not None else req.structured()))
        requests, ticket = await engine_requests(self.model, ctx, rid, req, [ids], "messages", constraint,
                                                 plan.reads_markers or thinking.active)
        shape = _Shapes(self.model, req, rid, requests[0].params.n, ids, plan, (thinking, prompt))
        if not req.stream:
            return shape.response(*await collect(self.model, ctx, requests, ticket))
        return stream_events(self.model, ctx, requests, ticket, shape, req.include_usage)

    def tool_parser(self, template: Optional[str]) -> Optional[str]:
        """The tool-call family of the template in use (--tool-call-parser wins; None: it renders no tools)."""
        if self.model.tool_call_parser:
            return self.model.tool_call_parser
        source = template if template is not None else self.model.chat_template
        return _detect(source) if source is not None else None

    def reasoning_plan(self, req: ChatPrompt) -> ReasoningPlan:
        """The reasoning format of the template in use (--reasoning-parser wins; none: no split) and the
        request's reasoning options."""
        name = self.model.reasoning_parser
        if name == "auto":
            source = req.chat_template if req.chat_template is not None else self.model.chat_template
            name = _detect_reasoning(source) if source is not None else None
        budget = getattr(req, "thinking_token_budget", None)
        if budget is None and self.model.reasoning_budget >= 0:
            budget = self.model.reasoning_budget
        return ReasoningPlan(None if name == "none" else name, getattr(req, "reasoning_effort", None),
                             req.chat_template_kwargs, budget)

    def tool_plan(self, req: ChatPrompt) -> ToolPlan:
        """What the request's tools make of its prompt and its output, for the template it renders with."""
        return ToolPlan.of(req, self.tool_parser(req.chat_template))

    async def prompt_ids(self, req: ChatPrompt, plan: ToolPlan) -> list[int]:
        """The token ids the model gets for the request (chat completions, /tokenize with messages)."""
        return self.encode_rendered(await self.render(req, plan), req.add_special_tokens)

    async def render(self, req: ChatPrompt, plan: ToolPlan) -> str:
        """The one rendering of a chat prompt (chat completions, /apply-template, /tokenize): the messages
        (the tools written into them for a template that knows none), the template's `tools`, its kwargs,
        in a worker thread (a template may be slow); with continue_final_message, cut after the last
        message's content, which the model then continues."""
        template = req.chat_template
        kind = self._template_kind(template)
        source = template if template is not None else self.model.chat_template
        special = self.model.tokenizer.special_texts()
        dicts = plan.messages(decode_tool_call_arguments([m.for_template() for m in req.messages]))
        tools = plan.template_tools()
        kwargs = self.reasoning_plan(req).template_kwargs()

        def work() -> str:
            t = kind(source, bos_token=special.get("bos_token") or None, eos_token=special.get("eos_token") or None)
            return t.render(dicts, add_generation_prompt=req.add_generation_prompt, tools=tools,
                            chat_template_kwargs=kwargs)

        try:
            text = await trio.to_thread.run_sync(work, abandon_on_cancel=True)
        except ChatTemplateError as e:
            raise from_template(e, "chat_template" if template is not None else "messages") from None
        return _open_final_message(text, dicts[-1]) if req.continue_final_message else text

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


@functools.lru_cache(maxsize=32)
def _detect(source: str) -> Optional[str]:
    return detect_tool_parser(source)


@functools.lru_cache(maxsize=32)
def _detect_reasoning(source: str) -> Optional[str]:
    return detect_reasoning_parser(source)


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

    def __init__(self, model: ServedModel, req: ChatCompletionRequest, rid: str, n: int, prompt_ids: list[int],
                 plan: ToolPlan, thinking: tuple[ReasoningPlan, str]):
        """thinking: the request's reasoning plan and its rendered prompt (whose end tells where the output starts)."""
        self.model, self.rid, self.created, self.n = model, rid, now(), n
        self.prompt_ids, self.prompt_top = prompt_ids, req.prompt_logprobs
        self.top = req.logprobs_wanted()  # alternatives per token, None: no logprobs
        self.include_usage = req.include_usage
        self.plan = plan
        self.parsers = {}  # streamed: choice index → its tool-call parser (tools only)
        self.called = set()  # streamed: choices that made a tool call
        self.thinking, self.prompt = thinking
        self.splits = {}  # choice index → its reasoning split (a reasoning parser only)

    def _logprobs(self, token_ids: list[int], entries: list[dict]) -> Optional[ChoiceLogprobs]:
        if self.top is None:
            return None
        return ChoiceLogprobs.model_construct(content=chat_logprobs(self.model, token_ids, entries, self.top),
                                              refusal=None)

    def _split(self, idx: int):
        """The choice's reasoning split (None: no reasoning parser)."""
        if idx not in self.splits:
            self.splits[idx] = self.thinking.split(self.prompt, self._piece)
        return self.splits[idx]

    def _piece(self, tid: int) -> str:
        return self.model.tokenizer.piece(tid, False).decode("utf-8", errors="replace")

    def _message(self, idx: int, c: Choice) -> tuple[AssistantMessage, Optional[str]]:
        """The choice's message and finish reason: the reasoning split off, then tool calls parsed out of the
        content when the request has tools."""
        split = self._split(idx)
        reasoning, text = split.whole(c.deltas) if split is not None else ("", c.text)
        extra = message_fields(reasoning)
        parser = self.plan.parser()
        if parser is None:
            return AssistantMessage.model_construct(role="assistant", content=text, refusal=None,
                                                    **extra), c.finish_reason
        parsed: ParseResult = parser.parse(text)
        if not parsed.tool_calls:
            return AssistantMessage.model_construct(role="assistant", content=parsed.content or "",
                                                    refusal=None, **extra), c.finish_reason
        calls = [t.to_openai() for t in parsed.tool_calls]
        return (AssistantMessage.model_construct(role="assistant", content=parsed.content, refusal=None,
                                                 tool_calls=calls, **extra), _calls_finish(c.finish_reason))

    def _usage(self, u: Usage) -> Usage:
        """The usage, with the reasoning tokens when a reasoning parser reads the output."""
        if not self.thinking.active:
            return u
        return with_reasoning_tokens(u, sum(s.tokens for s in self.splits.values() if s is not None))

    def response(self, choices: dict[int, Choice], u: Usage) -> ChatCompletionResponse:
        out = []
        for idx, c in sorted(choices.items()):
            message, finish = self._message(idx, c)
            out.append(ChatChoice.model_construct(index=idx, message=message,
                                                  logprobs=self._logprobs(c.token_ids, c.logprobs),
                                                  finish_reason=finish, **_stop_reason(c.stop_reason)))
        extra = {}
        plp = next((c.prompt_logprobs for c in choices.values() if c.prompt_logprobs is not None), None)
        if self.prompt_top is not None and plp is not None:
            extra["prompt_logprobs"] = vllm_prompt_logprobs(self.model, self.prompt_ids, plp, self.prompt_top)
        return ChatCompletionResponse.model_construct(id=self.rid, object="chat.completion", created=self.created,
                                                      model=self.model.name, system_fingerprint=None, choices=out,
                                                      usage=self._usage(u), **extra)

    def _chunk(self, choices: list, **extra) -> ChatCompletionChunk:
        if self.include_usage and "usage" not in extra:
            extra["usage"] = None
        return ChatCompletionChunk.model_construct(id=self.rid, object="chat.completion.chunk", created=self.created,
                                                   model=self.model.name, system_fingerprint=None, choices=choices,
                                                   **extra)

    def _choice(self, idx: int, delta: DeltaMessage, logprobs=None, finish_reason=None, **extra) -> ChatChunkChoice:
        return ChatChunkChoice.model_construct(index=idx, delta=delta, logprobs=logprobs, finish_reason=finish_reason,
                                               **extra)

    def first(self) -> list:
        return [self._chunk([self._choice(i, DeltaMessage.model_construct(role="assistant", content=""))])
                for i in range(self.n)]

    def delta(self, idx: int, out) -> list:
        res = []
        message = self._delta_message(idx, out)
        if message is not None or (self.top is not None and out.token_ids_delta):
            lp = self._logprobs(out.token_ids_delta, out.logprobs_delta or [])
            res.append(self._chunk([self._choice(idx, message or DeltaMessage.model_construct(content=""), lp)]))
        if out.finish_reason:
            finish = _calls_finish(out.finish_reason) if idx in self.called else out.finish_reason
            res.append(self._chunk([self._choice(idx, DeltaMessage.model_construct(), None, finish,
                                                 **_stop_reason(out.stop_reason))]))
        return res

    def _delta_message(self, idx: int, out) -> Optional[DeltaMessage]:
        """The text delta as a message delta: content, and with tools the parser's tool-call entries (its
        held-back text goes out at the choice's end). None when there is nothing to send."""
        split = self._split(idx)
        reasoning, text = "", out.text_delta
        if split is not None:
            r = split.feed(out.text_delta, out.token_ids_delta, final=bool(out.finish_reason))
            reasoning, text = r.reasoning, r.content
        extra = message_fields(reasoning)
        if not self.plan.active:
            return DeltaMessage.model_construct(content=text or None, **extra) if text or extra else None
        parser = self.parsers.get(idx) or self.parsers.setdefault(idx, self.plan.parser())
        d = parser.feed(text)
        if out.finish_reason:
            end = parser.finish()
            d.content += end.content
            d.tool_calls = _merge_entries(d.tool_calls + end.tool_calls)
        if d.tool_calls:
            self.called.add(idx)
            return DeltaMessage.model_construct(content=d.content or None, tool_calls=d.tool_calls, **extra)
        return DeltaMessage.model_construct(content=d.content or None, **extra) if d.content or extra else None

    def usage(self, u: Usage) -> ChatCompletionChunk:
        return self._chunk([], usage=self._usage(u))

    def progress(self, idx: int, p) -> list:
        return [self._chunk([self._choice(idx, DeltaMessage.model_construct())], prompt_progress=p.to_dict())]


def _stop_reason(matched: Optional[str]) -> dict:
    """vLLM's stop_reason, set only when a stop string ended the choice (so other responses keep their shape)."""
    return {"stop_reason": matched} if matched is not None else {}


def _calls_finish(reason: Optional[str]) -> Optional[str]:
    """A choice that ends in tool calls finishes "tool_calls" (not "stop"); a cut or a failure says so."""
    return "tool_calls" if reason == "stop" else reason


def _merge_entries(entries: list[dict]) -> list[dict]:
    """One entry per call index (openai-python merges two of one index in a chunk wrongly): arguments joined."""
    out: dict[int, dict] = {}
    for e in entries:
        if e["index"] not in out:
            out[e["index"]] = {**e, "function": dict(e["function"])}
        else:
            f = out[e["index"]]["function"]
            f["arguments"] = f.get("arguments", "") + e["function"].get("arguments", "")
    return list(out.values())
