"""Retention end to end: `relay dev` (schedules need the dev server) with real `dbos==3.2.0` executors sharing a
SQLite system database, and raw WebSocket clients playing executors to check the exact wire payload.

This module runs its own `relay dev` with a 30-day interval and the schedule paused, so rounds happen only when a
test triggers one (a schedule fires on interval boundaries counted from the epoch: even a 1 h interval can fire
mid-test). Triggering works while paused, as it does for an operator. The tests that use it run with Relay's store
on SQLite, then on PostgreSQL (a private cluster; the executors' system database stays SQLite), reading the audit
trail through the store's URL.
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client, ScheduleOverlapPolicy

from tests.postgres import postgres_cluster, relay_on_postgres
from tests.retention import app_result, pause_schedule, run_temporal, schedule_exists, trigger_round
from tests.support import (
    VENV_BIN,
    Process,
    Relay,
    audit_rows_at,
    play_executor,
    relay_env,
    running_relay,
    wait_until,
)
from workflows.contracts.retention import (
    RETENTION_SCHEDULE_ID,
    AppRetentionResult,
    RetentionInput,
    RetentionRoundResult,
)

pytestmark = [pytest.mark.e2e, pytest.mark.concurrent]
EXECUTOR_APP = Path(__file__).parents[1] / "executor_app.py"
LONG_INTERVAL_SECS = 30 * 86_400
GC_BATCH_SIZE = 1234  # not a default, so the test sees the setting reach the wire
REPLY_TIMEOUT_SECS = 5
KEYS = ["gc_batch_size", "gc_cutoff_epoch_ms", "gc_rows_threshold", "timeout_cutoff_epoch_ms"]


@dataclass
class RetentionRelay:
    relay: Relay
    temporal: str  # host:port of its embedded Temporal

    def run(self, coro_fn: Any, *args: Any) -> Any:
        """Run one Temporal call from a synchronous test: a fresh client on a fresh loop."""
        return run_temporal(self.temporal, lambda client: coro_fn(client, *args))

    def trigger(self) -> RetentionRoundResult:
        return trigger_round(self.temporal)

    def app_result(self, app: str) -> AppRetentionResult:
        return app_result(self.temporal, app)


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def rr(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RetentionRelay]:
    """This module's `relay dev`, its store on SQLite in its data dir, then on a database of a private PostgreSQL
    cluster; stopped by PID at the end, and it must exit cleanly."""
    data_dir = tmp_path_factory.mktemp(f"relay-retention-{request.param}")
    settings = {"RELAY_RETENTION_INTERVAL_SECS": str(LONG_INTERVAL_SECS),
                "RELAY_RETENTION_GC_BATCH_SIZE": str(GC_BATCH_SIZE),
                "RELAY_RECOVERY_TIMEOUT_SECS": str(REPLY_TIMEOUT_SECS)}
    with ExitStack() as stack:
        if request.param == "sqlite":
            relay = stack.enter_context(running_relay(data_dir, **settings))
        else:
            relay = stack.enter_context(relay_on_postgres(stack.enter_context(postgres_cluster()), data_dir,
                                                          **settings))
        pause_schedule(relay.temporal_address)
        yield RetentionRelay(relay, relay.temporal_address)


def _configure(relay: Relay, app: str, **settings: int | None) -> None:
    with relay.api() as client:
        assert client.put(f"/v2/orgs/local/apps/{app}").status_code == 204
        if settings:
            assert client.patch(f"/v2/orgs/local/apps/{app}", json=settings).status_code == 204


def _audit(relay: Relay, app: str) -> list[tuple[str, str | None, dict[str, Any]]]:
    """The app's ``retention.*`` audit rows, oldest first, from whichever database the relay's store is on."""
    return [(row.operation, row.executor_id, row.details) for row in audit_rows_at(relay.db_url, app)
            if row.operation.startswith("retention.")]


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


# -- the exact wire payload, failover, nothing set, recent -----------------------------------------------------


def _answer(ws: Any, *, success: bool, error: str | None = None) -> dict[str, Any]:
    frame: dict[str, Any] = json.loads(ws.recv(timeout=15))
    ws.send(json.dumps({"type": "retention", "request_id": frame.get("request_id"), "success": success,
                        "error_message": error}))
    return frame


def _answer_versions(ws: Any, versions: list[tuple[str, int]]) -> None:
    """Answer the round's ``list_application_versions`` as the SDK does: ``(version_name, version_timestamp)``."""
    frame: dict[str, Any] = json.loads(ws.recv(timeout=15))
    assert frame == {"type": "list_application_versions", "request_id": frame.get("request_id")}, frame
    output = [{"version_id": f"id-{name}", "version_name": name, "version_timestamp": ts, "created_at": ts}
              for name, ts in versions]
    ws.send(json.dumps({"type": "list_application_versions", "request_id": frame["request_id"], "output": output,
                        "error_message": None}))


def _nothing_queued(ws: Any) -> bool:
    try:
        ws.recv(timeout=0)
    except TimeoutError:
        return True
    return False


def test_wire_payload_failover_nothing_set_and_recent(rr: RetentionRelay) -> None:
    relay = rr.relay
    app, quiet = "ret-raw", "ret-nothing-set"
    _configure(relay, app, gcTimeThresholdMs=90_000, gcRowsThreshold=5, globalTimeoutMs=7_200_000)
    _configure(relay, quiet, gcTimeThresholdMs=None, gcRowsThreshold=None, globalTimeoutMs=None)
    with ExitStack() as stack:
        old = stack.enter_context(play_executor(relay, app, "raw-old", version="v1"))
        wait_until(lambda: relay.executors(app) == {"raw-old": "HEALTHY"}, timeout=10, what="raw-old HEALTHY")
        new = stack.enter_context(play_executor(relay, app, "raw-new", version="v2"))
        silent = stack.enter_context(play_executor(relay, quiet, "raw-quiet"))
        wait_until(lambda: relay.executors(app).get("raw-new") == "HEALTHY"
                   and relay.executors(quiet).get("raw-quiet") == "HEALTHY", timeout=10, what="all HEALTHY")

        before = _now_ms()
        round_ = rr.trigger()
        assert "local/ret-raw" in round_.started
        assert "local/ret-nothing-set" not in round_.started + round_.still_running

        # The round asks one executor (the one registered last) for the app's latest version, as the SDK has it.
        _answer_versions(new, [("v1", 1_000), ("v2", 2_000)])
        first = _answer(new, success=False, error="busy")  # the latest version's executor is asked first
        second = _answer(old, success=True)  # then another executor, after a backoff
        assert rr.app_result(app) == AppRetentionResult("SUCCEEDED", "raw-old", attempts=2)
        after = _now_ms()

        for frame in (first, second):
            assert sorted(frame) == ["body", "request_id", "type"] and frame["type"] == "retention"
            assert sorted(frame["body"]) == KEYS
        assert first["request_id"] != second["request_id"]
        assert first["body"] == second["body"]
        body = first["body"]
        assert (body["gc_rows_threshold"], body["gc_batch_size"]) == (5, GC_BATCH_SIZE)
        # Epoch milliseconds, computed from the round's clock: no seconds, no 1000x.
        assert before - 90_000 <= body["gc_cutoff_epoch_ms"] <= after - 90_000
        assert body["gc_cutoff_epoch_ms"] - body["timeout_cutoff_epoch_ms"] == 7_200_000 - 90_000

        audit = _audit(relay, app)
        assert [(op, ex) for op, ex, _ in audit] == [
            ("retention.dispatched", "raw-new"), ("retention.failed", "raw-new"),
            ("retention.dispatched", "raw-old"), ("retention.succeeded", "raw-old"),
        ]
        for _, _, details in audit:
            assert details["body"] == body  # the exact cutoffs sent, for an operator to read
            assert details["clock_epoch_ms"] - details["settings"]["gcTimeThresholdMs"] == body["gc_cutoff_epoch_ms"]
        assert "busy" in audit[1][2]["reason"]
        assert _audit(relay, quiet) == [] and _nothing_queued(silent)

        # Started moments ago: a second round now sends nothing to this app.
        rr.trigger()
        assert rr.app_result(app).outcome == "SKIPPED"
        assert _audit(relay, app)[-1][0] == "retention.skipped"
        assert "is recent" in _audit(relay, app)[-1][2]["reason"]
        assert _nothing_queued(old) and _nothing_queued(new) and _nothing_queued(silent)


# -- real executors: garbage collection and the global timeout --------------------------------------------------


def _executor(relay: Relay, tmp: Path, name: str, app: str, sys_db: Path, **extra: str) -> Process:
    env = {"PATH": str(VENV_BIN), "RELAY_URL": relay.ws_url, "RELAY_KEY": relay.key, "APP_NAME": app,
           "SYS_DB": str(sys_db), "STEP_LOG": str(tmp / "steps.log"), "APP_VERSION": "v1", **extra}
    return Process([sys.executable, str(EXECUTOR_APP)], env=env, log=tmp / f"{name}.log")


def _statuses(sys_db: Path) -> dict[str, str]:
    if not sys_db.exists():
        return {}
    with sqlite3.connect(sys_db, timeout=10) as db:
        try:
            return dict(db.execute("SELECT workflow_uuid, status FROM workflow_status").fetchall())
        except sqlite3.OperationalError:  # not migrated yet
            return {}


def _backdate(sys_db: Path, ids: list[str], by_ms: int) -> None:
    """Make real workflows older: the SDK compares ``completed_at`` (GC) and ``created_at`` (timeout), in ms."""
    with sqlite3.connect(sys_db, timeout=10) as db:
        for workflow_id in ids:
            db.execute("UPDATE workflow_status SET created_at = created_at - ?, updated_at = updated_at - ?, "
                       "completed_at = completed_at - ? WHERE workflow_uuid = ?", (by_ms, by_ms, by_ms, workflow_id))


def test_old_finished_workflows_are_collected_and_old_pending_ones_time_out(rr: RetentionRelay,
                                                                           tmp_path: Path) -> None:
    relay, app, sys_db = rr.relay, "ret-gc", tmp_path / "sys.sqlite"
    minute = 60_000
    _configure(relay, app, gcTimeThresholdMs=minute, globalTimeoutMs=minute)
    old, new = ["old-1", "old-2", "old-3"], ["new-1", "new-2"]
    executor = _executor(relay, tmp_path, "a", app, sys_db, FINISHED_WORKFLOWS=",".join(old + new),
                         PENDING_WORKFLOWS="stuck-old,stuck-new")
    try:
        expected = {**dict.fromkeys(old + new, "SUCCESS"), "stuck-old": "PENDING", "stuck-new": "PENDING"}
        wait_until(lambda: _statuses(sys_db) == expected, timeout=60, what="workflows created")
        wait_until(lambda: list(relay.executors(app).values()) == ["HEALTHY"], timeout=30, what="executor HEALTHY")
        # Ten minutes old against a one-minute threshold; the others are seconds old. A threshold read as seconds
        # (1000x too long) collects nothing; one read as microseconds (1000x too short) collects everything.
        _backdate(sys_db, [*old, "stuck-old"], by_ms=10 * minute)

        rr.trigger()
        result = rr.app_result(app)
        assert result.outcome == "SUCCEEDED", result
        # "success" means started: the executor collects, then times out, in the background.
        wait_until(lambda: _statuses(sys_db).get("stuck-old") == "CANCELLED", timeout=30, what="stuck-old CANCELLED")
        assert _statuses(sys_db) == {**dict.fromkeys(new, "SUCCESS"), "stuck-old": "CANCELLED",
                                     "stuck-new": "PENDING"}
        [(_, _, dispatched)] = [a for a in _audit(relay, app) if a[0] == "retention.dispatched"]
        body, clock = dispatched["body"], dispatched["clock_epoch_ms"]
        assert body == {"gc_cutoff_epoch_ms": clock - minute, "gc_rows_threshold": 1_000_000,
                        "gc_batch_size": GC_BATCH_SIZE, "timeout_cutoff_epoch_ms": clock - minute}
    finally:
        executor.stop()


# -- the only executor SIGKILLed ---------------------------------------------------------------------------------


def test_round_without_a_healthy_executor_is_skipped_and_the_next_one_succeeds(rr: RetentionRelay,
                                                                                tmp_path: Path) -> None:
    relay, app, sys_db = rr.relay, "ret-kill", tmp_path / "sys.sqlite"
    _configure(relay, app, gcTimeThresholdMs=3_600_000)
    a = _executor(relay, tmp_path, "a", app, sys_db)
    b: Process | None = None
    try:
        wait_until(lambda: list(relay.executors(app).values()) == ["HEALTHY"], timeout=60, what="A HEALTHY")
        [a_id] = relay.executors(app)
        a.kill()
        wait_until(lambda: relay.executors(app) == {a_id: "DISCONNECTED"}, timeout=5, what="A DISCONNECTED")

        rr.trigger()
        skipped = rr.app_result(app)
        assert (skipped.outcome, skipped.reason) == ("SKIPPED", "no HEALTHY executor")
        assert [(op, ex, d["reason"]) for op, ex, d in _audit(relay, app)] == [
            ("retention.skipped", None, "no HEALTHY executor")]

        b = _executor(relay, tmp_path, "b", app, sys_db)
        wait_until(lambda: "HEALTHY" in relay.executors(app).values(), timeout=60, what="B HEALTHY")
        [b_id] = [e for e, status in relay.executors(app).items() if status == "HEALTHY"]
        rr.trigger()
        assert rr.app_result(app) == AppRetentionResult("SUCCEEDED", b_id, attempts=1)
        assert [(op, ex) for op, ex, _ in _audit(relay, app)] == [
            ("retention.skipped", None), ("retention.dispatched", b_id), ("retention.succeeded", b_id)]
    finally:
        a.stop()
        if b is not None:
            b.stop()


# -- the schedule across restarts --------------------------------------------------------------------------------


async def _describe(client: Client) -> tuple[list[str], Any]:
    ids = [s.id async for s in await client.list_schedules()]
    description = await client.get_schedule_handle(RETENTION_SCHEDULE_ID).describe()
    return ids, description


async def _unpause(client: Client) -> None:
    await client.get_schedule_handle(RETENTION_SCHEDULE_ID).unpause()


def test_the_schedule_exists_once_across_restarts_and_follows_the_interval(tmp_path: Path) -> None:
    env = relay_env(tmp_path, RELAY_RETENTION_INTERVAL_SECS="3600")
    temporal = f"127.0.0.1:{env['RELAY_TEMPORAL_PORT']}"
    with running_relay(tmp_path, env, log="first.log") as first:
        rr = RetentionRelay(first, temporal)
        wait_until(lambda: rr.run(schedule_exists), timeout=15, what="the retention schedule")
        ids, description = rr.run(_describe)
        assert ids.count(RETENTION_SCHEDULE_ID) == 1
        schedule = description.schedule
        assert [i.every.total_seconds() for i in schedule.spec.intervals] == [3600]
        assert schedule.policy.overlap == ScheduleOverlapPolicy.SKIP
        assert schedule.policy.catchup_window.total_seconds() == 60
        assert schedule.action.workflow == "RetentionWorkflow"
        # An operator pauses it: a restart must not undo that.
        rr.run(lambda client: client.get_schedule_handle(RETENTION_SCHEDULE_ID).pause(note="paused"))

    with running_relay(tmp_path, env, log="second.log", RELAY_RETENTION_INTERVAL_SECS="1") as second:
        rr = RetentionRelay(second, temporal)

        def reconciled() -> bool:
            ids, description = rr.run(_describe)
            assert ids.count(RETENTION_SCHEDULE_ID) == 1
            return [i.every.total_seconds() for i in description.schedule.spec.intervals] == [1]

        wait_until(reconciled, timeout=15, interval=0.2, what="the interval updated")
        _, description = rr.run(_describe)
        assert description.schedule.state.paused
        [arg] = rr.run(lambda client: client.data_converter.decode(description.schedule.action.args,
                                                                   [RetentionInput]))
        assert arg.interval.total_seconds() == 1
        # Unpaused, it runs rounds by itself, one per second.
        actions = description.info.num_actions
        rr.run(_unpause)
        wait_until(lambda: rr.run(_describe)[1].info.num_actions >= actions + 2, timeout=10, interval=0.2,
                   what="two scheduled rounds")
