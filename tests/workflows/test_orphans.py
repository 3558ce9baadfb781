"""The orphan sweep on the time-skipping server: a lifecycle workflow started as an orphan waits one grace, is
declared DEAD and recovered through a peer with confirmation, every row marked ``"orphan": true``; one that
connects during that grace is never recovered; and a sweep (``OrphanSweepWorkflow``, with the real decision and
database activities on a SQLite store, fake executors) starts one lifecycle per orphan, leaving alone registered
ids, ``local`` and ids whose lifecycle workflow already runs."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.orphans import OrphanActivities
from core import units
from core.models import make_engine
from core.store import Store
from tests.conftest import assert_eventually
from tests.histories.record import start_env
from tests.lifecycle_fakes import APP, DEAD, GRACE, HEALTHY, ORG, VERSION, FakeRelay, Relay, served
from worker import workflow_runner
from workflows.contracts.common import (
    SHARED_TASK_QUEUE,
    Activity,
    Candidate,
    ExecutorInfo,
    ExecutorStatus,
    lifecycle_workflow_id,
)
from workflows.contracts.lifecycle import LifecycleInput
from workflows.contracts.management import ExecutorRequestInput, ExecutorRequestReply, pack
from workflows.contracts.orphans import OrphanInfo, OrphanSweepInput
from workflows.contracts.retention import SelectRetentionExecutorInput
from workflows.lifecycle import ExecutorLifecycleWorkflow
from workflows.orphans import OrphanSweepWorkflow

OLDEST = datetime(2026, 11, 30, 9, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping server of this module's lifecycle tests: their own, so that no other module's workflows can
    hold its time-skipping lock (see tests/workflows/test_retention.py)."""
    env = await start_env()
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture
async def relay(env: WorkflowEnvironment) -> AsyncIterator[Relay]:
    """The lifecycle workflow with FakeRelay's activities, each peer's gateway fakes on its own queue."""
    async with served(env, "orphan-test") as relay:
        yield relay


async def test_an_orphan_waits_a_grace_then_is_recovered_through_a_peer_and_audited_as_orphan(relay: Relay) -> None:
    fakes = relay.fakes
    started_at = await relay.env.get_current_time()
    await relay.start_orphan(OrphanInfo(VERSION, pending=3, oldest_created_at=OLDEST))

    result = await relay.result()

    assert (result.status, result.recovered_by, result.attempts) == ("RECOVERED", "peer-a", 1)
    assert fakes.statuses() == [DEAD]
    dead = fakes.records[0]
    assert dead.input.info == ExecutorInfo(relay.executor_id, application_version=VERSION)
    assert dead.input.details["orphan"] is True
    assert dead.scheduled >= started_at + GRACE  # one grace for it to connect before it is declared DEAD
    assert fakes.probes == []  # no gateway ever held it: nothing to ask, it counts as gone
    assert [(d.input.executor_id, d.input.dead_executor_ids) for d in fakes.dispatches] == [
        ("peer-a", [relay.executor_id])]
    assert [(c.input.dead_executor_id, c.input.app_version) for c in fakes.exist_calls] == [
        (relay.executor_id, VERSION)]
    assert len(fakes.deletes) == 1 and fakes.selects[0].input.app_version == VERSION
    audits = {c.input.operation: c.input.details for c in fakes.audit_calls}
    assert list(audits) == ["executor.orphan.found", "executor.recovery.dispatched", "executor.recovery.succeeded"]
    assert all(d["orphan"] is True for d in audits.values())
    assert audits["executor.orphan.found"]["pending"] == 3
    assert audits["executor.orphan.found"]["oldest_created_at"] == OLDEST.isoformat()


async def test_an_orphan_that_connects_within_its_grace_is_never_recovered(relay: Relay) -> None:
    fakes = relay.fakes
    await relay.start_orphan(OrphanInfo(VERSION, pending=1))
    await relay.connect("c1")  # time is not skipping: this lands well inside the grace
    await relay.wait_statuses(HEALTHY)
    await relay.env.sleep(GRACE * 2)  # a grace still armed would fire here

    state = await relay.state()
    assert (state.status, state.orphan) == ("HEALTHY", False)
    assert fakes.dispatches == [] and fakes.deletes == [] and fakes.selects == []
    assert "executor.recovery.dispatched" not in fakes.audits()


# -- the sweep -----------------------------------------------------------------------------------------------


class FakeExecutors:
    """One HEALTHY executor of the app answering ``get_workflow_aggregates`` with ``rows``."""

    def __init__(self, gateway_queue: str, rows: list[dict[str, Any]]) -> None:
        self.gateway_queue, self.rows = gateway_queue, rows
        self.frames: list[str] = []

    @activity.defn(name=Activity.SELECT_RETENTION_EXECUTOR)
    async def select_retention_executor(self, input: SelectRetentionExecutorInput) -> Candidate | None:
        return None if "live-1" in input.exclude else Candidate("live-1", self.gateway_queue, VERSION)

    @activity.defn(name=Activity.EXECUTOR_REQUEST)
    async def executor_request(self, input: ExecutorRequestInput) -> ExecutorRequestReply:
        self.frames.append(input.frame)
        return ExecutorRequestReply(pack({"type": "get_workflow_aggregates", "output": self.rows}))


def _row(executor_id: str, count: int, age: timedelta, now: datetime) -> dict[str, Any]:
    return {"group": {"executor_id": executor_id, "application_version": VERSION}, "count": count,
            "min_created_at": units.datetime_to_epoch_ms(now - age)}


@pytest.fixture(scope="module")
async def sweep_env() -> AsyncIterator[WorkflowEnvironment]:
    """Another server, with Relay's search attributes (the sweep starts lifecycle workflows with them), discarded
    afterwards with the lifecycle workflows the sweep leaves waiting on the unserved shared queue: workflow tasks
    nobody picks up stop the test server from skipping time, so they must not share the lifecycle tests' server."""
    env = await start_env()
    try:
        yield env
    finally:
        await env.shutdown()


async def test_a_sweep_starts_one_lifecycle_per_orphan_and_skips_running_ones(
        sweep_env: WorkflowEnvironment, tmp_path: Path) -> None:
    env, client = sweep_env, sweep_env.client
    store = Store(make_engine(f"sqlite:///{tmp_path / 'relay.db'}"))
    store.ensure_app(ORG, APP)
    suffix = uuid.uuid4().hex[:8]
    live, gone, running = f"live-{suffix}", f"gone-{suffix}", f"running-{suffix}"
    store.record_status(org=ORG, app=APP, executor_id="live-1", status=ExecutorStatus.HEALTHY,
                        operation="executor.healthy", event_key=str(uuid.uuid4()),
                        info=ExecutorInfo("live-1", VERSION), connection_id="c1", gateway_queue="gw",
                        details={})
    store.record_status(org=ORG, app=APP, executor_id=live, status=ExecutorStatus.DISCONNECTED,
                        operation="executor.disconnected", event_key=str(uuid.uuid4()), info=None,
                        connection_id=None, gateway_queue=None, details={})
    now = await env.get_current_time()
    hour = timedelta(hours=1)
    queue = f"sweep-{uuid.uuid4()}"
    fakes = FakeExecutors(f"{queue}-gw", [
        _row(gone, 4, 2 * hour, now), _row(running, 1, 3 * hour, now), _row(live, 2, 2 * hour, now),
        _row("local", 7, 5 * hour, now), _row(f"young-{suffix}", 1, timedelta(minutes=5), now)])
    # An earlier sweep's recovery of ``running`` still runs (on a queue nobody serves: it just waits).
    await client.start_workflow(ExecutorLifecycleWorkflow.run, LifecycleInput(ORG, APP, running),
                                id=lifecycle_workflow_id(ORG, APP, running), task_queue=f"{queue}-idle")
    sweep = OrphanActivities(store)
    try:
        async with Worker(client, task_queue=queue, workflows=[OrphanSweepWorkflow],
                          activities=[*sweep.all(), fakes.select_retention_executor],
                          workflow_runner=workflow_runner(client.data_converter)), \
                Worker(client, task_queue=fakes.gateway_queue, activities=[fakes.executor_request]):
            result = await client.execute_workflow(OrphanSweepWorkflow.run, OrphanSweepInput(min_age=hour),
                                                   id=f"sweep-{uuid.uuid4()}", task_queue=queue)

        assert result.started == [f"{ORG}/{APP}/{gone}"]
        assert result.running == [f"{ORG}/{APP}/{running}"]
        assert result.unchecked == []
        assert '"status": ["PENDING"]' in fakes.frames[0] and '"group_by_executor_id": true' in fakes.frames[0]
        handle = client.get_workflow_handle(lifecycle_workflow_id(ORG, APP, gone))
        described = await handle.describe()
        assert described.status == WorkflowExecutionStatus.RUNNING
        found = [a for a in store.list_audit(ORG) if a.operation == "orphans.found"]
        assert len(found) == 1 and found[0].app == APP
        assert found[0].details is not None
        assert found[0].details["executorIds"] == [gone, running]
        assert found[0].details["orphans"][0]["pending"] == 4
        started = await handle.fetch_history()
        first = started.events[0].workflow_execution_started_event_attributes
        assert first.task_queue.name == SHARED_TASK_QUEUE
        args = await client.data_converter.decode(first.input.payloads, [LifecycleInput])
        oldest = units.epoch_ms_to_datetime(units.datetime_to_epoch_ms(now - 2 * hour))
        assert args[0].orphan == OrphanInfo(VERSION, 4, oldest)
    finally:
        store.engine.dispose()


async def test_an_orphan_of_an_app_deleted_during_its_grace_ends_without_a_record(relay: Relay) -> None:
    """App deletion signals only executors with a registry row, which an orphan in its grace lacks: the run
    looks at the app again before it records anything."""
    fakes = relay.fakes
    await relay.start_orphan(OrphanInfo(VERSION, pending=1))
    await assert_eventually(lambda: _audited(fakes, "executor.orphan.found"))
    fakes.grace = None  # the app is deleted

    result = await relay.result()

    assert result.status == "REMOVED"
    assert fakes.records == [] and fakes.dispatches == [] and len(fakes.deletes) == 1


def _audited(fakes: FakeRelay, operation: str) -> None:
    assert operation in fakes.audits()
