"""/v1/responses with `background: true`: the queued Response at once, the generation as a job (jobs.py)
whose states (queued → in_progress → completed / failed / cancelled) the response store holds for
GET /v1/responses/{id}; POST /v1/responses/{id}/cancel ends it."""
from __future__ import annotations

import dataclasses
import logging
from functools import partial
from typing import Callable, Optional

import trio

from ..base.context import NullObserver, RequestContext
from ..base.errors import OpenAIError, bad_request
from .items import input_items, output_message
from .jobs import BackgroundJobs
from .object import response_object
from .protocol import ResponsesRequest
from .serving import ResponsesServing, completed
from .store import ResponseStore

log = logging.getLogger("pyserve.server")


def check_background(req: ResponsesRequest, store_enabled: bool) -> None:
    """400 for what a background response cannot be: unstored (nothing to poll), streamed."""
    if req.store is False or not store_enabled:
        raise bad_request("background responses need the response store: send store=true to a server with "
                          "--response-store-size above 0", param="background")
    if req.stream:
        raise bad_request("streaming a background response is not served; poll GET /v1/responses/{id}",
                          param="stream")


class BackgroundServing:
    def __init__(self, responses: ResponsesServing, jobs: BackgroundJobs):
        self.responses, self.store, self.jobs = responses, responses.store, jobs

    def start(self, req: ResponsesRequest, ctx: RequestContext, nursery: trio.Nursery,
              release: Callable[[], None]) -> dict:
        """Stores the queued Response and starts its generation in `nursery`; `release` (the model lease) is
        called when the job ends, however it ends."""
        check_background(req, self.store.enabled)
        conversation, creq = self.responses.prepare(req, ctx)
        rid = f"resp_{ctx.request_id}"
        queued = response_object(rid, self.responses.chat.model.name, req, [], None, "queued")
        queued["background"] = True
        self.store.put(ctx.owner, queued, conversation, input_items(req, rid), background=True)
        # no client is attached: nothing to time, nothing that can stall
        ctx = dataclasses.replace(ctx, observer=NullObserver(), stall_timeout=0.0)
        self.jobs.start(nursery, rid, partial(self._generate, req, creq, ctx, queued, conversation),
                        release)
        return queued

    async def _generate(self, req, creq, ctx: RequestContext, queued: dict, conversation: list) -> None:
        rid = queued["id"]
        self.store.replace(rid, {**queued, "status": "in_progress"})
        try:
            resp = completed(req, await self.responses.chat.create(creq, ctx), rid)
        except OpenAIError as e:
            self.store.replace(rid, _failed(queued, e.code or e.type, e.message))
            return
        except Exception as e:  # noqa: BLE001 - a bug of ours: the response fails, the server goes on
            log.exception("background response %s failed", rid)
            self.store.replace(rid, _failed(queued, "server_error", f"internal error: {type(e).__name__}"))
            return
        resp["background"] = True
        self.store.replace(rid, resp, conversation + [output_message(resp["output"])])


def cancel_background(store: ResponseStore, jobs: BackgroundJobs, owner: Optional[str], rid: str) -> dict:
    """Cancels a queued or running background response (404 unknown, 400 one that was not background);
    one that already ended is returned as it is."""
    entry = store.get(owner, rid)
    if not entry.background:
        raise bad_request("Cannot cancel a synchronous response.", param="response_id")
    if not jobs.cancel(rid):
        return entry.response
    resp = {**entry.response, "status": "cancelled"}
    store.replace(rid, resp)
    return resp


def _failed(queued: dict, code: str, message: str) -> dict:
    return {**queued, "status": "failed", "error": {"code": code, "message": message}}
