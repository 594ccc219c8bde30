"""A streamed chat completion (its chunk EventStream) as the Responses API's named events, each with a
sequence_number: created, in_progress, per output item added / deltas / done, completed (or failed)."""
from __future__ import annotations

from typing import Callable, Optional

from ..base.streaming import DONE, KEEP_ALIVE, EventStream, Named
from .object import response_object
from .protocol import ResponsesRequest


class _Translator:
    def __init__(self, req: ResponsesRequest, keep: Optional[Callable[[dict], None]]):
        self.req, self.seq, self.rid, self.model, self.keep = req, 0, None, None, keep
        self.text: Optional[dict] = None  # the open message item
        self.calls: dict[int, dict] = {}  # tool-call index → its function_call item
        self.output: list[dict] = []  # items in output order
        self.usage = None

    def ev(self, kind: str, **fields) -> Named:
        self.seq += 1
        return Named(kind, {"type": kind, "sequence_number": self.seq - 1, **fields})

    def resp(self, status: str) -> dict:
        return response_object(self.rid, self.model, self.req, self.output, self.usage, status)

    def start(self, chunk) -> list:
        self.rid, self.model = "resp_" + chunk.id.removeprefix("chatcmpl-"), chunk.model
        return [self.ev("response.created", response=self.resp("in_progress")),
                self.ev("response.in_progress", response=self.resp("in_progress"))]

    def _added(self, item: dict) -> Named:
        self.output.append(item)
        return self.ev("response.output_item.added", output_index=len(self.output) - 1, item=item)

    def reasoning(self, delta: str) -> list:
        """Reasoning deltas (the chat layer's reasoning_content) as a reasoning item's reasoning_text."""
        item = next((i for i in self.output if i["type"] == "reasoning"), None)
        out = []
        if item is None:
            item = {"type": "reasoning", "id": f"rs_{self.rid}", "summary": [],
                    "content": [{"type": "reasoning_text", "text": ""}], "status": "in_progress"}
            out.append(self._added(item))
        item["content"][0]["text"] += delta
        return out + [self.ev("response.reasoning_text.delta", item_id=item["id"], delta=delta,
                              output_index=self.output.index(item), content_index=0)]

    def content(self, delta: str) -> list:
        out = []
        if self.text is None:
            self.text = {"type": "message", "id": f"msg_{self.rid}", "status": "in_progress", "role": "assistant",
                         "content": []}
            out += [self._added(self.text),
                    self.ev("response.content_part.added", item_id=self.text["id"], output_index=len(self.output) - 1,
                            content_index=0, part={"type": "output_text", "text": "", "annotations": []})]
            self.text["content"].append({"type": "output_text", "text": "", "annotations": []})
        self.text["content"][0]["text"] += delta
        return out + [self.ev("response.output_text.delta", item_id=self.text["id"], delta=delta, logprobs=[],
                              output_index=self.output.index(self.text), content_index=0)]

    def call(self, entry: dict) -> list:
        out, f = [], entry.get("function") or {}
        item = self.calls.get(entry["index"])
        if item is None:
            item = {"type": "function_call", "id": f"fc_{self.rid}_{entry['index']}", "call_id": entry.get("id"),
                    "name": f.get("name"), "arguments": "", "status": "in_progress"}
            self.calls[entry["index"]] = item
            out.append(self._added(item))
        if f.get("arguments"):
            item["arguments"] += f["arguments"]
            out.append(self.ev("response.function_call_arguments.delta", item_id=item["id"],
                               output_index=self.output.index(item), delta=f["arguments"]))
        return out

    def chunk(self, chunk) -> list:
        if self.rid is None:
            return self.start(chunk)
        if getattr(chunk, "usage", None) is not None and not chunk.choices:
            self.usage = chunk.usage
        out = []
        for c in chunk.choices:
            d = c.delta
            if getattr(d, "reasoning_content", None):
                out += self.reasoning(d.reasoning_content)
            if getattr(d, "content", None):
                out += self.content(d.content)
            for entry in getattr(d, "tool_calls", None) or []:
                out += self.call(entry)
        return out

    def _item_done(self, i: int, item: dict) -> list:
        item["status"] = "completed"
        if item["type"] == "function_call":
            return [self.ev("response.function_call_arguments.done", item_id=item["id"], output_index=i,
                            arguments=item["arguments"], name=item["name"]),
                    self.ev("response.output_item.done", output_index=i, item=item)]
        part = item["content"][0]
        if item["type"] == "reasoning":
            return [self.ev("response.reasoning_text.done", item_id=item["id"], output_index=i, content_index=0,
                            text=part["text"]),
                    self.ev("response.output_item.done", output_index=i, item=item)]
        return [self.ev("response.output_text.done", item_id=item["id"], output_index=i, content_index=0,
                        text=part["text"], logprobs=[]),
                self.ev("response.content_part.done", item_id=item["id"], output_index=i, content_index=0, part=part),
                self.ev("response.output_item.done", output_index=i, item=item)]

    def finish(self) -> list:
        out = []
        for i, item in enumerate(self.output):
            out += self._item_done(i, item)
        resp = self.resp("completed")
        if self.keep:
            self.keep(resp)  # stored before the client can see its id
        return out + [self.ev("response.completed", response=resp)]

    def failed(self, body: dict) -> list:
        err = body.get("error", {})
        return [self.ev("error", code=err.get("code"), message=err.get("message", ""), param=err.get("param")),
                self.ev("response.failed", response={**self.resp("failed"),
                                                      "error": {"code": "server_error",
                                                                "message": err.get("message", "")}})]


async def _events(chat: EventStream, req: ResponsesRequest, keep):
    t = _Translator(req, keep)
    async for batch in chat.batches:
        out = []
        for item in batch:
            if item is DONE:
                continue
            if item is KEEP_ALIVE:
                out.append(item)
                continue
            if isinstance(item, dict):  # an error body: the stream ends after it
                out += t.failed(item)
                yield out
                return
            out += t.chunk(item)
        if out:
            yield out
    yield t.finish()


def responses_events(chat: EventStream, req: ResponsesRequest,
                     keep: Optional[Callable[[dict], None]] = None) -> EventStream:
    """`keep(response)`: called with the completed Response (to store it)."""
    return EventStream(_events(chat, req, keep))
