"""Background responses (`background: true` on /v1/responses): each runs as a task of the app's nursery (its
owner: Quart-Trio's serving nursery, cancelled with a deadline at shutdown) inside a cancel scope of its own,
kept here by response id so that POST /v1/responses/{id}/cancel can cancel it. Cancelling the scope aborts the
engine request through the same `finally` a disconnect goes through, so its KV blocks are freed alike."""
from __future__ import annotations

from typing import Awaitable, Callable

import trio


class BackgroundJobs:
    def __init__(self) -> None:
        self._scopes: dict[str, trio.CancelScope] = {}  # response id → the running job's scope

    def __len__(self) -> int:
        return len(self._scopes)

    def start(self, nursery: trio.Nursery, rid: str, job: Callable[[], Awaitable[None]],
              done: Callable[[], None]) -> None:
        """Runs `job` in `nursery`; then `done()`, once, whether it ended, failed or was cancelled."""
        scope = self._scopes[rid] = trio.CancelScope()

        async def run() -> None:
            try:
                with scope:
                    await job()
            finally:
                self._scopes.pop(rid, None)
                done()

        nursery.start_soon(run)

    def cancel(self, rid: str) -> bool:
        """Cancels the job of response `rid`; False when none runs (it ended, or never was a background one)."""
        scope = self._scopes.pop(rid, None)
        if scope is None:
            return False
        scope.cancel()
        return True
