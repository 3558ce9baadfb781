"""The reconciliation on the time-skipping server.

A lifecycle workflow started by it (``LifecycleInput.reconcile``) reads the executor's registry row back and
carries on from it: HEALTHY asks the row's gateway (a live socket keeps it HEALTHY; none, or the gateway known
gone, makes it DISCONNECTED with a full grace from now); DISCONNECTED gets a full grace from now; DEAD resumes its
recovery through the gate and the fence. No row (its lifecycle ended meanwhile): nothing happens.

The round (``ReconcileWorkflow`` with the real activity on a SQLite store) starts a lifecycle for every row whose
workflow is not running, and leaves the running ones alone."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.reconcile import ReconcileActivities
from core.models import make_engine
from core.store import Store
from tests.conftest import assert_eventually
from tests.histories.record import start_env
from tests.lifecycle_fakes import APP, DEAD, DISCONNECTED, GRACE, ORG, RECONNECTED, VERSION, FakeRelay, Relay, served
from workflows.contracts.common import SHARED_TASK_QUEUE, ExecutorInfo, ExecutorStatus, lifecycle_workflow_id
from workflows.contracts.gateway_watch import ProbeGatewayReply
from workflows.contracts.lifecycle import LifecycleInput
from workflows.contracts.reconcile import ReconcileInput, RegistryRow
from workflows.lifecycle import ExecutorLifecycleWorkflow
from workflows.reconcile import ReconcileWorkflow


@pytest.fixture(scope="module")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    env = await start_env()
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture
async def relay(env: WorkflowEnvironment) -> AsyncIterator[Relay]:
    async with served(env, "reconcile-test") as relay:
        yield relay


def _row(relay: Relay, status: ExecutorStatus) -> RegistryRow:
    return RegistryRow(status, app_version=VERSION, gateway_queue=relay.fakes.self_queue, connection_id="c1")


def _reconciled(fakes: FakeRelay) -> dict[str, object]:
    found = [c.input.details for c in fakes.audit_calls if c.input.operation == "executor.reconciled"]
    assert len(found) == 1, fakes.audits()
    return found[0]


async def test_healthy_with_no_socket_gets_a_full_grace_from_now_then_is_recovered(relay: Relay) -> None:
    fakes = relay.fakes
    fakes.registry_row = _row(relay, ExecutorStatus.HEALTHY)
    started_at = await relay.env.get_current_time()
    await relay.start_reconciled()

    result = await relay.result()

    assert (result.status, result.recovered_by) == ("RECOVERED", "peer-a")
    assert fakes.statuses() == [DISCONNECTED, DEAD]
    assert [p.task_queue for p in fakes.probes][:1] == [fakes.self_queue]  # the row's gateway was asked first
    disconnected, dead = fakes.records
    assert disconnected.input.details["connection_id"] == "c1"
    assert dead.scheduled >= started_at + GRACE  # the grace counts from when Relay noticed
    found = _reconciled(fakes)
    assert (found["found"], found["gateway_queue"]) == ("HEALTHY", fakes.self_queue)
    assert "no socket" in str(found["outcome"])
    assert fakes.audits()[0] == "executor.reconciled"
    assert [d.input.dead_executor_ids for d in fakes.dispatches] == [[relay.executor_id]]


async def test_healthy_with_a_live_socket_stays_healthy_and_its_close_is_heard(relay: Relay) -> None:
    fakes = relay.fakes
    fakes.registry_row = _row(relay, ExecutorStatus.HEALTHY)
    fakes.probe_replies = [ProbeGatewayReply(connection=relay.connected_signal("c1"), contact_for=timedelta(days=1))]
    await relay.start_reconciled()
    await assert_eventually(lambda: _reconciled(fakes))
    await relay.env.sleep(GRACE * 2)  # a grace wrongly started would end here

    state = await relay.state()
    assert (state.status, state.connection is not None) == ("HEALTHY", True)
    assert fakes.records == [] and fakes.dispatches == []
    assert "live socket" in str(_reconciled(fakes)["outcome"])
    await relay.disconnect("c1")  # the workflow acts on the executor again
    await relay.wait_statuses(DISCONNECTED)


async def test_healthy_on_a_gateway_known_gone_is_not_probed(relay: Relay) -> None:
    fakes = relay.fakes
    fakes.registry_row = _row(relay, ExecutorStatus.HEALTHY)
    fakes.gone_queues = {fakes.self_queue}
    await relay.start_reconciled()
    await relay.wait_statuses(DISCONNECTED)

    assert fakes.probes == []
    assert "gone" in str(_reconciled(fakes)["outcome"])


async def test_disconnected_gets_a_full_grace_from_now(relay: Relay) -> None:
    fakes = relay.fakes
    fakes.registry_row = _row(relay, ExecutorStatus.DISCONNECTED)
    started_at = await relay.env.get_current_time()
    await relay.start_reconciled()

    result = await relay.result()

    assert result.status == "RECOVERED"
    assert fakes.statuses() == [DISCONNECTED, DEAD]
    assert fakes.records[1].scheduled >= started_at + GRACE
    assert _reconciled(fakes)["found"] == "DISCONNECTED"


async def test_disconnected_that_reconnects_within_the_new_grace_is_never_recovered(relay: Relay) -> None:
    fakes = relay.fakes
    fakes.registry_row = _row(relay, ExecutorStatus.DISCONNECTED)
    await relay.start_reconciled()
    await relay.wait_statuses(DISCONNECTED)
    await relay.connect("c2")
    await relay.wait_statuses(DISCONNECTED, RECONNECTED)
    await relay.env.sleep(GRACE * 2)

    assert fakes.dispatches == [] and fakes.deletes == []


async def test_dead_resumes_its_recovery_through_the_gate_and_the_fence(relay: Relay) -> None:
    fakes = relay.fakes
    fakes.registry_row = _row(relay, ExecutorStatus.DEAD)
    await relay.start_reconciled()

    result = await relay.result()

    assert (result.status, result.recovered_by) == ("RECOVERED", "peer-a")
    assert fakes.statuses() == []  # already DEAD: nothing recorded again
    assert len(fakes.admissions) == 1  # the gate
    assert [p.task_queue for p in fakes.probes] == [fakes.self_queue]  # the fence, before the request
    assert len(fakes.deletes) == 1
    assert _reconciled(fakes)["outcome"] == "its recovery resumes"


async def test_dead_whose_gateway_holds_a_live_socket_is_called_off(relay: Relay) -> None:
    fakes = relay.fakes
    fakes.registry_row = _row(relay, ExecutorStatus.DEAD)
    fakes.probe_replies = [ProbeGatewayReply(connection=relay.connected_signal("c2"), contact_for=timedelta(days=1))]
    await relay.start_reconciled()
    await relay.wait_statuses(RECONNECTED)

    assert fakes.dispatches == [] and fakes.deletes == []
    assert "executor.recovery.cancelled" in fakes.audits()


async def test_no_row_ends_the_run_without_a_write(relay: Relay) -> None:
    fakes = relay.fakes
    fakes.registry_row = None
    await relay.start_reconciled()

    result = await relay.result()

    assert result.status == "NOTHING_TO_RECONCILE"
    assert fakes.records == [] and fakes.audit_calls == [] and fakes.deletes == [] and len(fakes.row_reads) == 1


# -- the round -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
async def round_env() -> AsyncIterator[WorkflowEnvironment]:
    """Another server: the round leaves lifecycle workflows waiting on the unserved shared queue, which must not
    stop the lifecycle tests' server from skipping time."""
    env = await start_env()
    try:
        yield env
    finally:
        await env.shutdown()


async def test_a_round_starts_a_lifecycle_for_each_row_without_one(round_env: WorkflowEnvironment,
                                                                   tmp_path: Path) -> None:
    client = round_env.client
    store = Store(make_engine(f"sqlite:///{tmp_path / 'relay.db'}"))
    store.ensure_app(ORG, APP)
    suffix = uuid.uuid4().hex[:8]
    rows = {f"healthy-{suffix}": ExecutorStatus.HEALTHY, f"disc-{suffix}": ExecutorStatus.DISCONNECTED,
            f"dead-{suffix}": ExecutorStatus.DEAD, f"running-{suffix}": ExecutorStatus.HEALTHY}
    for executor_id, status in rows.items():
        store.record_status(org=ORG, app=APP, executor_id=executor_id, status=status, operation="test",
                            event_key=str(uuid.uuid4()), info=ExecutorInfo(executor_id, VERSION),
                            connection_id="c1", gateway_queue="gw", details={})
    queue = f"round-{uuid.uuid4()}"
    # ``running``'s lifecycle runs (on a queue nobody serves: it just waits).
    await client.start_workflow(ExecutorLifecycleWorkflow.run, LifecycleInput(ORG, APP, f"running-{suffix}"),
                                id=lifecycle_workflow_id(ORG, APP, f"running-{suffix}"), task_queue=f"{queue}-idle")
    try:
        async with Worker(client, task_queue=queue, workflows=[ReconcileWorkflow],
                          activities=ReconcileActivities(store).all()):
            first = await client.execute_workflow(ReconcileWorkflow.run, ReconcileInput(), id=f"r-{uuid.uuid4()}",
                                                  task_queue=queue)
            second = await client.execute_workflow(ReconcileWorkflow.run, ReconcileInput(), id=f"r-{uuid.uuid4()}",
                                                   task_queue=queue)

        assert (first.rows, first.running) == (4, 1)
        assert first.started == sorted([f"{ORG}/{APP}/dead-{suffix}: DEAD", f"{ORG}/{APP}/disc-{suffix}: DISCONNECTED",
                                        f"{ORG}/{APP}/healthy-{suffix}: HEALTHY"])
        assert (second.rows, second.running, second.started) == (4, 4, [])  # each has its workflow now
        for executor_id in (f"healthy-{suffix}", f"disc-{suffix}", f"dead-{suffix}"):
            handle = client.get_workflow_handle(lifecycle_workflow_id(ORG, APP, executor_id))
            assert (await handle.describe()).status == WorkflowExecutionStatus.RUNNING
            history = await handle.fetch_history()
            first_event = history.events[0].workflow_execution_started_event_attributes
            assert first_event.task_queue.name == SHARED_TASK_QUEUE
            [arg] = await client.data_converter.decode(first_event.input.payloads, [LifecycleInput])
            assert (arg.reconcile, arg.executor_id, arg.state) == (True, executor_id, None)
    finally:
        store.engine.dispose()
