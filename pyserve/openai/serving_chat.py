"""/v1/chat/completions: the chat template, then the same generation as completions."""
from __future__ import annotations

from typing import Optional

import trio
from quart import Response

from .chat_template import ChatTemplate, ChatTemplateError
from .protocol import GenRequest, bad_request, new_id, now, usage
from .serving_completions import Serving, json_response


def _flatten(messages: list) -> list:
    """Text parts joined into one string, which every template understands."""
    out = []
    for m in messages:
        c = m.get("content")
        if isinstance(c, list):
            m = dict(m, content="\n".join(str(p.get("text", "")) for p in c))
        out.append(m)
    return out


class ChatServing(Serving):
    async def render(self, messages: list, template: Optional[str], kwargs: Optional[dict],
                     add_generation_prompt: bool = True) -> str:
        source = template if template is not None else self.state.chat_template
        if source is None:
            raise bad_request(self.state.no_template_reason, param="messages", code="no_chat_template")
        special = self.state.tokenizer.special_texts()

        def work() -> str:
            t = ChatTemplate(source, bos_token=special.get("bos_token") or None,
                             eos_token=special.get("eos_token") or None)
            return t.render(_flatten(messages), add_generation_prompt=add_generation_prompt,
                            chat_template_kwargs=kwargs)

        try:
            return await trio.to_thread.run_sync(work, abandon_on_cancel=True)
        except ChatTemplateError as e:
            raise bad_request(str(e), param="chat_template" if template is not None else "messages",
                              code="chat_template_error") from None

    def encode_rendered(self, text: str) -> list[int]:
        """No doubled BOS: a template that writes the BOS text itself gets no second one."""
        tok = self.state.tokenizer
        bos = tok.special_texts().get("bos_token") or None
        return tok.encode(text, add_special=not (bos and text.startswith(bos)), parse_special=True)

    async def create(self, req: GenRequest) -> Response:
        model = self.check_model(req)
        text = await self.render(req.messages, req.chat_template, req.chat_template_kwargs,
                                 req.add_generation_prompt)
        ids = self.encode_rendered(text)
        self.check_ids(ids, "messages")
        rid, created = new_id("chatcmpl"), now()
        jobs = self.jobs(rid, req, [ids], "max_completion_tokens")
        want_lp = req.top_logprobs is not None

        def base(obj: str, choices: list) -> dict:
            return {"id": rid, "object": obj, "created": created, "model": model, "system_fingerprint": None,
                    "choices": choices}

        if not req.stream:
            res = await self.collect(jobs)
            choices = []
            for idx in sorted(res):
                r = res[idx]
                lp = ({"content": self.logprobs(r["token_ids"], r["logprobs"], req.top_logprobs), "refusal": None}
                      if want_lp else None)
                choices.append({"index": idx, "message": {"role": "assistant", "content": r["text"], "refusal": None},
                                "logprobs": lp, "finish_reason": r["finish_reason"]})
            out = base("chat.completion", choices)
            out["usage"] = usage(len(ids), sum(len(r["token_ids"]) for r in res.values()),
                                 max(r["cached"] for r in res.values()))
            return json_response(out)

        n_gen = {"n": 0, "cached": 0}

        def chunk(choice: dict) -> dict:
            c = base("chat.completion.chunk", [choice])
            if req.include_usage:
                c["usage"] = None
            return c

        def first() -> list[dict]:
            return [chunk({"index": j.index, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                           "finish_reason": None}) for j in jobs]

        def chunks(idx: int, out) -> list[dict]:
            n_gen["n"] += len(out.token_ids_delta)
            n_gen["cached"] = max(n_gen["cached"], out.cached_tokens)
            res = []
            if out.text_delta or (want_lp and out.token_ids_delta):
                lp = ({"content": self.logprobs(out.token_ids_delta, out.logprobs_delta or [], req.top_logprobs),
                       "refusal": None} if want_lp else None)
                res.append(chunk({"index": idx, "delta": {"content": out.text_delta}, "logprobs": lp,
                                  "finish_reason": None}))
            if out.finish_reason:
                res.append(chunk({"index": idx, "delta": {}, "logprobs": None, "finish_reason": out.finish_reason}))
            return res

        def usage_chunk() -> dict:
            c = base("chat.completion.chunk", [])
            c["usage"] = usage(len(ids), n_gen["n"], n_gen["cached"])
            return c

        return self.stream(jobs, first, chunks, usage_chunk if req.include_usage else None)

    def logprobs(self, token_ids: list[int], entries: list[dict], k: int) -> list[dict]:
        content = []
        for tid, entry in zip(token_ids, entries):
            text, b = self.token_text(tid)
            top = []
            for t, lp in self.top_entries(entry, k):
                tt, tb = self.token_text(t)
                top.append({"token": tt, "logprob": lp, "bytes": list(tb)})
            content.append({"token": text, "logprob": entry.get(tid), "bytes": list(b), "top_logprobs": top})
        return content
