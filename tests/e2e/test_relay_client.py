"""Relay's own clients on the current SDKs, end to end: clients/python (``relay_dbos``) on dbos 3.4.0,
clients/typescript on @dbos-inc/dbos-sdk 5.3.0 and clients/go on dbos-transact-golang v1.9.0, each run by the
suite's executor of that release (``tests/sdk.py``: python-current, typescript-current, go-current; ``--sdk``
picks some). Every workflow-management operation through Relay's REST API answered by a real executor on DBOS's
public API, the ones DBOS moved out of its MIT packages answered with a 501 that names them, and a frozen gateway
left within the client's pong timeout through Debian's HAProxy. The lifecycle (SIGKILL, SIGSTOP, retention, the
connect storm) runs in tests/e2e/test_sdks.py.
"""

from __future__ import annotations

import base64
import contextlib
import gzip
import os
import re
import signal
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.test_haproxy import CONFIG, HAPROXY
from tests.e2e.test_management import _ok
from tests.postgres import PostgresCluster, postgres_cluster
from tests.sdk import EXECUTORS, SDKS, Sdk, SystemDatabase
from tests.support import (
    Process,
    Relay,
    audit_rows,
    audit_rows_at,
    free_port,
    ready,
    registry,
    running_relay,
    start_gateways,
    wait_until,
)

pytestmark = pytest.mark.e2e
CURRENT = [name for name in SDKS if name.endswith("-current")]
APP = "current"
# What each release moved out of its MIT package and no public call does: answered unsupported, which Relay turns
# into a 501 (each client's README has the whole table).
MOVED_OUT = {
    "python-current": {"get_metrics", "export_workflow", "import_workflow", "get_workflow_notifications",
                       "get_workflow_streams", "get_workflow_aggregates", "get_step_aggregates"},
    "typescript-current": {"get_metrics", "export_workflow", "import_workflow", "get_workflow_events",
                           "get_workflow_notifications", "get_workflow_streams", "get_workflow_aggregates",
                           "get_step_aggregates"},
    "go-current": {"get_metrics", "export_workflow", "import_workflow", "get_workflow_events",
                   "get_workflow_notifications", "get_workflow_streams"},
}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``current``: each current release with Relay's client, or those of them named by ``--sdk``."""
    if "current" in metafunc.fixturenames:
        chosen = [name for name in metafunc.config.getoption("sdk") or CURRENT if name in CURRENT]
        metafunc.parametrize("current", [SDKS[name] for name in chosen], ids=lambda s: str(s.name), scope="module")


@pytest.fixture(scope="module")
def cluster() -> Iterator[PostgresCluster]:
    """PostgreSQL for the releases that support no other system database (TypeScript), started when one asks."""
    with postgres_cluster() as started:
        yield started


@dataclass(frozen=True)
class Running:
    """The release's executor, HEALTHY in its own app."""

    sdk: Sdk
    app: str  # the release's name
    sys_db: SystemDatabase
    tmp: Path  # its STEP_LOG and gates are here
    executor_id: str


def _system_database(current: Sdk, tmp: Path, request: pytest.FixtureRequest) -> SystemDatabase:
    return current.system_database(tmp, request.getfixturevalue("cluster") if current.postgres_only else None)


# -- workflow management ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Relay]:
    with running_relay(tmp_path_factory.mktemp("relay-client")) as started:
        yield started


@pytest.fixture(scope="module")
def app(relay: Relay, current: Sdk, tmp_path_factory: pytest.TempPathFactory,
        request: pytest.FixtureRequest) -> Iterator[Running]:
    """One executor of the release with gated, queued, three-step and finished workflows and an hourly schedule, in
    an app named after the release."""
    tmp = tmp_path_factory.mktemp(current.name)
    (tmp / "gates").mkdir()
    sys_db = _system_database(current, tmp, request)
    with relay.api() as api:
        assert api.put(f"/v2/orgs/local/apps/{current.name}").status_code == 204
    executor = current.start(relay, tmp, "executor", current.name, sys_db, GATE_DIR=str(tmp / "gates"),
                             GATED_WORKFLOWS="g1,g2", QUEUED_WORKFLOWS="q1,q2", THREE_STEPS="t1",
                             FINISHED_WORKFLOWS="f1", SCHEDULE="hourly")
    try:
        wait_until(lambda: list(relay.executors(current.name).values()) == ["HEALTHY"], timeout=60, what="HEALTHY")
        wait_until(lambda: {"g1", "g2", "q1", "q2", "t1", "f1"} <= set(sys_db.statuses()), timeout=30,
                   what="the workflows")
        [executor_id] = relay.executors(current.name)
        yield Running(current, current.name, sys_db, tmp, executor_id)
    finally:
        executor.stop()


def _api(relay: Relay, app: str) -> httpx.Client:
    return httpx.Client(base_url=f"{relay.url}/v2/orgs/local/apps/{app}/", timeout=30,
                        headers={"Authorization": f"Bearer {relay.key}"})


@pytest.mark.concurrent  # outcomes only: beside another test (tests/tiers.py)
def test_workflows_are_listed_got_stepped_cancelled_resumed_forked_and_deleted(
        relay: Relay, app: Running) -> None:
    sys_db, tmp, executor_id = app.sys_db, app.tmp, app.executor_id
    with _api(relay, app.app) as api:
        pending = _ok(api.get("workflows", params={"status": "PENDING"}))
        assert {"g1", "g2"} <= {w["workflowId"] for w in pending}
        g1 = _ok(api.get("workflows/g1"))
        assert (g1["workflowId"], g1["status"], g1["executorId"], g1["appVersion"]) == \
            ("g1", "PENDING", executor_id, "v1")
        assert g1["workflowName"].endswith("gated")
        assert api.get("workflows/no-such-workflow").status_code == 404
        searched = _ok(api.post("workflows/search", json={"workflowIdPrefix": ["t"], "status": ["SUCCESS"]}))
        assert [w["workflowId"] for w in searched] == ["t1"]

        steps = _ok(api.get("workflows/t1/steps"))
        assert len([s for s in steps if s["stepName"].endswith("logged_step")]) == 3
        assert [str(s["output"]) for s in steps] == ["0", "1", "2"]

        _ok(api.post("workflows/g1/cancel", json={}), 204)
        wait_until(lambda: sys_db.status("g1") == "CANCELLED", timeout=30, what="g1 CANCELLED")
        (tmp / "gates" / "g1").touch()
        _ok(api.post("workflows/g1/resume", json={}), 204)
        wait_until(lambda: sys_db.status("g1") == "SUCCESS", timeout=60, what="g1 resumed to SUCCESS")

        forked = _ok(api.post("workflows/t1/fork", json={"startStep": 2, "newWorkflowId": "t1-fork"}), 201)
        assert forked == {"workflowId": "t1-fork"}
        wait_until(lambda: sys_db.status("t1-fork") == "SUCCESS", timeout=60, what="the fork SUCCESS")
        again = _ok(api.post("workflows/bulk-fork-from-failure", json={"workflowIds": ["t1"], "fromLastStep": True}))
        [refork] = again["workflowIds"]
        wait_until(lambda: sys_db.status(refork) == "SUCCESS", timeout=60, what="the fork from the last step")

        _ok(api.delete("workflows/t1-fork"), 204)
        assert sys_db.status("t1-fork") is None
        assert api.get("workflows/t1-fork").status_code == 404

        if "get_workflow_events" not in MOVED_OUT[app.sdk.name]:
            events = _ok(api.get("workflows/f1/events"))
            assert [(e["key"], str(e["value"])) for e in events] == [("answer", "42")]
        versions = _ok(api.get("versions"))
        assert "v1" in str(versions)
    ran = [line.split()[1:] for line in (tmp / "steps.log").read_text().splitlines() if len(line.split()) == 3]
    by_fork = [s for w, s in ran if w == "t1-fork"]
    assert by_fork and "0" not in by_fork, by_fork  # steps before the fork's start step are copied, not rerun
    audit = [(r.operation, r.executor_id, r.status) for r in audit_rows_at(relay.db_url, app.app)
             if r.operation.startswith("workflow.")]
    assert [op for op, _, _ in audit] == ["workflow.cancel", "workflow.resume", "workflow.fork",
                                          "workflow.bulk_fork_from_failure", "workflow.delete"], audit
    assert all(ex == executor_id and status == "success" for _, ex, status in audit), audit


@pytest.mark.concurrent  # outcomes only: beside another test (tests/tiers.py)
def test_queues_and_schedules(relay: Relay, app: Running) -> None:
    sys_db = app.sys_db
    with _api(relay, app.app) as api:
        queue = _ok(api.get("queues/serial"))
        assert queue["name"] == "serial" and queue["concurrency"] == 1
        assert "serial" in {q["name"] for q in _ok(api.get("queues"))}

        def queued() -> list[str]:
            listed = _ok(api.post("workflows/search", json={"queuesOnly": True}))
            statuses = {w["workflowId"]: w["status"] for w in listed if w["queueName"] == "serial"}
            return sorted(statuses.get(i, "") for i in ("q1", "q2"))

        # One runs and one waits, once the queue's worker has polled (every second).
        wait_until(lambda: queued() == ["ENQUEUED", "PENDING"], timeout=45, what="one of two queued running")

        [schedule] = [s for s in _ok(api.get("schedules")) if s["scheduleName"] == "hourly"]
        assert schedule["cronExpression"] == "0 0 * * * *" and schedule["status"] == "ACTIVE"
        _ok(api.post("schedules/hourly/pause"), 204)
        assert _ok(api.get("schedules/hourly"))["status"] == "PAUSED"
        before = set(sys_db.statuses())
        _ok(api.post("schedules/hourly/trigger"), 201)
        wait_until(lambda: any(s == "SUCCESS" for i, s in sys_db.statuses().items() if i not in before), timeout=60,
                   what="the triggered run")
        _ok(api.post("schedules/hourly/resume"), 204)
        assert _ok(api.get("schedules/hourly"))["status"] == "ACTIVE"
        backfilled = _ok(api.post("schedules/hourly/backfill", json={"startTime": "2026-01-01T00:30:00Z",
                                                                        "endTime": "2026-01-01T03:30:00Z"}))
        assert len(backfilled["workflowIds"]) == 3, backfilled  # 01:00, 02:00 and 03:00


@pytest.mark.concurrent  # outcomes only: beside another test (tests/tiers.py)
def test_what_the_release_moved_out_of_its_mit_package_is_a_501_naming_it(
        relay: Relay, app: Running) -> None:
    executor_id = app.executor_id
    with _api(relay, app.app) as api:
        asks: dict[str, Callable[[], httpx.Response]] = {
            "get_metrics": lambda: api.get("metrics", params={"startTime": "2026-01-01T00:00:00Z",
                                                               "endTime": "2099-01-01T00:00:00Z"}),
            "export_workflow": lambda: api.get("workflows/f1/export"),
            "get_workflow_events": lambda: api.get("workflows/f1/events"),
            "get_workflow_notifications": lambda: api.get("workflows/f1/notifications"),
            "get_workflow_streams": lambda: api.get("workflows/f1/streams"),
            "get_workflow_aggregates": lambda: api.post("workflows/aggregates", json={"groupByStatus": True}),
            "get_step_aggregates": lambda: api.post("steps/aggregates", json={"groupByStatus": True}),
            "import_workflow": lambda: api.post("workflows/import", json={"serializedWorkflow": NOT_A_WORKFLOW}),
        }
        refused = {operation: ask() for operation, ask in asks.items() if operation in MOVED_OUT[app.sdk.name]}
        kept = {operation: ask() for operation, ask in asks.items() if operation not in MOVED_OUT[app.sdk.name]}
    assert len(refused) == len(MOVED_OUT[app.sdk.name])
    for operation, response in kept.items():
        assert response.status_code == 200, (operation, response.status_code, response.text)
    for operation, response in refused.items():
        assert response.status_code == 501, (operation, response.status_code, response.text)
        assert response.headers["content-type"] == "application/problem+json"
        problem = response.json()
        assert problem["title"] == "Not Implemented"
        assert operation in problem["detail"] and app.sdk.version in problem["detail"], problem
        assert executor_id in problem["detail"]
    assert relay.executors(app.app) == {executor_id: "HEALTHY"}  # a refusal costs the executor nothing
    [imported] = [r for r in audit_rows_at(relay.db_url, app.app) if r.operation == "workflow.import"]
    assert (imported.status, imported.executor_id) == ("failure", executor_id)


CONNECTING = Path(__file__).parents[2] / "docs" / "pages" / "getting-started" / "connecting.md"
# An import body the client refuses before reading it: gzipped text, made here, not a real export.
NOT_A_WORKFLOW = base64.b64encode(gzip.compress(b"not an exported workflow")).decode()


@pytest.mark.concurrent  # outcomes only: beside another test (tests/tiers.py)
def test_the_docs_example_connects(relay: Relay, tmp_path: Path) -> None:
    """The docs' example of Relay's Python client ("Connecting an executor", dbos 3.3 and 3.4), as written (only the
    port is this Relay's), run by the venv that has dbos 3.4.0 and relay-dbos installed from the checkout: the
    executor is HEALTHY with its own UUID."""
    text = CONNECTING.read_text()
    section = text[text.index("### Python: dbos 3.3 and 3.4"):]
    source = re.search(r"^```python\n(.*?)^```", section, re.S | re.M)
    assert source is not None
    # Up to the "..." that stands for the application's own work (its shutdown lines after it are not run here).
    example = source.group(1).split("\n...\n")[0].replace("ws://127.0.0.1:8090/", relay.ws_url) + "\n"
    (tmp_path / "example.py").write_text(example + "assert relay.wait_connected()\nimport time\ntime.sleep(3600)\n")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "RELAY_API_KEY": relay.key}
    with relay.api() as api:
        assert api.put("/v2/orgs/local/apps/orders").status_code == 204
    executor = Process([str(EXECUTORS / "python" / ".venv" / "bin" / "python"), "example.py"], env=env,
                       log=tmp_path / "example.log", cwd=tmp_path)
    try:
        wait_until(lambda: list(relay.executors("orders").values()) == ["HEALTHY"], timeout=60, what="HEALTHY")
        [executor_id] = relay.executors("orders")
        assert len(executor_id) == 36 and executor_id.count("-") == 4, executor_id
        assert executor.popen.poll() is None, executor.output()[-2000:]
    finally:
        executor.stop()


# -- a frozen gateway, left through the load balancer -----------------------------------------------------------

PING, PONG = 1.0, 2.0  # the client's keepalive, shortened (20 s and 15 s by default)
HEARTBEAT_TIMEOUT = 2.0


@pytest.fixture
def balanced(tmp_path: Path) -> Iterator[tuple[Relay, list[Process]]]:
    """Temporal, `relay worker`, two `relay gateway`s on one SQLite database and the shipped HAProxy in front."""
    if not HAPROXY.exists():
        pytest.skip("Debian's haproxy is not installed (make test installs it)")
    processes: list[Process] = []
    try:
        started = start_gateways(tmp_path, processes, RELAY_GATEWAY_HEARTBEAT_TIMEOUT_SECS=str(HEARTBEAT_TIMEOUT))
        lb_port = free_port()
        lb_env = {"PATH": "/usr/bin:/bin", "LB_BIND": f"127.0.0.1:{lb_port}",
                  "LB_METRICS_BIND": f"127.0.0.1:{free_port()}", "GATEWAY_1": f"127.0.0.1:{started.ports[0]}",
                  "GATEWAY_2": f"127.0.0.1:{started.ports[1]}"}
        processes.append(Process([str(HAPROXY), "-db", "-f", str(CONFIG)], env=lb_env, log=tmp_path / "haproxy.log"))
        lb = Relay(processes[-1], f"http://127.0.0.1:{lb_port}", f"ws://127.0.0.1:{lb_port}/", started.key, tmp_path,
                   started.env)
        wait_until(lambda: ready(lb.url), timeout=20, what="/readyz through HAProxy")
        yield lb, started.processes
    finally:
        for process in reversed(processes):
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)
            process.stop()


def _gateway_of(data_dir: Path, executor_id: str) -> str | None:
    with contextlib.closing(sqlite3.connect(data_dir / "relay.db", timeout=10)) as db:
        row = db.execute("SELECT g.identity FROM executor e JOIN gatewayprocess g ON e.gateway_queue = g.queue "
                         "WHERE e.app = ? AND e.executor_id = ? AND e.status = 'HEALTHY'",
                         (APP, executor_id)).fetchone()
    return None if row is None else str(row[0])


def test_a_frozen_gateway_is_left_within_the_pong_timeout_through_the_load_balancer(
        balanced: tuple[Relay, list[Process]], current: Sdk, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """The gateway holding the executor is SIGSTOPped: its socket stays open and silent. The client's ping goes
    unanswered, it drops the socket at the pong timeout and reconnects through HAProxy to the other gateway, long
    before the app's grace: nothing is declared DEAD or recovered. (dbos 3.2.0's client notices such a freeze only
    about 40 s after it: PROTOCOL.md, "Keepalive".)"""
    lb, gateways = balanced
    with lb.api() as api:
        assert api.put(f"/v2/orgs/local/apps/{APP}").status_code == 204
        assert api.patch(f"/v2/orgs/local/apps/{APP}", json={"executorTimeoutSecs": 60}).status_code == 204
    executor = current.start(lb, tmp_path, "executor", APP, _system_database(current, tmp_path, request),
                             RELAY_PING_SECS=str(PING), RELAY_PONG_TIMEOUT_SECS=str(PONG))
    try:
        wait_until(lambda: list(registry(lb.data_dir, APP).values()) == ["HEALTHY"], timeout=60, what="HEALTHY")
        [executor_id] = registry(lb.data_dir, APP)
        holder = wait_until_value(lambda: _gateway_of(lb.data_dir, executor_id), what="its gateway")
        frozen = gateways[int(holder.rsplit("-", 1)[1]) - 1]
        other = "gateway-2" if holder == "gateway-1" else "gateway-1"
        os.kill(frozen.pid, signal.SIGSTOP)
        frozen_at = time.monotonic()
        try:
            # At most a ping interval, the pong timeout, the close's 2 s and a handshake that may first land on the
            # frozen gateway (5 s) before HAProxy's checks take it out: far below the 40 s of dbos 3.2.0's client.
            moved_at = wait_until(lambda: _gateway_of(lb.data_dir, executor_id) == other, timeout=30, interval=0.1,
                                  what="HEALTHY on the live gateway")
        finally:
            os.kill(frozen.pid, signal.SIGCONT)
        assert "no pong from Relay within 2 s" in executor.output()
        assert moved_at - frozen_at < PING + PONG + 12, moved_at - frozen_at
        print(f"\n{current.name}: gateway SIGSTOP → HEALTHY on the other gateway {moved_at - frozen_at:.2f}s "
              f"(ping {PING:.0f}s, pong timeout {PONG:.0f}s)")
        bad = [(r.operation, r.executor_id) for r in audit_rows(lb.data_dir, APP)
               if r.operation == "executor.dead" or r.operation.startswith("executor.recovery.")]
        assert bad == [], bad
        assert executor.popen.poll() is None, executor.output()[-2000:]
    finally:
        executor.stop()


def wait_until_value(read: Any, *, what: str, timeout: float = 20) -> str:
    found: list[str] = []

    def seen() -> bool:
        value = read()
        if value:
            found.append(value)
        return bool(value)

    wait_until(seen, timeout=timeout, what=what)
    return found[-1]
