"""End to end, real processes: `relay dev` (embedded Temporal dev server, worker, gateway) and real
`dbos==3.2.0` executors sharing a SQLite system database. One executor is SIGKILLed mid-workflow; its peer
finishes the workflow. Every test runs with Relay's store on SQLite (the session's `relay dev`), then on
PostgreSQL (the executors' system database stays SQLite)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType

from core.temporal import connect as temporal_connect
from tests.postgres import postgres_cluster, relay_on_postgres
from tests.sdk import steps_by_pid
from tests.support import VENV_BIN, Process, Relay, play_executor, wait_until
from workflows.contracts.common import Activity, lifecycle_workflow_id

pytestmark = pytest.mark.e2e
EXECUTOR_APP = Path(__file__).parents[1] / "executor_app.py"


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def relay(request: pytest.FixtureRequest, relay: Relay, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Relay]:
    """The session's `relay dev` (SQLite), then one whose store is a database of a private PostgreSQL cluster."""
    if request.param == "sqlite":
        yield relay
        return
    with postgres_cluster() as cluster, relay_on_postgres(cluster, tmp_path_factory.mktemp("relay-recovery-pg")) as pg:
        yield pg


def _executor(relay: Relay, tmp: Path, name: str, app: str, sys_db: Path, **extra: str) -> Process:
    env = {"PATH": str(VENV_BIN), "RELAY_URL": relay.ws_url, "RELAY_KEY": relay.key, "APP_NAME": app,
           "SYS_DB": str(sys_db), "STEP_LOG": str(tmp / "steps.log"), "APP_VERSION": "v1", **extra}
    return Process([sys.executable, str(EXECUTOR_APP)], env=env, log=tmp / f"{name}.log")


def _workflow_status(sys_db: Path, workflow_id: str) -> str | None:
    with sqlite3.connect(sys_db) as db:
        row = db.execute("SELECT status FROM workflow_status WHERE workflow_uuid = ?", (workflow_id,)).fetchone()
    return None if row is None else str(row[0])


def _checkpointed_steps(sys_db: Path, workflow_id: str) -> set[int]:
    with sqlite3.connect(sys_db) as db:
        rows = db.execute("SELECT function_id FROM operation_outputs WHERE workflow_uuid = ?",
                          (workflow_id,)).fetchall()
    # function_id counts from 1 in the workflow; step i of the app is function i + 1.
    return {int(r[0]) - 1 for r in rows}


def test_sigkilled_executor_is_recovered_by_its_peer(relay: Relay, tmp_path: Path) -> None:
    app, workflow_id, sys_db = "orders-e2e", "e2e-twenty-steps", tmp_path / "sys.sqlite"
    with relay.api() as client:
        assert client.put(f"/v2/orgs/local/apps/{app}").status_code == 204
        assert client.patch(f"/v2/orgs/local/apps/{app}", json={"executorTimeoutSecs": 3}).status_code == 204
        assert client.get(f"/v2/orgs/local/apps/{app}").json()["executorTimeoutSecs"] == 3
    go = tmp_path / "go"
    a = _executor(relay, tmp_path, "a", app, sys_db, START_WORKFLOW=workflow_id, START_WORKFLOW_WHEN=str(go),
                  STEP_SECONDS="0.4")
    b: Process | None = None
    try:
        # One at a time: two executors migrating a brand-new SQLite system database at once can crash one.
        wait_until(lambda: list(relay.executors(app).values()) == ["HEALTHY"], timeout=60, what="A HEALTHY")
        [a_id] = relay.executors(app)
        b = _executor(relay, tmp_path, "b", app, sys_db)
        wait_until(lambda: list(relay.executors(app).values()) == ["HEALTHY", "HEALTHY"], timeout=60,
                   what="B HEALTHY")
        b_id = next(e for e in relay.executors(app) if e != a_id)

        go.touch()
        wait_until(lambda: len(steps_by_pid(tmp_path / "steps.log").get(a.pid, [])) >= 5, timeout=30,
                   what="A ran 5 steps")
        a.kill()
        killed_at = time.monotonic()
        done_by_a = _checkpointed_steps(sys_db, workflow_id)
        assert _workflow_status(sys_db, workflow_id) == "PENDING"

        disconnected_at = wait_until(lambda: relay.executors(app).get(a_id) == "DISCONNECTED", timeout=1,
                                     interval=0.02, what="A DISCONNECTED")
        dead_at = wait_until(lambda: relay.executors(app).get(a_id) in ("DEAD", None), timeout=10,
                             interval=0.05, what="A DEAD")
        assert 2.5 <= dead_at - disconnected_at <= 5.0
        wait_until(lambda: _workflow_status(sys_db, workflow_id) == "SUCCESS", timeout=60, what="SUCCESS")
        success_at = time.monotonic()
        wait_until(lambda: a_id not in relay.executors(app), timeout=10, what="A's record deleted")
        assert relay.executors(app) == {b_id: "HEALTHY"}

        steps = steps_by_pid(tmp_path / "steps.log")
        by_b = set(steps[b.pid])
        assert by_b, "B ran no step"
        assert not (done_by_a & by_b), f"steps checkpointed by A ran again on B: {done_by_a & by_b}"
        assert set(steps[a.pid]) | by_b == set(range(20))

        ops = [op for op, ex in relay.audit(app) if ex == a_id]
        assert ops == ["executor.healthy", "executor.disconnected", "executor.dead", "executor.recovery.dispatched",
                       "executor.recovery.succeeded", "executor.deleted"], ops
        print(f"\nSIGKILL→DISCONNECTED {disconnected_at - killed_at:.2f}s, →SUCCESS {success_at - killed_at:.2f}s")
    finally:
        a.stop()
        if b is not None:
            b.stop()


def test_reconnect_within_grace_is_not_recovered(relay: Relay) -> None:
    app, executor_id = "reconnect-e2e", "raw-executor-1"
    with relay.api() as client:
        assert client.put(f"/v2/orgs/local/apps/{app}").status_code == 204
        assert client.patch(f"/v2/orgs/local/apps/{app}", json={"executorTimeoutSecs": 3}).status_code == 204
    with play_executor(relay, app, executor_id):
        wait_until(lambda: relay.executors(app).get(executor_id) == "HEALTHY", timeout=10, what="HEALTHY")
    wait_until(lambda: relay.executors(app).get(executor_id) == "DISCONNECTED", timeout=2, what="DISCONNECTED")
    with play_executor(relay, app, executor_id):
        wait_until(lambda: relay.executors(app).get(executor_id) == "HEALTHY", timeout=2, what="HEALTHY again")
        time.sleep(4)  # past the 3 s grace that the reconnect cancelled
        assert relay.executors(app).get(executor_id) == "HEALTHY"
        ops = [op for op, ex in relay.audit(app) if ex == executor_id]
        assert ops == ["executor.healthy", "executor.disconnected", "executor.reconnected"], ops


def _fence_probes(address: str, app: str, executor_id: str) -> list[tuple[float, dict[str, object]]]:
    """(scheduled at, input) of every ``probe_gateway`` the executor's lifecycle workflow scheduled, in order."""
    async def probes() -> list[tuple[float, dict[str, object]]]:
        client = await temporal_connect(address, "default")
        handle = client.get_workflow_handle(lifecycle_workflow_id("local", app, executor_id))
        found = []
        async for e in handle.fetch_history_events():
            attrs = e.activity_task_scheduled_event_attributes
            if (e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                    and attrs.activity_type.name == Activity.PROBE_GATEWAY):
                found.append((e.event_time.ToDatetime(tzinfo=UTC).timestamp(),
                              json.loads(attrs.input.payloads[0].data)))
        return found

    return asyncio.run(probes())


def test_back_while_the_fence_holds_its_probe_is_healthy_not_dead(relay: Relay) -> None:
    """The fence before DEAD asks the executor's gateway ahead of the grace's end to look when it ends; the gateway
    holds the probe. The executor comes back on that gateway in the grace's last second, while the probe is held: it
    is HEALTHY again, never DEAD, and nothing is recovered."""
    app, executor_id, grace = "fence-ahead-e2e", "raw-executor-ahead", 6
    with relay.api() as client:
        assert client.put(f"/v2/orgs/local/apps/{app}").status_code == 204
        assert client.patch(f"/v2/orgs/local/apps/{app}", json={"executorTimeoutSecs": grace}).status_code == 204
    with play_executor(relay, app, executor_id):
        wait_until(lambda: relay.executors(app).get(executor_id) == "HEALTHY", timeout=10, what="HEALTHY")
    wait_until(lambda: relay.executors(app).get(executor_id) == "DISCONNECTED", timeout=5, what="DISCONNECTED")
    wait_until(lambda: _fence_probes(relay.temporal_address, app, executor_id), timeout=grace + 5, interval=0.1,
               what="the fence's probe out")
    [(asked_at, asked)] = _fence_probes(relay.temporal_address, app, executor_id)
    answer_at = asked.get("answer_at")
    assert isinstance(answer_at, str), asked  # a probe held for the grace's end
    grace_ends = datetime.fromisoformat(answer_at).timestamp()
    with play_executor(relay, app, executor_id):
        back = time.time()
        assert back < grace_ends, f"back {back - grace_ends:.2f} s after the grace: the probe went out too late"
        wait_until(lambda: "executor.reconnected" in [op for op, ex in relay.audit(app) if ex == executor_id],
                   timeout=10, what="reconnected")
        time.sleep(max(0.0, grace_ends + 2 - time.time()))  # past the grace the probe was held for
        assert relay.executors(app).get(executor_id) == "HEALTHY"
        ops = [op for op, ex in relay.audit(app) if ex == executor_id]
        # The probe's answer (the socket, `executor.fenced`) and the `connected` signal race; either calls it off.
        assert [op for op in ops if op != "executor.fenced"] == [
            "executor.healthy", "executor.disconnected", "executor.reconnected"], ops
    print(f"\nthe fence's probe out {grace_ends - asked_at:.2f} s before the grace's end; "
          f"back {grace_ends - back:.2f} s before it")
