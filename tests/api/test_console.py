"""The console's pages in-process (``api/routes/console.py``): every page served with its policy headers, nothing
loaded from another origin, the names in a URL escaped into the page, only the two assets served, and the root
leading to the console. What the pages do with the API, in a real browser, is tests/e2e/test_console.py."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from api.app import create_app
from api.routes.console import ASSETS, CONSOLE, POLICY, temporal_ui
from core.settings import Settings

ROOT = "/relay"
PAGES = ["/console", "/console/apps/orders", "/console/apps/orders/workflows", "/console/apps/orders/workflows/w-1",
         "/console/apps/orders/queues", "/console/apps/orders/alerts", "/console/keys", "/console/audit"]
URL = re.compile(r"""(?:href|src|action)="([^"]*)\"""")


@pytest.fixture(scope="module")
def app(tmp_path_factory: pytest.TempPathFactory) -> FastAPI:
    return create_app(Settings(data_dir=tmp_path_factory.mktemp("console")))


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app, root_path=ROOT)
    async with httpx.AsyncClient(transport=transport, base_url="http://relay.test") as client:
        yield client


@pytest.mark.parametrize("page", PAGES)
async def test_a_page_is_served_with_its_policy_and_loads_only_this_origin(client: httpx.AsyncClient,
                                                                           page: str) -> None:
    response = await client.get(page)
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/html; charset=utf-8"
    policy = response.headers["content-security-policy"]
    assert policy == POLICY and "unsafe-inline" not in policy and "frame-ancestors 'none'" in policy
    assert response.headers["x-frame-options"] == "DENY"
    assert response.headers["x-content-type-options"] == "nosniff"
    assert "http://" not in response.text and "https://" not in response.text
    urls = URL.findall(response.text)
    assert urls and all(u.startswith(f"{ROOT}/") for u in urls), urls
    assert {u.split("?")[0] for u in urls if "/assets/" in u} == {f"{ROOT}/console/assets/{n}" for n in ASSETS}
    assert "<script>" not in response.text and " style=" not in response.text  # nothing inline


async def test_names_in_the_url_are_text_in_the_page(client: httpx.AsyncClient) -> None:
    hostile = '<img src=x onerror="alert(1)">'
    response = await client.get(f"/console/apps/orders/workflows/{hostile}")
    assert response.status_code == 200
    assert "<img" not in response.text
    assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;" in response.text
    assert (await client.get("/console/apps/Not%20An%20App")).status_code == 422  # app names as the API has them


async def test_only_the_consoles_assets_are_served_and_revalidated(client: httpx.AsyncClient) -> None:
    for name, media_type in ASSETS.items():
        response = await client.get(f"/console/assets/{name}")
        assert response.status_code == 200 and response.headers["content-type"] == media_type
        assert response.content == (CONSOLE / "static" / name).read_bytes()
        again = await client.get(f"/console/assets/{name}", headers={"If-None-Match": response.headers["etag"]})
        assert again.status_code == 304 and again.content == b""
    for name in ["../templates/base.html", "base.html", "console.js.map", "%2e%2e%2froutes%2fconsole.py"]:
        assert (await client.get(f"/console/assets/{name}")).status_code == 404, name


def test_the_script_writes_text_only() -> None:
    """Application data reaches the page as text: the script never parses a string as markup or code."""
    script = (CONSOLE / "static" / "console.js").read_text()
    for sink in ["innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function",
                 "setAttribute('style'", "localStorage"]:
        assert sink not in script.replace("no innerHTML anywhere", ""), sink
    assert "sessionStorage" in script


async def test_the_root_leads_to_the_console(client: httpx.AsyncClient) -> None:
    response = await client.get("/")
    assert response.status_code == 307 and response.headers["location"] == f"{ROOT}/console"


def test_the_temporal_ui_link(tmp_path: Path) -> None:
    assert temporal_ui(None, "default") == ""
    embedded = Settings(data_dir=tmp_path, temporal_ui_port=9233)
    assert temporal_ui(embedded, "default") == "http://127.0.0.1:9233/namespaces/default/workflows/"
    assert temporal_ui(Settings(data_dir=tmp_path, temporal_address="temporal:7233"), "default") == ""
    # The namespace is the one the gateway's client is in, however it was set (TEMPORAL_NAMESPACE alone included).
    given = Settings(data_dir=tmp_path, temporal_address="temporal:7233", temporal_ui_url="https://temporal.example/")
    assert temporal_ui(given, "prod") == "https://temporal.example/namespaces/prod/workflows/"
