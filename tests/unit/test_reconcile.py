"""The reconciliation's schedule and its start-up round, as the worker builds them from the settings."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from temporalio.client import ScheduleActionStartWorkflow, ScheduleOverlapPolicy

import worker
from core.settings import Settings
from workflows.contracts.common import SHARED_TASK_QUEUE
from workflows.contracts.reconcile import RECONCILE_SCHEDULE_ID, ReconcileInput


def test_the_schedule_runs_a_round_every_interval_with_the_timeouts_from_the_settings(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, reconcile_interval_secs=30, recovery_timeout_secs=45,
                        gateway_heartbeat_timeout_secs=7)
    schedule = worker.reconcile_schedule(settings)
    assert [i.every for i in schedule.spec.intervals] == [timedelta(seconds=30)]
    assert schedule.policy.overlap == ScheduleOverlapPolicy.SKIP
    action = schedule.action
    assert isinstance(action, ScheduleActionStartWorkflow)
    assert (action.id, action.task_queue) == (RECONCILE_SCHEDULE_ID, SHARED_TASK_QUEUE)
    assert list(action.args) == [ReconcileInput(recovery_timeout=timedelta(seconds=45),
                                                probe_timeout=timedelta(seconds=7))]
    assert worker.reconcile_input(settings) == action.args[0]
    assert Settings(data_dir=tmp_path).reconcile_interval == timedelta(minutes=1)
    assert Settings(data_dir=tmp_path, reconcile_interval_secs=0).reconcile_interval == timedelta(0)
    assert worker.RECONCILE_STARTUP_ID != RECONCILE_SCHEDULE_ID  # never one of the schedule's runs
