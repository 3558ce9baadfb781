"""The orphan sweep end to end: `relay dev` sweeping every 2 s for PENDING workflows at least 2 s old, and two
real `dbos==3.2.0` executors of one app on one SQLite system database.

The first runs with no conductor at all (so Relay never hears of it) under a fixed executor id (DBOS takes
``DBOS__VMID`` when there is no conductor key), starts a workflow that waits on a gate file, and is SIGKILLed: a
real executor whose record is gone. The second connects to Relay. The sweep finds the dead id through the second
one's ``get_workflow_aggregates``, audits ``orphans.found``, and starts the id's lifecycle workflow, which waits
one grace, declares it DEAD, and has the connected peer recover it with confirmation; the workflow then finishes
on the peer. Every row of that recovery says ``"orphan": true``.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import (
    Relay,
    audit_rows_at,
    dbos_executor,
    running_relay,
    wait_until,
    workflow_status,
)

pytestmark = [pytest.mark.e2e, pytest.mark.concurrent]
APP = "orphaned"
ORPHAN = "orphan-vm-1"
WORKFLOW = "stranded-1"


@pytest.fixture(scope="module")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Relay]:
    with running_relay(tmp_path_factory.mktemp("relay-orphans"), RELAY_ORPHAN_SWEEP_INTERVAL_SECS="2",
                       RELAY_ORPHAN_MIN_AGE_SECS="2") as started:
        yield started


def _owner(sys_db: Path, workflow_id: str) -> str | None:
    with contextlib.closing(sqlite3.connect(sys_db, timeout=10)) as db:
        row = db.execute("SELECT executor_id FROM workflow_status WHERE workflow_uuid = ?", (workflow_id,)).fetchone()
    return None if row is None else str(row[0])


def _status(sys_db: Path, workflow_id: str) -> str | None:
    try:
        return workflow_status(sys_db, workflow_id)
    except sqlite3.OperationalError:  # the executor is still creating its system database
        return None


def test_a_dead_executor_relay_never_knew_is_found_and_recovered_through_a_peer(relay: Relay, tmp_path: Path) -> None:
    with relay.api() as client:
        assert client.put(f"/v2/orgs/local/apps/{APP}").status_code == 204
        assert client.patch(f"/v2/orgs/local/apps/{APP}", json={"executorTimeoutSecs": 1}).status_code == 204
    sys_db, gates = tmp_path / "sys.sqlite", tmp_path / "gates"
    gates.mkdir()
    unknown = dbos_executor("", "", APP, sys_db, tmp_path / "unknown.log", DBOS__VMID=ORPHAN,
                            GATED_WORKFLOWS=WORKFLOW, GATE_DIR=str(gates))
    peer = None
    try:
        wait_until(lambda: _status(sys_db, WORKFLOW) == "PENDING", timeout=30, what="the workflow PENDING")
        assert _owner(sys_db, WORKFLOW) == ORPHAN
        unknown.kill()  # SIGKILL: its workflow stays PENDING under an id Relay has no record of
        (gates / WORKFLOW).touch()  # from now on the workflow finishes wherever it runs next
        assert relay.executors(APP) == {}

        # Started only now: two executors creating one brand-new SQLite system database at once may collide.
        peer = dbos_executor(relay.ws_url, relay.key, APP, sys_db, tmp_path / "peer.log", GATE_DIR=str(gates))
        wait_until(lambda: list(relay.executors(APP).values()) == ["HEALTHY"], timeout=30, what="the peer HEALTHY")
        [peer_id] = relay.executors(APP)

        wait_until(lambda: _status(sys_db, WORKFLOW) == "SUCCESS", timeout=30, what="the workflow finished")
        assert _owner(sys_db, WORKFLOW) == peer_id

        def rows(operation: str) -> list[dict[str, object]]:
            return [r.details for r in audit_rows_at(relay.db_url, APP) if r.operation == operation]

        wait_until(lambda: rows("executor.deleted"), timeout=10, what="the orphan's record deleted")
        [found, *_] = rows("orphans.found")
        assert found["executorIds"] == [ORPHAN] and found["askedExecutor"] == peer_id
        for operation in ("executor.orphan.found", "executor.dead", "executor.recovery.dispatched",
                          "executor.recovery.succeeded"):
            [details] = rows(operation)
            assert details["orphan"] is True, (operation, details)
        [dispatched] = rows("executor.recovery.dispatched")
        assert dispatched["candidate"] == peer_id
        assert [r.executor_id for r in audit_rows_at(relay.db_url, APP) if r.operation.startswith("executor.")
                and r.executor_id != peer_id] == [ORPHAN] * 5
        assert relay.executors(APP) == {peer_id: "HEALTHY"}
    finally:
        unknown.stop()
        if peer is not None:
            peer.stop()
