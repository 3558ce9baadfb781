"""Version policy with real dbos==3.2.0 executors: a dead executor whose version no HEALTHY peer runs is blocked
(audited once, waiting durably), and is recovered as soon as an executor of its version connects."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.support import Process, Relay, audit_rows, dbos_executor, wait_until, workflow_status

pytestmark = [pytest.mark.e2e, pytest.mark.concurrent]
APP = "versioned-app"


def test_blocked_then_recovered_when_a_matching_executor_connects(relay: Relay, tmp_path: Path) -> None:
    sys_db, go, workflow_id = tmp_path / "sys.sqlite", tmp_path / "go", "versioned-wf"
    with relay.api() as api:
        api.put(f"/v2/orgs/local/apps/{APP}")
        api.patch(f"/v2/orgs/local/apps/{APP}", json={"executorTimeoutSecs": 1})
    started: list[Process] = []

    def executor(name: str, version: str, **extra: str) -> str:
        before = set(relay.executors(APP))
        started.append(dbos_executor(relay.ws_url, relay.key, APP, sys_db, tmp_path / f"{name}.log",
                                     APP_VERSION=version, STEP_SECONDS="0.2", **extra))
        wait_until(lambda: len(set(relay.executors(APP)) - before) == 1, timeout=60, what=f"{name} HEALTHY")
        [new] = set(relay.executors(APP)) - before
        return new

    try:
        a_id = executor("a", "v1", START_WORKFLOW=workflow_id, START_WORKFLOW_WHEN=str(go))
        executor("b", "v2")  # HEALTHY, but of another version: it must not be asked
        go.touch()
        wait_until(lambda: workflow_status(sys_db, workflow_id) == "PENDING", timeout=20, what="workflow running")
        time.sleep(0.5)
        started[0].kill()
        wait_until(lambda: any(r.operation == "executor.recovery.blocked" for r in audit_rows(
            relay.data_dir, APP, a_id)), timeout=15, what="recovery blocked")
        time.sleep(2)  # blocked means blocked: no dispatch while no v1 executor is HEALTHY
        ops = [r.operation for r in audit_rows(relay.data_dir, APP, a_id)]
        assert "executor.recovery.dispatched" not in ops and ops.count("executor.recovery.blocked") == 1
        assert workflow_status(sys_db, workflow_id) == "PENDING"

        c_id = executor("c", "v1")  # its arrival wakes the blocked recovery at once (no 5-minute re-check)
        wait_until(lambda: workflow_status(sys_db, workflow_id) == "SUCCESS", timeout=30, what="SUCCESS on C")
        wait_until(lambda: a_id not in relay.executors(APP), timeout=10, what="A deleted")
        rows = audit_rows(relay.data_dir, APP, a_id)
        [succeeded] = [r for r in rows if r.operation == "executor.recovery.succeeded"]
        assert succeeded.details["candidate"] == c_id
    finally:
        for process in started:
            process.stop()
