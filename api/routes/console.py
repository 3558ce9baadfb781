"""Relay Console: the web pages an operator opens instead of curl, served by every gateway at ``/console``.

Each page is a Jinja2 template rendered here: its frame (navigation, headings, forms, empty tables), with the names
in its URL (an app, a workflow id) autoescaped into ``data-`` attributes. The data comes from Relay's public REST
API, fetched by the console's own script (``api/console/static/console.js``) with the user's API key, which the
browser keeps for its session only (``sessionStorage``): the key never reaches this router, a URL or a log, and
the pages can do nothing the key cannot do through the API. The script writes what applications wrote (workflow
names, inputs, outputs, errors, executor metadata) as text nodes, never as markup, and the pages are served with a
Content-Security-Policy that allows scripts, styles and requests from this origin only, no inline script, and no
framing.

Why templates and a script of its own, not a front-end framework: the console is a handful of tables and forms
over an API that already exists, Relay is a Python project whose `make run` needs only Python and make, and the
whole console is two small files next to its templates, packaged with the code: no build step, no node_modules, no
CDN, and nothing to fetch at run time.
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path
from typing import Annotated
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi import Path as PathParam
from fastapi.responses import HTMLResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from core.errors import NotFoundError
from core.names import APP_PATTERN
from core.settings import Settings

router = APIRouter(include_in_schema=False)

CONSOLE = Path(__file__).parents[1] / "console"
PREFIX = "/console"
# The files served, by name, with their media types: only these, so no request path ever reaches the filesystem.
ASSETS = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}
# Same origin only; no inline script or style; no plugins, no framing, no base or form target elsewhere.
POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; "
          "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
HEADERS = {
    "Content-Security-Policy": POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
AppName = Annotated[str, PathParam(pattern=APP_PATTERN, max_length=100)]

_templates = Environment(loader=FileSystemLoader(CONSOLE / "templates"), autoescape=select_autoescape(["html"]),
                         auto_reload=False)


def _page(request: Request, template: str, **context: str) -> HTMLResponse:
    root = request.scope.get("root_path", "")
    gateway = getattr(request.app.state, "gateway", None)
    settings = None if gateway is None else gateway.settings
    # The namespace the gateway's client is in: RELAY_TEMPORAL_NAMESPACE, else TEMPORAL_NAMESPACE or a profile's.
    namespace = "default" if gateway is None else gateway.client.namespace
    html = _templates.get_template(template).render(
        root=root, console=f"{root}{PREFIX}", assets=f"{root}{PREFIX}/assets", version=asset_version(),
        temporal_ui=temporal_ui(settings, namespace), **context)
    return HTMLResponse(html, headers=HEADERS)


def temporal_ui(settings: Settings | None, namespace: str) -> str:
    """Where the Temporal UI shows a workflow of Relay's namespace (a lifecycle workflow's id is appended), or ""
    when it is unknown: RELAY_TEMPORAL_UI_URL, else the embedded server's UI under `relay dev`."""
    if settings is None:
        return ""
    base = settings.temporal_ui_url or (f"http://127.0.0.1:{settings.temporal_ui_port}"
                                        if settings.temporal_address is None else "")
    if not base:
        return ""
    return f"{base.rstrip('/')}/namespaces/{quote(namespace, safe='')}/workflows/"


@router.get(PREFIX)
async def apps_page(request: Request) -> HTMLResponse:
    return _page(request, "apps.html", page="apps")


@router.get(PREFIX + "/apps/{app}")
async def app_page(request: Request, app: AppName) -> HTMLResponse:
    return _page(request, "app.html", page="app", app=app)


@router.get(PREFIX + "/apps/{app}/workflows")
async def workflows_page(request: Request, app: AppName) -> HTMLResponse:
    return _page(request, "workflows.html", page="workflows", app=app)


@router.get(PREFIX + "/apps/{app}/workflows/{workflow_id:path}")
async def workflow_page(request: Request, app: AppName, workflow_id: str) -> HTMLResponse:
    return _page(request, "workflow.html", page="workflow", app=app, workflow=workflow_id)


@router.get(PREFIX + "/apps/{app}/queues")
async def queues_page(request: Request, app: AppName) -> HTMLResponse:
    return _page(request, "queues.html", page="queues", app=app)


@router.get(PREFIX + "/apps/{app}/alerts")
async def alerts_page(request: Request, app: AppName) -> HTMLResponse:
    return _page(request, "alerts.html", page="alerts", app=app)


@router.get(PREFIX + "/keys")
async def keys_page(request: Request) -> HTMLResponse:
    return _page(request, "keys.html", page="keys")


@router.get(PREFIX + "/audit")
async def audit_page(request: Request) -> HTMLResponse:
    return _page(request, "audit.html", page="audit")


@router.get(PREFIX + "/assets/{name}")
async def asset(name: str, request: Request) -> Response:
    """The console's script or style sheet, with an ETag: a browser revalidates instead of reloading."""
    media_type = ASSETS.get(name)
    if media_type is None:
        raise NotFoundError(f"no console asset {name!r}")
    content, etag = asset_bytes(name)
    headers = {"ETag": etag, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    return Response(content, media_type=media_type, headers=headers)


@cache
def asset_bytes(name: str) -> tuple[bytes, str]:
    content = (CONSOLE / "static" / name).read_bytes()
    return content, f'"{hashlib.sha256(content).hexdigest()[:32]}"'


@cache
def asset_version() -> str:
    """Changes with the assets: the pages' links carry it, so a new release's script is never taken from cache."""
    return hashlib.sha256(b"".join(asset_bytes(name)[0] for name in sorted(ASSETS))).hexdigest()[:12]
