"""``core.orphans``: the aggregates body a sweep sends, and which executor ids of the answer are orphans."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from temporalio.client import ScheduleActionStartWorkflow

import worker
from core import orphans, units
from core.models import make_engine
from core.settings import Settings
from core.store import Store
from workflows.contracts.common import SHARED_TASK_QUEUE, ExecutorStatus
from workflows.contracts.orphans import ORPHANS_SCHEDULE_ID, Orphan, OrphanInfo, OrphanSweepInput

NOW = datetime(2026, 12, 1, 12, 0, 0, 123000, tzinfo=UTC)
HOUR = timedelta(hours=1)


def row(executor_id: Any, version: Any, count: Any, created: datetime | Any) -> dict[str, Any]:
    created_ms = units.datetime_to_epoch_ms(created) if isinstance(created, datetime) else created
    return {"group": {"executor_id": executor_id, "application_version": version}, "count": count,
            "min_created_at": created_ms}


def find(*rows: dict[str, Any], registered: set[str] | None = None) -> list[Orphan]:
    return orphans.find_orphans({"output": list(rows)}, registered=registered or set(), now=NOW, min_age=HOUR)


def test_the_body_asks_for_pending_workflows_created_before_the_minimum_age_by_executor_and_version() -> None:
    body = orphans.aggregates_body(NOW, HOUR)
    assert body == {"group_by_executor_id": True, "group_by_application_version": True, "select_count": True,
                    "select_min_created_at": True, "status": ["PENDING"],
                    "end_time": "2026-12-01T11:00:00.123000+00:00"}
    # As the SDK reads it (dbos._sys_db: fromisoformat, then epoch ms compared with created_at).
    assert int(datetime.fromisoformat(body["end_time"]).timestamp() * 1000) == units.datetime_to_epoch_ms(NOW - HOUR)


def test_an_old_pending_executor_id_with_no_registry_row_is_an_orphan_with_its_version() -> None:
    assert find(row("dead-1", "v7", 3, NOW - 2 * HOUR)) == [Orphan("dead-1", OrphanInfo("v7", 3, NOW - 2 * HOUR))]


def test_registered_ids_in_any_status_are_never_orphans() -> None:
    assert find(row("dead-1", "v7", 3, NOW - 2 * HOUR), registered={"dead-1"}) == []


def test_local_is_never_an_orphan() -> None:
    """DBOS's id for a process with no conductor: it recovers its own workflows, and may be alive right now."""
    assert find(row(orphans.LOCAL_EXECUTOR_ID, "v7", 3, NOW - 20 * HOUR)) == []


def test_too_young_is_not_an_orphan_even_if_the_sdk_ignored_the_filter() -> None:
    assert find(row("dead-1", "v7", 3, NOW - HOUR + timedelta(milliseconds=1))) == []
    assert [o.executor_id for o in find(row("dead-1", "v7", 3, NOW - HOUR))] == ["dead-1"]


def test_the_oldest_version_goes_first_and_the_others_are_named() -> None:
    found = find(row("dead-1", "v8", 1, NOW - 2 * HOUR), row("dead-1", "v7", 5, NOW - 3 * HOUR))
    assert found == [Orphan("dead-1", OrphanInfo("v7", 5, NOW - 3 * HOUR, ["v8"]))]


def test_rows_relay_cannot_read_are_left_out() -> None:
    assert find(row(None, "v7", 3, NOW - 2 * HOUR), row("", "v7", 3, NOW - 2 * HOUR),
                row("a", "v7", 0, NOW - 2 * HOUR), row("b", "v7", True, NOW - 2 * HOUR),
                row("c", "v7", 3, None), row("d", "v7", 3, "yesterday"), {"group": "x"}) == []
    assert orphans.find_orphans({"output": None}, registered=set(), now=NOW, min_age=HOUR) == []


def test_min_created_at_as_text_is_read() -> None:
    assert [o.executor_id for o in find(row("e", "v7", 2, str(units.datetime_to_epoch_ms(NOW - 2 * HOUR))))] == ["e"]


def test_the_audit_details_name_ids_counts_and_the_oldest_workflow() -> None:
    found = find(row("dead-1", "v7", 3, NOW - 2 * HOUR))
    details = orphans.audit_details(found, asked="live-1", min_age=HOUR)
    assert details["executorIds"] == ["dead-1"] and details["orphanMinAgeSecs"] == 3600
    assert details["orphans"] == [{"executorId": "dead-1", "appVersion": "v7", "pending": 3,
                                   "oldestCreatedAt": (NOW - 2 * HOUR).isoformat(), "otherVersions": []}]


def test_the_store_lists_apps_with_a_healthy_executor_and_every_registered_id(tmp_path: Path) -> None:
    store = Store(make_engine(f"sqlite:///{tmp_path / 'relay.db'}"))
    try:
        for org, app, executor_id, status in [("o", "a", "e1", ExecutorStatus.HEALTHY),
                                              ("o", "a", "e2", ExecutorStatus.HEALTHY),
                                              ("o", "b", "e3", ExecutorStatus.DEAD),
                                              ("p", "c", "e4", ExecutorStatus.DISCONNECTED)]:
            store.ensure_app(org, app)
            store.record_status(org=org, app=app, executor_id=executor_id, status=status, operation="x",
                                event_key=executor_id, info=None, connection_id=None, gateway_queue=None, details={})
        assert store.apps_with_healthy_executors() == [("o", "a")]
        assert store.registered_executor_ids() == {"e1", "e2", "e3", "e4"}
    finally:
        store.engine.dispose()


def test_the_schedule_runs_a_sweep_every_interval_with_the_minimum_age_from_the_settings(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, orphan_sweep_interval_secs=120, orphan_min_age_secs=7200)
    schedule = worker.orphans_schedule(settings)
    assert [i.every for i in schedule.spec.intervals] == [timedelta(minutes=2)]
    action = schedule.action
    assert isinstance(action, ScheduleActionStartWorkflow)
    assert (action.id, action.task_queue) == (ORPHANS_SCHEDULE_ID, SHARED_TASK_QUEUE)
    [sweep] = action.args
    assert sweep == OrphanSweepInput(min_age=timedelta(hours=2), reply_timeout=settings.management_timeout,
                                     recovery_timeout=settings.recovery_timeout,
                                     probe_timeout=settings.gateway_heartbeat_timeout)
    assert Settings(data_dir=tmp_path).orphan_sweep_interval == timedelta(minutes=10)
    assert Settings(data_dir=tmp_path, orphan_sweep_interval_secs=0).orphan_sweep_interval == timedelta(0)
