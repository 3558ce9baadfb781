"""``/docs`` and ``/redoc`` offline: the pages load every asset from the gateway itself (no CDN), the assets are
served with their media types, Swagger UI is 5 (4 cannot render OpenAPI 3.1), and the pages read Relay's own
OpenAPI document. In-process, no key: the pages are public, like ``/openapi.json``. The page rendered in a real
browser is tests/e2e/test_browser.py."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from api.app import create_app
from api.routes.docs import ASSETS
from core.settings import Settings

ROOT = "/relay"  # a reverse proxy's prefix (the ASGI root path): every URL on the pages must carry it
# Every URL a page makes the browser load: <link href>, <script src>, Swagger UI's `url:`, ReDoc's spec-url.
URL = re.compile(r"""(?:href|src|spec-url)="([^"]*)"|url: '([^']*)'""")


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    # The pages need no store and no Temporal: the app as `relay gateway` builds it, its lifespan not run.
    return create_app(Settings(data_dir=tmp_path_factory.mktemp("docs")))


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app, root_path=ROOT)
    async with httpx.AsyncClient(transport=transport, base_url="http://relay.test") as client:
        yield client


def _urls(html: str) -> list[str]:
    return [a or b for a, b in URL.findall(html)]


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_page_loads_only_local_urls(client: httpx.AsyncClient, page: str) -> None:
    response = await client.get(page)
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    assert "http://" not in response.text and "https://" not in response.text and "//cdn" not in response.text
    urls = _urls(response.text)
    assert f"{ROOT}/openapi.json" in urls, urls
    assert all(u.startswith(f"{ROOT}/docs/assets/") for u in urls if u != f"{ROOT}/openapi.json"), urls
    assert len(urls) >= 3, urls  # the spec, a script, the favicon (and Swagger UI's stylesheet)
    if page == "/docs":
        assert '"validatorUrl": null' in response.text  # Swagger UI's default validator is an external service


async def test_swagger_ui_assets_are_served_with_their_media_types(client: httpx.AsyncClient) -> None:
    html = (await client.get("/docs")).text
    urls = [u for u in _urls(html) if "/docs/assets/" in u]
    assert {u.rsplit("/", 1)[1] for u in urls} == {"swagger-ui-bundle.js", "swagger-ui.css", "favicon.png"}
    for url in urls:
        response = await client.get(url.removeprefix(ROOT))
        assert response.status_code == 200, url
        assert response.headers["content-type"] == ASSETS[url.rsplit("/", 1)[1]], url
        assert response.headers["etag"], url
    assert (await client.get("/docs/assets/swagger-ui.css")).headers["content-type"] == "text/css; charset=utf-8"
    assert (await client.get("/docs/assets/favicon.png")).content.startswith(b"\x89PNG")


async def test_swagger_ui_is_version_5(client: httpx.AsyncClient) -> None:
    bundle = await client.get("/docs/assets/swagger-ui-bundle.js")
    assert bundle.headers["content-type"] == "text/javascript; charset=utf-8"
    assert "SwaggerUIBundle" in bundle.text
    version = re.search(r'PACKAGE_VERSION:"(\d+)\.(\d+)\.(\d+)"', bundle.text)
    assert version is not None and int(version.group(1)) >= 5, version


async def test_redoc_bundle_is_served(client: httpx.AsyncClient) -> None:
    bundle = await client.get("/docs/assets/redoc.standalone.js")
    assert bundle.status_code == 200
    assert bundle.headers["content-type"] == "text/javascript; charset=utf-8"
    assert "Redoc" in bundle.text[:2000]


async def test_the_spec_the_page_reads_is_relays(client: httpx.AsyncClient, app: FastAPI) -> None:
    [spec_url] = [u for u in _urls((await client.get("/docs")).text) if not u.startswith(f"{ROOT}/docs/")]
    response = await client.get(spec_url.removeprefix(ROOT))
    assert response.status_code == 200
    # Served under the root path, the document also names it as its server.
    assert {**response.json(), "servers": None} == {**app.openapi(), "servers": None}
    operations = {op["operationId"] for path in response.json()["paths"].values() for op in path.values()}
    assert {"listWorkflows", "listExecutors", "getApp"} <= operations
    assert not any(path.startswith(("/docs", "/redoc")) for path in response.json()["paths"])


@pytest.mark.parametrize("path", ["/docs/assets/nope.js", "/docs/assets/..%2F..%2Fpyproject.toml",
                                  "/docs/assets/__init__.py"])
async def test_only_the_named_assets_are_served(client: httpx.AsyncClient, path: str) -> None:
    response = await client.get(path)
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"


def test_assets_exist_in_the_installed_package() -> None:
    from api.routes import docs

    for name in ASSETS:
        assert (docs._STATIC / name).is_file(), name


async def test_redoc_bundle_loads_nothing_from_another_host(client: httpx.AsyncClient) -> None:
    """The packaged bundle shows its badge's logo from cdn.redoc.ly; the one served names no other host to load
    from (an <img> src or a fetch of an absolute URL), and is otherwise the same bundle."""
    from api.routes import docs

    packaged = (docs._STATIC / "redoc.standalone.js").read_bytes()
    assert b"https://cdn.redoc.ly/" in packaged  # what is taken out: still there in the package
    served = await client.get("/docs/assets/redoc.standalone.js")
    assert served.status_code == 200
    assert b"cdn.redoc.ly" not in served.content
    assert not re.search(rb'src\s*[:=]\s*"https?://', served.content)  # a link (href) loads nothing
    assert len(packaged) - len(served.content) < 100  # only the URL went
    again = await client.get("/docs/assets/redoc.standalone.js", headers={"If-None-Match": served.headers["etag"]})
    assert again.status_code == 304 and again.content == b""


async def test_the_root_leads_to_the_console(client: httpx.AsyncClient) -> None:
    response = await client.get("/")
    assert response.status_code == 307
    assert response.headers["location"] == f"{ROOT}/console"
