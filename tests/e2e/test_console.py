"""Relay Console in a real browser (Debian's headless Chromium, tests/browser.py, offline) against the session's
`relay dev` and two real ``dbos==3.2.0`` executors: an operator enters a key, sees the app and its executors, watches
a SIGKILLed executor go DISCONNECTED, DEAD, recovered and gone without reloading, opens the workflow it was running,
sees its steps, forks it from step 2 and sees the fork run, cancels and resumes a workflow, has a grace of 0 refused
with the API's message, sees application data that is markup rendered as text, and with an app-scoped key sees only
its app. Screenshots of each page go to ``.test-artifacts/console/`` (git-ignored), pass or fail.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, urlsplit

import httpx
import pytest

from tests.browser import Chromium, Page
from tests.support import Process, Relay, dbos_executor, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.concurrent]

ARTIFACTS = Path(__file__).parents[2] / ".test-artifacts" / "console"
APP = "console-e2e"
OTHER = "console-other"
GRACE_SECS = 2
HOSTILE = '<img src=x onerror="window.__xss = 1">'


@pytest.fixture(scope="module")
def page() -> Iterator[Page]:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with Chromium(log_dir=ARTIFACTS) as browser:
        yield browser.page()


def _shot(page: Page, name: str) -> None:
    print(f"\nscreenshot: {page.screenshot(ARTIFACTS / f'{name}.png')}")


def _sign_in(page: Page, relay: Relay, key: str) -> None:
    """The sign-in form, filled and sent as a person would (the key never goes into a URL)."""
    page.navigate(f"{relay.url}/console")
    page.wait_for("!document.getElementById('signin').hidden || !document.getElementById('main').hidden",
                  what="the console's first view")
    page.evaluate("document.getElementById('forget').click()")
    page.wait_for("!document.getElementById('signin').hidden", what="the sign-in form")
    page.evaluate(f"""(() => {{
        document.getElementById('signin-org').value = 'local';
        document.getElementById('signin-key').value = {json.dumps(key)};
        document.getElementById('signin-form').requestSubmit();
    }})()""")
    page.wait_for("!document.getElementById('main').hidden", what="the console after the key")


def _rows(page: Page, table: str, attribute: str) -> dict[str, str]:
    return dict(page.evaluate(f"""[...document.querySelectorAll('#{table} tbody tr[data-{attribute}]')].map(
        r => [r.dataset.{attribute}, r.querySelector('.status') ? r.querySelector('.status').textContent : ''])"""))


def _no_script_ran(page: Page) -> None:
    assert page.evaluate("window.__xss === undefined"), "application data ran as a script"
    assert page.evaluate("document.querySelectorAll('main img').length") == 0


def test_an_operator_watches_a_death_and_works_its_workflows(relay: Relay, page: Page, tmp_path: Path) -> None:
    sys_db, gates, start = tmp_path / "sys.sqlite", tmp_path / "gates", tmp_path / "start"
    gates.mkdir()
    with relay.api() as client:
        assert client.put(f"/v2/orgs/local/apps/{APP}").status_code == 204
        assert client.patch(f"/v2/orgs/local/apps/{APP}", json={"executorTimeoutSecs": GRACE_SECS}).status_code == 204
        assert client.put(f"/v2/orgs/local/apps/{OTHER}").status_code == 204
    # A runs the long workflow once the test says so, and wrote markup as its metadata and a workflow's name and
    # output; B holds a gated workflow to cancel and resume.
    a = dbos_executor(relay.ws_url, relay.key, APP, sys_db, tmp_path / "a.log", START_WORKFLOW="long",
                      START_WORKFLOW_WHEN=str(start), STEP_SECONDS="0.3", HOSTILE_WORKFLOWS="hostile-1",
                      EXECUTOR_METADATA=json.dumps({"note": HOSTILE}))
    b: Process | None = None
    try:
        wait_until(lambda: list(relay.executors(APP).values()) == ["HEALTHY"], timeout=60, what="A HEALTHY")
        [a_id] = relay.executors(APP)
        b = dbos_executor(relay.ws_url, relay.key, APP, sys_db, tmp_path / "b.log", GATED_WORKFLOWS="gated-1",
                          GATE_DIR=str(gates))
        wait_until(lambda: list(relay.executors(APP).values()) == ["HEALTHY", "HEALTHY"], timeout=60,
                   what="B HEALTHY")

        # The applications page, as the first thing an operator sees.
        began = time.monotonic()
        _sign_in(page, relay, relay.key)
        try:
            page.wait_for(f"[...document.querySelectorAll('#apps tbody tr')].some(r => r.dataset.app === '{APP}' "
                          "&& r.textContent.includes('2 HEALTHY'))", what="the app with two HEALTHY executors")
        finally:
            _shot(page, "apps")
        first_view = time.monotonic() - began
        interactive = page.evaluate("performance.getEntriesByType('navigation')[0].domInteractive")
        print(f"console: page interactive {interactive:.0f} ms after navigation; sign-in to the applications table "
              f"filled {first_view:.2f} s (measured, not asserted: speed is for benchmarks)")
        assert {urlsplit(u).netloc for u in page.requests() if urlsplit(u).scheme in ("http", "https")} == \
            {urlsplit(relay.url).netloc}, page.requests()
        assert relay.key not in " ".join(page.requests())  # the key is never in a URL

        # The app's executors, live.
        page.navigate(f"{relay.url}/console/apps/{APP}")
        page.wait_for("document.querySelectorAll('#executors tbody tr[data-status=HEALTHY]').length === 2",
                      what="both executors HEALTHY")
        gateways = page.evaluate("[...document.querySelectorAll('#executors .gateway')].map(e => e.textContent)")
        assert len(gateways) == 2 and all(gateways), gateways  # relay dev's one gateway, named
        metadata = page.evaluate("[...document.querySelectorAll('#executors .metadata')].map(e => e.textContent)")
        # Shown as the JSON text it is.
        assert json.dumps({"note": HOSTILE}, separators=(",", ":")) in metadata, metadata
        _no_script_ran(page)
        _shot(page, "executors")

        start.touch()
        steps = tmp_path / "a.steps"
        wait_until(lambda: steps.exists() and len(steps.read_text().splitlines()) >= 3, timeout=30,
                   what="A three steps into the long workflow")
        a.kill()
        seen: list[str] = []

        def watch() -> bool:
            status = _rows(page, "executors", "executor").get(a_id, "gone")
            if not seen or seen[-1] != status:
                seen.append(status)
            return status == "gone"

        wait_until(watch, timeout=30, interval=0.1, what="A gone from the page")
        assert "DISCONNECTED" in seen, seen
        assert seen[0] == "HEALTHY" and seen[-1] == "gone", seen
        wait_until(lambda: {"executor.disconnected", "executor.dead", "executor.recovery.succeeded"} <= set(
            page.evaluate("[...document.querySelectorAll('#events li')].map(e => e.dataset.operation)")),
            timeout=10, what="the death and the recovery in the lifecycle list")
        links = page.evaluate("[...document.querySelectorAll('#events li[data-operation^=\"executor.recovery\"] a')]"
                              ".map(a => a.href)")
        assert links and all(quote(f"relay-executor/local/{APP}/{a_id}", safe="") in link for link in links), links
        page.navigate(f"{relay.url}/console/apps/{APP}")  # the pictures, drawn from the audit log as the page loads
        page.wait_for("Number(document.getElementById('recovery-chart').dataset.recovered) >= 1",
                      what="the recovery in the recoveries-per-hour picture")
        assert page.evaluate("document.querySelectorAll('#status-chart rect.bar.HEALTHY').length") >= 1
        _shot(page, "executors-after-death")
        print(f"console: A as the executors page showed it, polled every 0.1 s: {' → '.join(seen)}")

        # The workflow A was running, recovered by B: its steps, then a fork from step 2.
        page.navigate(f"{relay.url}/console/apps/{APP}/workflows/long")
        page.wait_for("document.querySelector('#summary dd[data-field=Status]') && "
                      "document.querySelector('#summary dd[data-field=Status]').textContent === 'SUCCESS' "
                      "&& document.querySelectorAll('#steps li.step').length === 20", timeout=60,
                      what="the long workflow SUCCESS with its 20 steps")
        assert page.evaluate("document.querySelectorAll('#steps .bar').length") == 20
        page.wait_for("document.getElementById('wf-notifications').textContent === 'None.'",
                      what="its notifications (none), read through the executor")
        _shot(page, "workflow")
        page.evaluate("window.confirm = (message) => { window.__asked = message; return true; }")
        page.evaluate("document.getElementById('fork-step').value = '2'; document.getElementById('fork').click()")
        page.wait_for("document.querySelector('#action-done a') !== null", what="the fork's link")
        assert page.evaluate("window.__asked") == "Fork from step 2 workflow long?"
        page.evaluate("document.querySelector('#action-done a').click()")
        page.wait_for("document.querySelector('#summary dd[data-field=Status]') && "
                      "document.querySelector('#summary dd[data-field=Status]').textContent === 'SUCCESS' "
                      "&& document.querySelector('#summary dd[data-field=\"Forked from\"]')?.textContent === 'long'",
                      timeout=60, what="the fork run to SUCCESS")

        # Cancel, then resume, the gated workflow.
        page.navigate(f"{relay.url}/console/apps/{APP}/workflows/gated-1")
        status = "document.querySelector('#summary dd[data-field=Status]') && " \
                 "document.querySelector('#summary dd[data-field=Status]').textContent"
        page.wait_for(f"{status} === 'PENDING'", what="gated-1 PENDING")
        page.evaluate("window.confirm = (message) => { window.__asked = message; return true; }")
        page.evaluate("document.getElementById('cancel').click()")
        page.wait_for(f"{status} === 'CANCELLED'", what="gated-1 CANCELLED")
        assert page.evaluate("window.__asked") == "Cancel workflow gated-1?"
        (gates / "gated-1").touch()
        page.evaluate("document.getElementById('resume').click()")
        page.wait_for("document.getElementById('action-done').textContent === 'Resumed.'", what="the resume")
        page.wait_for(f"{status} === 'SUCCESS'", timeout=30, what="gated-1 resumed to SUCCESS, followed by the page")

        # Application data that is markup, on the workflow's page and in the list.
        page.navigate(f"{relay.url}/console/apps/{APP}/workflows/hostile-1")
        page.wait_for("document.querySelector('#summary dd[data-field=Name]') !== null", what="hostile-1")
        assert page.evaluate("document.querySelector('#summary dd[data-field=Name]').textContent") == HOSTILE
        assert HOSTILE in page.evaluate("document.getElementById('io').textContent")
        _no_script_ran(page)
        _shot(page, "workflow-hostile")
        page.navigate(f"{relay.url}/console/apps/{APP}/workflows?workflowIdPrefix=hostile")
        page.wait_for("document.querySelectorAll('#workflows tbody tr[data-workflow]').length === 1",
                      what="the search by id prefix")
        assert HOSTILE in page.evaluate("document.getElementById('workflows').textContent")
        _no_script_ran(page)
        _shot(page, "workflows")

        # A grace under a second, refused with the API's own message.
        with relay.api() as client:
            expected = client.patch(f"/v2/orgs/local/apps/{APP}", json={"executorTimeoutSecs": 0})
        assert expected.status_code == 422
        page.navigate(f"{relay.url}/console/apps/{APP}")
        page.wait_for("document.getElementById('grace').value !== ''", what="the settings")
        page.evaluate("document.getElementById('grace').value = '0'; "
                      "document.getElementById('settings-form').requestSubmit()")
        page.wait_for("document.getElementById('settings-error').textContent !== ''", what="the refusal")
        assert page.evaluate("document.getElementById('settings-error').textContent") == expected.json()["detail"]
        with relay.api() as client:
            assert client.get(f"/v2/orgs/local/apps/{APP}").json()["executorTimeoutSecs"] == GRACE_SECS
        _shot(page, "settings-refused")

        # Retention in days, then off; the grace and the global timeout left as they were.
        def settings() -> dict[str, object]:
            with relay.api() as client:
                return dict(client.get(f"/v2/orgs/local/apps/{APP}").json())

        page.evaluate("""(() => {
            document.getElementById('grace').value = '2';
            document.getElementById('retention').value = '7';
            document.getElementById('retention-unit').value = '86400000';
            document.getElementById('settings-form').requestSubmit();
        })()""")
        wait_until(lambda: settings()["gcTimeThresholdMs"] == 7 * 86_400_000, timeout=10, what="7 days of retention")
        assert (settings()["executorTimeoutSecs"], settings()["globalTimeoutMs"]) == (GRACE_SECS, None)
        page.wait_for("document.getElementById('settings').textContent.includes('7 days (gcTimeThresholdMs "
                      "604800000)')", what="7 days beside the raw value")
        page.evaluate("document.getElementById('retention').value = ''; "
                      "document.getElementById('settings-form').requestSubmit()")
        wait_until(lambda: settings()["gcTimeThresholdMs"] is None, timeout=10, what="retention off")
        page.evaluate("document.getElementById('rows').value = '0'; "
                      "document.getElementById('settings-form').requestSubmit()")
        page.wait_for("document.getElementById('settings-error').textContent.includes('gcRowsThreshold')",
                      what="a row limit of 0 refused, naming the field")
        page.evaluate("document.getElementById('rows').value = '5000'; "
                      "document.getElementById('cross-version').checked = true; "
                      "document.getElementById('settings-form').requestSubmit()")
        wait_until(lambda: (settings()["gcRowsThreshold"], settings()["crossVersionRecovery"]) == (5000, True),
                   timeout=10, what="the row limit and cross-version recovery")
    finally:
        a.stop()
        if b is not None:
            b.stop()


def test_an_app_scoped_key_sees_only_its_app(relay: Relay, page: Page) -> None:
    with relay.api() as client:
        for app in (APP, OTHER):
            assert client.put(f"/v2/orgs/local/apps/{app}").status_code == 204
        created = client.post("/v2/orgs/local/tokens/console-scoped", json={"appNames": [OTHER]})
    assert created.status_code == 201, created.text
    scoped = created.json()["token"]
    _sign_in(page, relay, scoped)
    page.wait_for("document.querySelectorAll('#apps tbody tr[data-app]').length > 0", what="the scoped app list")
    assert page.evaluate("[...document.querySelectorAll('#apps tbody tr[data-app]')].map(r => r.dataset.app)") == \
        [OTHER]
    page.navigate(f"{relay.url}/console/apps/{APP}")
    page.wait_for("document.getElementById('settings').textContent.includes('not allowed')",
                  what="another app's page: not allowed")
    page.navigate(f"{relay.url}/console/apps/{OTHER}")
    page.wait_for("document.getElementById('events').textContent.includes('not allowed')",
                  what="the audit log, which needs an org-wide key: not allowed")
    _shot(page, "scoped")
    httpx.delete(f"{relay.url}/v2/orgs/local/tokens/console-scoped",
                 headers={"Authorization": f"Bearer {relay.key}"}, timeout=10).raise_for_status()


def test_queues_schedules_alert_rules_keys_and_the_audit_log(relay: Relay, page: Page, tmp_path: Path) -> None:
    app = "console-ops"
    with relay.api() as client:
        assert client.put(f"/v2/orgs/local/apps/{app}").status_code == 204
    finished = [f"f-{i:03}" for i in range(120)]
    executor = dbos_executor(relay.ws_url, relay.key, app, tmp_path / "sys.sqlite", tmp_path / "x.log",
                             SCHEDULE="hourly", FINISHED_WORKFLOWS=",".join(finished))
    try:
        wait_until(lambda: list(relay.executors(app).values()) == ["HEALTHY"], timeout=60, what="HEALTHY")
        _sign_in(page, relay, relay.key)
        page.evaluate("window.confirm = (message) => { window.__asked = message; return true; }")

        # A page of 100 workflows, then the next.
        wait_until(lambda: len(httpx.post(f"{relay.url}/v2/orgs/local/apps/{app}/workflows/search", json={
            "workflowIdPrefix": ["f-"], "limit": 200}, headers={"Authorization": f"Bearer {relay.key}"},
            timeout=10).json()) == len(finished), timeout=60, what="the 120 finished workflows")
        page.navigate(f"{relay.url}/console/apps/{app}/workflows?workflowIdPrefix=f-")
        page.wait_for("document.querySelectorAll('#workflows tbody tr[data-workflow]').length === 100 "
                      "&& !document.getElementById('next').disabled", what="a page of 100 with a next one")
        render_ms = page.evaluate("performance.getEntriesByName('workflows-render').at(-1).duration")
        print(f"console: a page of 100 workflows rendered in {render_ms:.1f} ms after its data arrived "
              "(measured, not asserted)")
        page.evaluate("document.getElementById('next').click()")
        page.wait_for("document.querySelectorAll('#workflows tbody tr[data-workflow]').length === 20",
                      what="the second page")
        assert "offset=100" in page.evaluate("location.search")

        # Queues, and a schedule paused, resumed, triggered and backfilled over three hours.
        page.navigate(f"{relay.url}/console/apps/{app}/queues")
        page.evaluate("window.confirm = (message) => { window.__asked = message; return true; }")
        page.wait_for("document.querySelector('#queues tr[data-queue=serial]') !== null", what="the serial queue")
        row = "document.querySelector('#schedules tr[data-schedule=hourly]')"
        page.wait_for(f"{row} !== null && {row}.querySelector('.status').textContent === 'ACTIVE'",
                      what="the hourly schedule ACTIVE")
        page.evaluate(f"{row}.querySelector('button').click()")
        page.wait_for(f"{row}?.querySelector('.status')?.textContent === 'PAUSED'", what="PAUSED")
        assert page.evaluate("window.__asked") == "Pause schedule hourly?"
        page.evaluate(f"{row}.querySelector('button').click()")
        page.wait_for(f"{row}?.querySelector('.status')?.textContent === 'ACTIVE'", what="ACTIVE again")
        page.evaluate(f"{row}.querySelectorAll('button')[1].click()")
        page.wait_for("document.getElementById('schedules-done').textContent.startsWith('Trigger: hourly')",
                      what="the trigger")
        page.evaluate("""(() => {
            document.getElementById('backfill-start').value = '2026-01-01T00:30';
            document.getElementById('backfill-end').value = '2026-01-01T03:30';
            document.getElementById('backfill').requestSubmit();
        })()""")
        page.wait_for("document.getElementById('schedules-done').textContent === "
                      "'Backfilled hourly: 3 workflow(s)'", what="the backfill of three hours")
        _shot(page, "queues")

        # An alert rule created, then deleted.
        page.navigate(f"{relay.url}/console/apps/{app}/alerts")
        page.evaluate("window.confirm = (message) => { window.__asked = message; return true; }")
        page.wait_for("document.querySelector('#rules tbody tr') !== null", what="the rules")
        page.evaluate("""(() => {
            document.getElementById('rule-metadata').value = '{"minFailures": 3}';
            document.getElementById('rule-interval').value = '600';
            document.getElementById('new-rule').requestSubmit();
        })()""")
        page.wait_for("document.querySelectorAll('#rules tr[data-rule]').length === 1", what="the new rule")
        assert "minFailures" in page.evaluate("document.getElementById('rules').textContent")
        _shot(page, "alerts")
        page.evaluate("document.querySelector('#rules tr[data-rule] button').click()")
        page.wait_for("document.querySelectorAll('#rules tr[data-rule]').length === 0", what="the rule deleted")

        # A key created (its secret shown once, and working), then revoked.
        page.navigate(f"{relay.url}/console/keys")
        page.evaluate("window.confirm = (message) => { window.__asked = message; return true; }")
        page.wait_for("document.querySelector('#tokens tbody tr') !== null", what="the keys")
        page.evaluate(f"""(() => {{
            document.getElementById('token-name').value = 'console-made';
            document.getElementById('token-apps').value = '{app}';
            document.getElementById('new-token').requestSubmit();
        }})()""")
        page.wait_for("!document.getElementById('secret').hidden", what="the new key's secret")
        secret = page.evaluate("document.getElementById('secret-value').textContent")
        with httpx.Client(base_url=relay.url, headers={"Authorization": f"Bearer {secret}"}, timeout=10) as scoped:
            assert scoped.get(f"/v2/orgs/local/apps/{app}").status_code == 200
        page.wait_for("document.querySelector('#tokens tr[data-token=\"console-made\"]') !== null",
                      what="the new key listed")
        _shot(page, "keys")
        page.navigate(f"{relay.url}/console/keys")  # the secret is gone with the page
        page.evaluate("window.confirm = (message) => { window.__asked = message; return true; }")
        assert secret not in page.text()
        page.wait_for("document.querySelector('#tokens tr[data-token=\"console-made\"] button') !== null",
                      what="the key's row")
        page.evaluate("document.querySelector('#tokens tr[data-token=\"console-made\"] button').click()")
        page.wait_for("document.querySelector('#tokens tr[data-token=\"console-made\"]') === null",
                      what="the key revoked")
        with httpx.Client(base_url=relay.url, headers={"Authorization": f"Bearer {secret}"}, timeout=10) as scoped:
            assert scoped.get(f"/v2/orgs/local/apps/{app}").status_code == 401

        # The audit log, filtered by operation, then followed.
        page.navigate(f"{relay.url}/console/audit?operation=token.created")
        page.wait_for("[...document.querySelectorAll('#audit tbody tr')].some(r => "
                      "r.dataset.operation === 'token.created' && r.textContent.includes('console-made'))",
                      what="the key's creation in the audit log")
        assert set(page.evaluate("[...document.querySelectorAll('#audit tbody tr')].map(r => r.dataset.operation)"))\
            == {"token.created"}
        page.navigate(f"{relay.url}/console/audit")
        page.wait_for("document.querySelector('#audit tbody tr[data-operation]') !== null", what="the audit log")
        page.evaluate("document.getElementById('follow').click()")
        with relay.api() as client:
            assert client.patch(f"/v2/orgs/local/apps/{app}", json={"executorTimeoutSecs": 7}).status_code == 204
        page.wait_for("document.querySelector('#audit tbody tr')?.dataset.operation === 'app.updated'",
                      what="the update followed at the top")
        _shot(page, "audit")
    finally:
        executor.stop()
