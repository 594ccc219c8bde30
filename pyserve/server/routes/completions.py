"""/v1/completions (also without /v1), and llama.cpp's /infill (fill-in-the-middle; its module imported at its
first request)."""
from __future__ import annotations

from quart_trio import QuartTrio

from ...api.completions.protocol import CompletionRequest
from ..http.response import reply
from .body import body


def add_routes(app: QuartTrio, state) -> None:
    @app.post("/v1/completions")
    @app.post("/completions")  # clients configured with a base URL without /v1 (llama.cpp's server takes both)
    async def completions():
        req = await body(CompletionRequest)
        serving = await state.serving(req.model)
        return reply(await serving.completions.create(req, state.context()), bool(req.stream))

    @app.post("/infill")
    async def infill():
        from ...api.infill.protocol import InfillRequest

        req = await body(InfillRequest)
        serving = await state.serving(req.model)
        return reply(await serving.infill.create(req, state.context()), bool(req.stream))
