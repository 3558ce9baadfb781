"""What a person sees, in a real browser: Debian's headless Chromium (tests/browser.py, over the DevTools protocol,
offline: no host name but 127.0.0.1 resolves) looks at the session's `relay dev`.

- ``/docs`` renders Swagger UI from the gateway's own assets and lists every operation of Relay's OpenAPI document;
  ``/redoc`` renders ReDoc so too. Neither page asks any other host for anything (ReDoc's bundle, as packaged,
  fetches its badge's logo from a CDN).
- The Temporal UI's page of a recovered executor's lifecycle workflow shows the grace timer, the recovery
  dispatched to the peer and its confirmation: two real ``dbos==3.2.0`` executors, one SIGKILLed, a 2 s grace.

Screenshots are kept in ``.test-artifacts/browser/`` at the repository root (git-ignored), pass or fail.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlsplit

import httpx
import pytest

from core.temporal import connect
from tests.browser import Chromium, Page
from tests.support import Process, Relay, dbos_executor, wait_until
from workflows.contracts.common import Activity, lifecycle_workflow_id
from workflows.timing import FENCE_LEAD

pytestmark = [pytest.mark.e2e, pytest.mark.concurrent]

ARTIFACTS = Path(__file__).parents[2] / ".test-artifacts" / "browser"
GRACE_SECS = 4
# The grace timer stops short of the grace by the fence's lead: the probe before DEAD is asked that far ahead.
FENCE_LEAD_SECS = min(FENCE_LEAD.total_seconds(), GRACE_SECS / 2)
TIMER_SECS = GRACE_SECS - FENCE_LEAD_SECS


@pytest.fixture(scope="module")
def page() -> Iterator[Page]:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with Chromium(log_dir=ARTIFACTS) as browser:
        yield browser.page()


def test_docs_lists_relays_operations_offline(relay: Relay, page: Page) -> None:
    spec = httpx.get(f"{relay.url}/openapi.json", timeout=10).json()
    operation_ids = {op["operationId"] for path in spec["paths"].values() for op in path.values()}
    assert {"listWorkflows", "listExecutors", "registerApp"} <= operation_ids
    page.navigate(f"{relay.url}/docs")
    try:
        page.wait_for(f"document.querySelectorAll('.opblock').length >= {len(operation_ids)}",
                      what="Swagger UI's operations")
    finally:
        print(f"\nscreenshot: {page.screenshot(ARTIFACTS / 'docs.png')}")
    # Swagger UI gives each operation the element id "operations-<tag>-<operationId>".
    rendered = {i.rsplit("-", 1)[1] for i in page.evaluate("[...document.querySelectorAll('.opblock')].map(e => e.id)")}
    assert rendered == operation_ids, operation_ids ^ rendered
    text = page.text()
    assert "OAS 3.1" in text and "List executors" in text, text[:2000]
    assert "Unable to render" not in text and "Failed to load" not in text
    # Everything it loaded came from the gateway: nothing from a CDN (which could not resolve here anyway).
    assert {urlsplit(url).netloc for url in page.resources()} == {urlsplit(relay.url).netloc}, page.resources()
    assert _hosts(page.requests()) == {urlsplit(relay.url).netloc}, page.requests()


def _hosts(urls: list[str]) -> set[str]:
    """The hosts of the URLs a page asked for over the network (``data:`` and ``blob:`` URLs are in the page)."""
    return {urlsplit(url).netloc for url in urls if urlsplit(url).scheme in ("http", "https", "ws", "wss")}


def test_redoc_lists_relays_operations_and_loads_nothing_from_elsewhere(relay: Relay, page: Page) -> None:
    spec = httpx.get(f"{relay.url}/openapi.json", timeout=10).json()
    operation_ids = {op["operationId"] for path in spec["paths"].values() for op in path.values()}
    asked_before = len(page.requests())
    page.navigate(f"{relay.url}/redoc")
    try:
        # ReDoc gives each operation's section the id "tag/<tag>/operation/<operationId>".
        page.wait_for("document.querySelectorAll('[id*=\"/operation/\"]').length >= "
                      f"{len(operation_ids)}", timeout=30, what="ReDoc's operations")
    finally:
        print(f"\nscreenshot: {page.screenshot(ARTIFACTS / 'redoc.png')}")
    rendered = {i.rsplit("/", 1)[1] for i in page.evaluate(
        "[...document.querySelectorAll('[id*=\"/operation/\"]')].map(e => e.id)")}
    assert operation_ids <= rendered, operation_ids - rendered
    assert "API docs by Redocly" in page.text()  # the badge is there, its logo (from a CDN) is not
    asked = page.requests()[asked_before:]
    assert any(url.endswith("/docs/assets/redoc.standalone.js") for url in asked), asked
    assert _hosts(asked) == {urlsplit(relay.url).netloc}, asked


def test_temporal_ui_shows_an_executors_recovery(relay: Relay, page: Page, tmp_path: Path) -> None:
    app, sys_db = "browser-e2e", tmp_path / "sys.sqlite"
    with relay.api() as client:
        assert client.put(f"/v2/orgs/local/apps/{app}").status_code == 204
        assert client.patch(f"/v2/orgs/local/apps/{app}", json={"executorTimeoutSecs": GRACE_SECS}).status_code == 204
    a = dbos_executor(relay.ws_url, relay.key, app, sys_db, tmp_path / "a.log")
    b: Process | None = None
    try:
        # One at a time: two executors migrating a brand-new SQLite system database at once can crash one.
        wait_until(lambda: list(relay.executors(app).values()) == ["HEALTHY"], timeout=60, what="A HEALTHY")
        [a_id] = relay.executors(app)
        b = dbos_executor(relay.ws_url, relay.key, app, sys_db, tmp_path / "b.log")
        wait_until(lambda: list(relay.executors(app).values()) == ["HEALTHY", "HEALTHY"], timeout=60,
                   what="B HEALTHY")
        b_id = next(e for e in relay.executors(app) if e != a_id)
        a.kill()
        wait_until(lambda: a_id not in relay.executors(app), timeout=30, what="A recovered and its record deleted")
    finally:
        a.stop()
        if b is not None:
            b.stop()

    workflow_id = lifecycle_workflow_id("local", app, a_id)
    run_id = asyncio.run(_closed_run(relay.temporal_address, workflow_id))
    ui = f"http://127.0.0.1:{relay.env['RELAY_TEMPORAL_UI_PORT']}"
    history = f"{ui}/namespaces/default/workflows/{quote(workflow_id, safe='')}/{run_id}/history"
    try:
        # The UI fetches the events after the page's header; on a loaded machine that fetch has come back empty
        # once (the header said "Event History 55", the table had no row) and the UI did not ask again. Up to
        # three loads of the page, 20 s each.
        for attempt in range(1, 4):
            page.navigate(history)
            try:
                page.wait_for("document.body.innerText.includes('Workflow Execution Completed')",
                              timeout=20, what=f"the lifecycle workflow's event history (load {attempt})")
                break
            except AssertionError:
                if attempt == 3:
                    raise
    finally:
        print(f"\nscreenshot: {page.screenshot(ARTIFACTS / 'temporal-recovery.png')}")
    text = page.text()
    # Each event as the history table shows it: its type, then its details (tabs and newlines between cells).
    events = {
        # The grace runs from the DISCONNECTED row, the gateway's at the close (or the workflow's, a few milliseconds
        # after its task): a timer a little shorter or longer than the grace less the lead, "1 second, 994
        # milliseconds" say; checked below.
        "grace timer started": re.compile(
            r"Timer Started\s+Start To Fire Timeout\s+\d+ seconds?(, \d+ milliseconds?)?\s+Summary\s+"
            rf"grace (?P<timer>\d+(\.\d+)?) s, then the fence's last {FENCE_LEAD_SECS:g} s"),
        "grace timer fired": _row("Timer Fired", "Timer ID"),
        "the fence's probe": _row("Activity Task Scheduled", "Activity Type", Activity.PROBE_GATEWAY),
        "recovery dispatched": _row("Activity Task Scheduled", "Activity Type", Activity.DISPATCH_RECOVERY, "Summary",
                                    f"recovery via {b_id} attempt 1"),
        # The gateway asks the confirmation right after the recovery, in the same activity (lifecycle generation 5):
        # its answer is in that activity's result, which the table cuts at 60 characters ("exist":fa...).
        "recovery confirmed": re.compile(r'Activity Task Completed\s+Result\s+\{\s*"success":\s*true,\s*'
                                         r'"error_message":\s*null,\s*"confirmed":\s*\{\s*"exist":\s*f'),
        "workflow completed": _row("Workflow Execution Completed", "Result", '{"status":"RECOVERED"'),
    }
    found = {name: pattern.search(text) for name, pattern in events.items()}
    missing = [name for name, match in found.items() if match is None]
    assert not missing, f"not on the page: {missing}\n{text[:6000]}"
    timer = found["grace timer started"]
    assert timer is not None and TIMER_SECS - 0.5 <= float(timer["timer"]) <= TIMER_SECS + 0.5, timer
    # In history order, whichever way the table is sorted.
    positions = [match.start() for match in found.values() if match is not None]
    assert positions in (sorted(positions), sorted(positions, reverse=True)), dict(zip(found, positions, strict=True))
    page.scroll_to(f"then the fence's last {FENCE_LEAD_SECS:g} s")
    print(f"screenshot: {page.screenshot(ARTIFACTS / 'temporal-recovery-grace.png')}")


def _row(event_type: str, *details: str) -> re.Pattern[str]:
    return re.compile(r"\s+".join(re.escape(cell) for cell in (event_type, *details)))


async def _closed_run(address: str, workflow_id: str) -> str:
    """The run id of the lifecycle workflow's last run, once it has closed (right after the record's deletion)."""
    client = await connect(address, "default")
    handle = client.get_workflow_handle(workflow_id)
    await asyncio.wait_for(handle.result(), 30)
    return (await handle.describe()).run_id
