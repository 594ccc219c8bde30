"""The chat page: `/` and its assets at `/webui/<file>`, package data read once at app creation.

Everything the page loads comes from this origin, and its Content-Security-Policy says so: `default-src
'self'` (scripts, styles, fetches, images), no inline script or style, no <base>, no form posts, no framing.
The page and its assets are open (auth.py); the page itself asks for the API key and sends it on API calls.
"""
from __future__ import annotations

import hashlib
from importlib.resources import files

from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import NotFound

CSP = "default-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
           "Cache-Control": "no-cache"}  # revalidated (ETag) on each load: an upgraded server's page shows at once
TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
         ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}


def load_assets() -> dict[str, tuple[bytes, str, str]]:
    """{file name: (bytes, content type, ETag)} of the page's files."""
    assets = {}
    for f in (files("pyserve.server") / "webui").iterdir():  # package data (pyproject.toml)
        ctype = TYPES.get("." + f.name.rpartition(".")[2])
        if ctype:
            data = f.read_bytes()
            assets[f.name] = (data, ctype, hashlib.sha256(data).hexdigest()[:20])
    return assets


def add_routes(app: QuartTrio) -> None:
    assets = load_assets()

    @app.get("/")
    async def webui_page():
        return await webui_asset("index.html")

    @app.get("/webui/<name>")
    async def webui_asset(name: str):
        if name not in assets:
            raise NotFound()
        body, ctype, etag = assets[name]
        resp = Response(body, content_type=ctype, headers=HEADERS)
        resp.set_etag(etag)
        return await resp.make_conditional(request)  # If-None-Match: 304
