"""The API's documentation pages, ``/docs`` (Swagger UI) and ``/redoc``, with every asset served by the gateway
itself, so they render on a host with no internet. FastAPI's own pages load their JavaScript and CSS from a CDN.

The assets are the ones the ``fastapi-offline`` package ships: swagger-ui-dist 5 (FastAPI writes OpenAPI 3.1,
which Swagger UI 4 shows as "Unable to render this definition") and ReDoc's standalone bundle, served with the one
URL it would load from elsewhere taken out (its "API docs by Redocly" badge's logo, from cdn.redoc.ly: the badge
then shows its text alone). ``GET /`` sends a browser to the console, ``/console``. The pages are unauthenticated, as
``/openapi.json`` is, and left out of the OpenAPI document.
"""

from __future__ import annotations

import hashlib
import re
from functools import cache
from pathlib import Path

import fastapi_offline
from fastapi import APIRouter, FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response

from core.errors import NotFoundError

router = APIRouter(include_in_schema=False)

ASSETS_URL = "/docs/assets"
# The files served, by name, with their media types: only these, so no request path ever reaches the filesystem.
ASSETS = {
    "swagger-ui-bundle.js": "text/javascript; charset=utf-8",
    "swagger-ui.css": "text/css; charset=utf-8",
    "redoc.standalone.js": "text/javascript; charset=utf-8",
    "favicon.png": "image/png",
}
_STATIC = Path(fastapi_offline.__file__).parent / "static"
REDOC = "redoc.standalone.js"
# ReDoc's sidebar badge is an <img> of this CDN's logo (hard-coded in the bundle). An empty src loads nothing and
# fails at once, and the badge's own onError handler then leaves the image out.
_CDN_URL = re.compile(rb'"https://cdn\.redoc\.ly/[^"]*"')


def _urls(request: Request) -> tuple[str, str]:
    """The OpenAPI document's URL and the assets' base URL, under the ASGI root path (a reverse proxy's prefix)."""
    app: FastAPI = request.app
    root = request.scope.get("root_path", "")
    return f"{root}{app.openapi_url}", f"{root}{ASSETS_URL}"


@router.get("/")
async def root(request: Request) -> RedirectResponse:
    """A browser pointed at the gateway's address lands on the console (``api/routes/console.py``)."""
    return RedirectResponse(f"{request.scope.get('root_path', '')}/console", status_code=307)


@router.get("/docs")
async def swagger_ui(request: Request) -> HTMLResponse:
    openapi_url, assets = _urls(request)
    return get_swagger_ui_html(openapi_url=openapi_url, title=f"{request.app.title} - Swagger UI",
                               swagger_js_url=f"{assets}/swagger-ui-bundle.js",
                               swagger_css_url=f"{assets}/swagger-ui.css",
                               swagger_favicon_url=f"{assets}/favicon.png",
                               # No validator badge: Swagger UI would send the spec's URL to validator.swagger.io.
                               swagger_ui_parameters={**(request.app.swagger_ui_parameters or {}),
                                                      "validatorUrl": None})


@router.get("/redoc")
async def redoc(request: Request) -> HTMLResponse:
    openapi_url, assets = _urls(request)
    return get_redoc_html(openapi_url=openapi_url, title=f"{request.app.title} - ReDoc",
                          redoc_js_url=f"{assets}/redoc.standalone.js", redoc_favicon_url=f"{assets}/favicon.png",
                          with_google_fonts=False)


@router.get(ASSETS_URL + "/{name}")
async def asset(name: str, request: Request) -> Response:
    """One of the pages' assets; the response carries an ETag, so a browser revalidates instead of reloading."""
    media_type = ASSETS.get(name)
    if media_type is None:
        raise NotFoundError(f"no documentation asset {name!r}")
    if name != REDOC:
        return FileResponse(_STATIC / name, media_type=media_type)
    content, etag = redoc_bundle()
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers={"ETag": etag})
    return Response(content, media_type=media_type, headers={"ETag": etag})


@cache
def redoc_bundle() -> tuple[bytes, str]:
    """ReDoc's bundle with its CDN URL emptied, and its ETag: read and rewritten once per process."""
    content = _CDN_URL.sub(b'""', (_STATIC / REDOC).read_bytes())
    return content, f'"{hashlib.sha256(content).hexdigest()[:32]}"'
