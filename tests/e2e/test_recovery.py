"""End to end, real processes: `relay dev` (embedded Temporal dev server, worker, gateway) and real
`dbos==3.2.0` executors sharing a SQLite system database. One executor is SIGKILLed mid-workflow; its peer
finishes the workflow. Every test runs with Relay's store on SQLite (the session's `relay dev`), then on
PostgreSQL (the executors' system database stays SQLite)."""

from __future__ import annotations

import sqlite3
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.postgres import postgres_cluster, relay_on_postgres
from tests.sdk import steps_by_pid
from tests.support import VENV_BIN, Process, Relay, play_executor, wait_until

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
