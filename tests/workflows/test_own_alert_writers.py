"""The writers of Relay's own alert rows outside the lifecycle workflow. The orphan sweep's activity starts the
OrphansFound alert's delivery right after its row, with the row's event key (once, however often it is retried);
the recovery gate's admission that trips the storm breaker tells its lifecycle workflow the trip row's key, which
starts the RecoveryBreaker alert (``test_lifecycle_workflow``). Real activities on a SQLite store, run in an
``ActivityEnvironment`` whose client is the time-skipping server's; a delivery started is looked up there by the id
its row gives it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from activities.alerts import own_event, start_own_alert_delivery
from activities.gate import GateActivities
from activities.orphans import OrphanActivities
from core import own_alerts
from core.gate import GatePolicy, breaker_event_key
from core.models import make_engine
from core.store import Store
from workflows.contracts.alerts import OWN_ALERT_WORKFLOW, OwnAlertEvent, OwnAlertInput, own_alert_workflow_id
from workflows.contracts.common import ExecutorInfo, ExecutorStatus
from workflows.contracts.gate import AdmitRecoveryInput
from workflows.contracts.orphans import FindOrphansInput

POLICY = GatePolicy(storm_share=0.5, storm_min=3, window=timedelta(seconds=60), pace=timedelta(seconds=2))


async def _started(env: WorkflowEnvironment, event_key: str) -> OwnAlertInput:
    """The input of the delivery started for the row ``event_key`` (it waits on the shared queue: no worker
    there in this test), which is then ended."""
    handle = env.client.get_workflow_handle(own_alert_workflow_id(own_alerts.alert_id(event_key)))
    description = await handle.describe()
    assert description.workflow_type == OWN_ALERT_WORKFLOW
    assert description.status == WorkflowExecutionStatus.RUNNING
    history = await handle.fetch_history()
    [started] = await env.client.data_converter.decode(
        history.events[0].workflow_execution_started_event_attributes.input.payloads, [OwnAlertInput])
    await handle.terminate("test: nobody runs the shared queue here")
    assert isinstance(started, OwnAlertInput)
    return started


async def test_a_breaker_trip_names_its_row_for_the_alert(time_skipping_env: WorkflowEnvironment,
                                                          tmp_path: Path) -> None:
    store = Store(make_engine(f"sqlite:///{tmp_path / 'relay.db'}"))
    org, app = "acme", f"storm-{uuid.uuid4().hex[:8]}"
    for n in range(4):
        store.record_status(org=org, app=app, executor_id=f"e{n}", status=ExecutorStatus.DEAD if n < 3 else
                            ExecutorStatus.HEALTHY, operation="executor.x", event_key=uuid.uuid4().hex,
                            info=ExecutorInfo(f"e{n}", application_version="v1"), connection_id=f"c{n}",
                            gateway_queue="q", details={})
    gate = GateActivities(store, POLICY)
    env = ActivityEnvironment(client=time_skipping_env.client)
    now = datetime.now(UTC)
    # Three of four DEAD (a share of 0.5, at least 3): the first admission trips the breaker, and only it says so.
    replies = [await env.run(gate.admit_recovery, AdmitRecoveryInput(org, app, f"e{n}", "t", now))
               for n in range(3)]
    assert [r.tripped for r in replies] == [breaker_event_key(org, app, 1), "", ""]
    assert replies[0].storm == {"down": 3, "population": 4}
    [row] = [r for r in store.list_audit(org, app=app) if r.operation == "app.recovery.breaker_tripped"]
    assert row.event_key == replies[0].tripped  # the alert's id comes from the row's key
    alert = own_alerts.alert_of(own_event(row))
    assert (alert.kind, alert.alert_id) == ("RecoveryBreaker", own_alerts.alert_id(replies[0].tripped))
    assert "3 of 4 executors went down at once" in alert.message
    store.engine.dispose()


async def test_orphans_found_start_their_alert_once(time_skipping_env: WorkflowEnvironment, tmp_path: Path) -> None:
    store = Store(make_engine(f"sqlite:///{tmp_path / 'relay.db'}"))
    org, app, key = "acme", "shop", f"sweep/orphans.found/acme/shop/{uuid.uuid4()}"
    old = int((datetime.now(UTC) - timedelta(hours=2)).timestamp() * 1000)
    reply = {"output": [{"group": {"executor_id": "ghost", "application_version": "v1"}, "count": 2,
                         "min_created_at": old}]}
    orphans = OrphanActivities(store)
    env = ActivityEnvironment(client=time_skipping_env.client)
    ask = FindOrphansInput(org, app, datetime.now(UTC), reply, key, asked="e1")
    found = await env.run(orphans.find_orphans, ask)
    again = await env.run(orphans.find_orphans, ask)  # a retried activity: the row and the start land once
    assert [o.executor_id for o in found] == [o.executor_id for o in again] == ["ghost"]
    started = await _started(time_skipping_env, key)
    assert (started.operation, started.alert.kind) == ("orphans.found", "OrphansFound")
    assert "ghost" in started.alert.message
    # Its delivery ended (terminated here), the row's alert is still never started again: the id stays taken.
    event = OwnAlertEvent(org, app, "orphans.found", key, datetime.now(UTC))
    assert not await start_own_alert_delivery(time_skipping_env.client, event)
    store.engine.dispose()
