"""ExecutorLifecycleWorkflow on the time-skipping test server, with fake activities under the real names.

Database activities run on the test's queue; ``dispatch_recovery`` and ``exist_pending_workflows`` run on each
candidate's own gateway queue, as they do in production, so a call landing on the wrong queue is never answered.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError, CancelledError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from tests.conftest import assert_eventually
from tests.lifecycle_fakes import (
    APP,
    DEAD,
    DISCONNECTED,
    GRACE,
    HEALTHY,
    ORG,
    RECONNECTED,
    RECOVERY_TIMEOUT,
    SUPERSEDED,
    VERSION,
    FakeRelay,
    Relay,
    keyed,
)
from worker import workflow_runner
from workflows import lifecycle_base
from workflows.contracts.common import Candidate, DisconnectedSignal, ExecutorStatus
from workflows.contracts.lifecycle import (
    ExistPendingReply,
    GetExecutorTimeoutInput,
    LifecycleResult,
    LifecycleState,
    PeerAvailableSignal,
    RecoveryReply,
    SelectCandidateInput,
)
from workflows.lifecycle import ExecutorLifecycleWorkflow
from workflows.recovery import BLOCKED_RECHECK
from workflows.timing import BACKOFF_INITIAL


@pytest.fixture
async def relay(time_skipping_env: WorkflowEnvironment, request: pytest.FixtureRequest) -> AsyncIterator[Relay]:
    """Workers for one test: the workflow and database fakes on a uuid queue, each peer's fakes on its own queue.

    Parametrize indirectly with ``False`` to run the workflow outside the sandbox (so a monkeypatched module
    constant reaches it).
    """
    sandboxed: bool = getattr(request, "param", True)
    client = time_skipping_env.client
    fakes = FakeRelay(task_queue=f"relay-test-{uuid.uuid4()}", clock=time_skipping_env.get_current_time)
    relay = Relay(time_skipping_env, fakes)
    runner = workflow_runner(client.data_converter) if sandboxed else UnsandboxedWorkflowRunner()
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(
            Worker(client, task_queue=fakes.task_queue, workflows=[ExecutorLifecycleWorkflow],
                   activities=fakes.db_activities(), workflow_runner=runner)
        )
        for peer in fakes.peers:
            await stack.enter_async_context(
                Worker(client, task_queue=peer.gateway_queue, activities=fakes.gateway_activities())
            )
        await stack.enter_async_context(
            Worker(client, task_queue=fakes.self_queue, activities=fakes.self_gateway_activities()))
        try:
            yield relay
        finally:
            await relay.stop()


async def test_reconnect_within_grace_does_not_recover(relay: Relay) -> None:
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1")
    await relay.wait_statuses(HEALTHY, DISCONNECTED)

    await relay.connect("c2")  # time is not skipping: this lands well inside the 45 s grace
    await relay.wait_statuses(HEALTHY, DISCONNECTED, RECONNECTED)
    await relay.env.sleep(GRACE * 2)  # a grace timer still armed would fire here

    state = await relay.state()
    assert (state.status, state.recorded_connection_id) == ("HEALTHY", "c2")
    # A later disconnect is handled normally, which proves the workflow did not go on to die in the meantime.
    await relay.disconnect("c2")
    await relay.wait_statuses(HEALTHY, DISCONNECTED, RECONNECTED, DISCONNECTED)
    assert relay.fakes.selects == [] and relay.fakes.dispatches == [] and relay.fakes.deletes == []
    assert [c.input for c in relay.fakes.timeouts] == [GetExecutorTimeoutInput(ORG, APP)] * 2
    reconnected = relay.fakes.records[2].input
    assert (reconnected.connection_id, reconnected.details["previous_status"]) == ("c2", "DISCONNECTED")


async def test_grace_expiry_dies_dispatches_confirms_and_deletes(relay: Relay) -> None:
    fakes = relay.fakes
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1")

    result = await relay.result()  # time skips through the grace

    peer = fakes.peers[0]
    assert result == LifecycleResult(status="RECOVERED", recovered_by=peer.executor_id, attempts=1)
    assert fakes.statuses() == [HEALTHY, DISCONNECTED, DEAD]
    disconnected, dead = fakes.records[1], fakes.records[2]
    assert dead.scheduled - disconnected.scheduled >= GRACE
    assert disconnected.input.durations == {"executorTimeoutSecs": GRACE}

    assert [c.input for c in fakes.selects] == [
        SelectCandidateInput(ORG, APP, VERSION, exclude=[relay.executor_id], dead_executor_id=relay.executor_id,
                             prefer_gateway=fakes.self_queue)]
    [dispatch] = fakes.dispatches
    assert dispatch.task_queue == peer.gateway_queue
    assert dispatch.input.executor_id == peer.executor_id
    assert dispatch.input.dead_executor_ids == [relay.executor_id]
    assert dispatch.input.timeout == RECOVERY_TIMEOUT
    uuid.UUID(dispatch.input.request_id)
    [confirm] = fakes.exist_calls
    assert confirm.task_queue == peer.gateway_queue
    assert (confirm.input.executor_id, confirm.input.dead_executor_id, confirm.input.app_version) == (
        peer.executor_id, relay.executor_id, VERSION)
    assert confirm.input.request_id != dispatch.input.request_id
    # The confirmation went along with the request, for the gateway to ask right after: no activity of its own.
    assert dispatch.input.confirm == confirm.input

    [delete] = fakes.deletes
    assert (delete.input.executor_id, delete.input.details) == (relay.executor_id, {"recovered_by": peer.executor_id})
    assert fakes.audits() == ["executor.recovery.dispatched", "executor.recovery.succeeded"]
    assert all(a.input.details["request_id"] == dispatch.input.request_id for a in fakes.audit_calls)
    # The dispatched row went with the request, for the gateway to write; the success row is written by the
    # deletion, in its transaction: no local activity of their own.
    assert dispatch.input.audit == fakes.audit_calls[0].input
    assert delete.input.succeeded == fakes.audit_calls[1].input
    history = await relay.latest.fetch_history()
    assert [e.activity_task_scheduled_event_attributes.activity_type.name for e in history.events
            if e.HasField("activity_task_scheduled_event_attributes")] == ["probe_gateway", "probe_gateway",
                                                                            "dispatch_recovery"]


async def test_stale_disconnected_is_ignored(relay: Relay) -> None:
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    await relay.connect("c2")  # the executor reconnected (maybe through another gateway) before c1 was noticed
    await relay.wait_statuses(HEALTHY, SUPERSEDED)

    await relay.disconnect("c1")
    await relay.settle()

    state = await relay.state()
    assert state.status == "HEALTHY"
    assert state.connection is not None and state.connection.connection_id == "c2"
    await relay.env.sleep(GRACE * 2)
    assert relay.fakes.statuses() == [HEALTHY, SUPERSEDED]
    assert relay.fakes.timeouts == []
    # The current connection's disconnect still counts.
    await relay.disconnect("c2")
    await relay.wait_statuses(HEALTHY, SUPERSEDED, DISCONNECTED)
    assert relay.fakes.records[2].input.details["connection_id"] == "c2"


@pytest.mark.parametrize(
    "failure",
    [RecoveryReply(success=False, error_message="cannot recover"), ApplicationError("socket closed")],
    ids=["success-false", "raises"],
)
async def test_failing_candidate_then_next_one(relay: Relay, failure: RecoveryReply | Exception) -> None:
    fakes = relay.fakes
    first, second = fakes.peers
    fakes.recovery_replies[first.executor_id] = [failure]
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1")

    result = await relay.result()

    assert result == LifecycleResult(status="RECOVERED", recovered_by=second.executor_id, attempts=2)
    assert [c.input.exclude for c in fakes.selects] == [[relay.executor_id], [relay.executor_id, first.executor_id]]
    assert [(c.input.executor_id, c.task_queue) for c in fakes.dispatches] == [
        (first.executor_id, first.gateway_queue), (second.executor_id, second.gateway_queue)]
    assert [c.input.executor_id for c in fakes.exist_calls] == [second.executor_id]
    assert fakes.dispatches[0].input.request_id != fakes.dispatches[1].input.request_id
    assert fakes.audits() == ["executor.recovery.dispatched", "executor.recovery.failed",
                              "executor.recovery.dispatched", "executor.recovery.succeeded"]
    failed = next(c.input for c in fakes.audit_calls if c.input.operation == "executor.recovery.failed")
    assert (failed.status, failed.details["candidate"]) == ("failure", first.executor_id)
    # The retry waits out a backoff first.
    assert fakes.dispatches[1].scheduled - fakes.dispatches[0].scheduled >= BACKOFF_INITIAL
    assert len(fakes.deletes) == 1


async def test_no_candidate_waits_then_recovers(relay: Relay) -> None:
    fakes = relay.fakes
    fakes.candidate_script = [None, None, None]
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1")

    result = await relay.result()

    assert result == LifecycleResult(status="RECOVERED", recovered_by=fakes.peers[0].executor_id, attempts=1)
    assert len(fakes.selects) == 4
    assert fakes.audits() == ["executor.recovery.blocked", "executor.recovery.unblocked",
                              "executor.recovery.dispatched", "executor.recovery.succeeded"]
    assert fakes.audit_calls[0].input.status == "failure"
    # While blocked it looks again at least a backoff later (the periodic re-check; no peer signalled).
    times = [c.scheduled for c in fakes.selects]
    gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
    assert all(gap >= BACKOFF_INITIAL * 2**n for n, gap in enumerate(gaps)), gaps
    assert len(fakes.dispatches) == 1 and len(fakes.deletes) == 1


async def test_a_blocked_recovery_starts_its_alerts_as_they_happen(relay: Relay) -> None:
    """RecoveryBlocked's delivery is started right after its audit row, with that row's key (the alert's id comes
    from it); once a peer is there and the recovery goes ahead, ``executor.recovery.unblocked`` and its delivery
    (RecoveryUnblocked) come before the request. The periodic re-checks while blocked alert nothing more."""
    fakes = relay.fakes
    fakes.peers_available = False
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1")
    await relay.env.sleep(GRACE + timedelta(seconds=5))

    def blocked_alert_started() -> None:
        assert [c.input.operation for c in fakes.own_alerts] == ["executor.recovery.blocked"]

    await assert_eventually(blocked_alert_started)
    [row] = [c.input for c in fakes.audit_calls if c.input.operation == "executor.recovery.blocked"]
    [started] = fakes.own_alerts
    assert (started.input.event_key, started.input.executor_id) == (row.event_key, relay.executor_id)
    assert (started.input.org, started.input.app, started.input.details) == (ORG, APP, row.details)
    assert started.scheduled - (await relay.env.get_current_time()) < timedelta(seconds=5)  # no round to wait for
    await relay.env.sleep(BLOCKED_RECHECK * 2 + timedelta(seconds=5))  # re-checks find no peer: no new alert
    assert len(fakes.selects) >= 3 and len(fakes.own_alerts) == 1

    fakes.peers_available = True
    await relay.latest.signal(ExecutorLifecycleWorkflow.peer_available, PeerAvailableSignal("peer-a", VERSION))
    assert (await relay.result()).status == "RECOVERED"
    assert fakes.audits() == ["executor.recovery.blocked", "executor.recovery.unblocked",
                              "executor.recovery.dispatched", "executor.recovery.succeeded"]
    [unblocked] = [c.input for c in fakes.audit_calls if c.input.operation == "executor.recovery.unblocked"]
    assert unblocked.details["candidate"] == fakes.peers[0].executor_id
    assert unblocked.durations["blockedSecs"] >= BLOCKED_RECHECK * 2
    assert [(c.input.operation, c.input.event_key) for c in fakes.own_alerts] == [
        ("executor.recovery.blocked", row.event_key), ("executor.recovery.unblocked", unblocked.event_key)]
    assert fakes.own_alerts[1].scheduled <= fakes.dispatches[0].scheduled


async def test_the_admission_that_trips_the_breaker_starts_its_alert(relay: Relay) -> None:
    """The gate writes the trip's row in its transaction and says so; the workflow whose admission it was starts
    the RecoveryBreaker alert, with that row's key, before its recovery goes on."""
    fakes = relay.fakes
    fakes.gate_trip = "recovery-breaker/acme/shop/1"
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1")
    assert (await relay.result()).status == "RECOVERED"
    [started] = [c.input for c in fakes.own_alerts]
    assert (started.operation, started.event_key, started.executor_id) == (
        "app.recovery.breaker_tripped", "recovery-breaker/acme/shop/1", relay.executor_id)
    assert started.details == {"down": 3, "population": 4}
    assert fakes.own_alerts[0].scheduled <= fakes.dispatches[0].scheduled


async def test_an_alert_that_cannot_be_started_holds_no_recovery(relay: Relay) -> None:
    """``start_own_alert`` failing for good (Temporal refusing the start): the recovery goes on regardless."""
    fakes = relay.fakes
    fakes.candidate_script = [None]
    fakes.fail_own_alerts = True
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1")
    assert (await relay.result()).status == "RECOVERED"
    assert [c.input.operation for c in fakes.own_alerts] == ["executor.recovery.blocked",
                                                             "executor.recovery.unblocked"]
    assert fakes.audits()[:2] == ["executor.recovery.blocked", "executor.recovery.unblocked"]


async def test_only_peer_fails_then_is_retried_after_backoff(relay: Relay) -> None:
    fakes = relay.fakes
    only = fakes.peers[0]
    fakes.recovery_replies[only.executor_id] = [RecoveryReply(success=False, error_message="busy")]
    # The only peer of the version is excluded after failing, so the next look finds no one.
    fakes.candidate_script = [only, None, only]
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1")

    result = await relay.result()

    assert result == LifecycleResult(status="RECOVERED", recovered_by=only.executor_id, attempts=2)
    assert [c.input.exclude for c in fakes.selects] == [
        [relay.executor_id], [relay.executor_id, only.executor_id], [relay.executor_id]]
    # Every peer having failed once is not "no candidate": nothing to alert about.
    assert "executor.recovery.blocked" not in fakes.audits()


@pytest.mark.parametrize("relay", [False], indirect=True, ids=["unsandboxed"])
async def test_audit_and_status_rows_carry_one_event_key_per_event(relay: Relay, monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:
    # A local activity's retry waits in the worker, in wall time: 1 s each, shortened (it reaches the workflow:
    # this test runs it unsandboxed).
    monkeypatch.setattr(lifecycle_base, "DB_RETRY", RetryPolicy(initial_interval=timedelta(milliseconds=20)))
    fakes = relay.fakes
    first = fakes.peers[0]
    fakes.recovery_replies[first.executor_id] = [RecoveryReply(success=False)]  # two dispatched audits
    fakes.fail_first_attempt = {"executor.healthy", "executor.dead", "executor.recovery.dispatched",
                                "executor.recovery.failed"}
    await relay.connect("c1")
    await relay.env.sleep(timedelta(seconds=5))  # past the activity retry's backoff
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1")

    await relay.result()

    # A retried activity carries the key of its first try, so the store can write the row at most once.
    for tries, retried in [
        (keyed(fakes.records), ["executor.dead", "executor.healthy"]),
        (keyed(fakes.audit_calls), ["executor.recovery.dispatched", "executor.recovery.dispatched",
                                     "executor.recovery.failed"]),
    ]:
        failed = {key: op for key, op, _, fails in tries if fails}
        retries = {key: op for key, op, attempt, _ in tries if attempt > 1}
        assert sorted(failed.values()) == retried
        assert retries == failed
        assert all(attempt == 1 for key, _, attempt, _ in tries if key not in failed)
    # Each event has its own key: a key seen on two successful writes would drop the second row.
    written = [key for key, _, _, failed in keyed(fakes.records) + keyed(fakes.audit_calls) if not failed]
    written += [c.input.event_key for c in fakes.deletes]
    assert len(written) == 3 + 4 + 1
    assert len(set(written)) == len(written)
    assert all(key.startswith(relay.workflow_id + "/") for key in written)


async def test_duplicate_signal_ids_are_ignored(relay: Relay) -> None:
    await relay.connect("c1", signal_id="connect-1")
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1", signal_id="disconnect-1")
    await relay.wait_statuses(HEALTHY, DISCONNECTED)

    # The gateway retried both signals (an ack lost in transit): neither may act a second time.
    await relay.connect("c1", signal_id="connect-1")
    await relay.disconnect("c1", signal_id="disconnect-1")
    await relay.settle()

    state = await relay.state()
    assert (state.status, state.connection) == ("DISCONNECTED", None)
    assert state.seen_signal_ids.count("connect-1") == 1 and state.seen_signal_ids.count("disconnect-1") == 1
    result = await relay.result()  # the replayed connect must not count as a reconnect
    assert result.status == "RECOVERED"
    assert relay.fakes.statuses() == [HEALTHY, DISCONNECTED, DEAD]


@pytest.mark.parametrize("current_gateway", [True, False], ids=["current-gateway", "older-gateway"])
async def test_success_with_pending_workflows_left_is_a_failure(relay: Relay, current_gateway: bool) -> None:
    """The confirmation finds workflows left: the attempt failed, another peer is tried. A gateway of older code
    ignores the confirmation and the dispatched row sent along and answers the recovery alone: the workflow then
    writes the row (under the key it sent) and asks ``exist_pending_workflows`` itself, on the peer's queue."""
    fakes = relay.fakes
    fakes.current_gateway = current_gateway
    first, second = fakes.peers
    fakes.pending_replies[first.executor_id] = [ExistPendingReply(exist=True)]
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1")

    result = await relay.result()

    assert result == LifecycleResult(status="RECOVERED", recovered_by=second.executor_id, attempts=2)
    assert [c.input.executor_id for c in fakes.dispatches] == [first.executor_id, second.executor_id]
    assert [(c.input.executor_id, c.task_queue) for c in fakes.exist_calls] == [
        (first.executor_id, first.gateway_queue), (second.executor_id, second.gateway_queue)]
    assert fakes.audits() == ["executor.recovery.dispatched", "executor.recovery.failed",
                              "executor.recovery.dispatched", "executor.recovery.succeeded"]
    failed = next(c.input for c in fakes.audit_calls if c.input.operation == "executor.recovery.failed")
    assert "pending workflows remain" in failed.details["reason"]
    [delete] = fakes.deletes
    assert delete.scheduled >= fakes.exist_calls[1].scheduled
    sent = [c.input.audit for c in fakes.dispatches]
    assert [c.input for c in fakes.audit_calls if c.input.operation == "executor.recovery.dispatched"] == sent
    history = await relay.latest.fetch_history()
    scheduled = [e.activity_task_scheduled_event_attributes.activity_type.name for e in history.events
                 if e.HasField("activity_task_scheduled_event_attributes")]
    assert scheduled.count("exist_pending_workflows") == (0 if current_gateway else 2)


# -- continue-as-new and the edges of a run ---------------------------------------------------------------------


async def test_disconnected_in_the_first_task_of_a_continued_run_applies_to_the_carried_state(relay: Relay) -> None:
    c1 = relay.connected_signal("c1")
    carried = LifecycleState(status=ExecutorStatus.HEALTHY, connection=c1, recorded_connection_id="c1",
                             app_version=VERSION, seen_signal_ids=[c1.signal_id])
    # A signal sent while the previous run continues-as-new is delivered with the next run's first task, and
    # handlers run before run() does: starting a run with carried state and a start signal is that moment.
    await relay.signal_with_start("disconnected", DisconnectedSignal("c1", signal_id="d1"), state=carried)

    await relay.wait_statuses(DISCONNECTED)
    state = await relay.state()
    assert state.connection is None
    assert state.seen_signal_ids == [c1.signal_id, "d1"]


async def test_retried_signal_in_the_first_task_of_a_continued_run_is_deduplicated(relay: Relay) -> None:
    c1, c2 = relay.connected_signal("c1"), relay.connected_signal("c2")
    carried = LifecycleState(status=ExecutorStatus.HEALTHY, connection=c2, recorded_connection_id="c2",
                             app_version=VERSION, seen_signal_ids=[c1.signal_id, c2.signal_id])
    # The gateway's late retry of the first run's c1 connect, landing in the continued run's first task.
    await relay.signal_with_start("connected", c1, state=carried)
    await relay.settle()

    state = await relay.state()
    assert state.connection is not None and state.connection.connection_id == "c2"
    assert state.seen_signal_ids == [c1.signal_id, c2.signal_id]
    await relay.disconnect("c2")  # barrier: a superseded record for c1 would come before this
    await relay.wait_statuses(DISCONNECTED)


@pytest.mark.parametrize("relay", [False], indirect=True, ids=["unsandboxed"])
async def test_continue_as_new_after_the_signal_budget_keeps_state_and_dedup_keys(
    relay: Relay, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lifecycle_base, "SIGNAL_BUDGET", 3)  # reaches the workflow: this test runs it unsandboxed
    await relay.connect("c1", signal_id="s1")
    await relay.wait_statuses(HEALTHY)
    first_run = (await relay.latest.describe()).run_id
    await relay.disconnect("c1", signal_id="d1")
    await relay.wait_statuses(HEALTHY, DISCONNECTED)
    await relay.connect("c2", signal_id="s2")  # third signal: continue-as-new once this is recorded
    await relay.wait_statuses(HEALTHY, DISCONNECTED, RECONNECTED)

    async def continued() -> None:
        assert (await relay.latest.describe()).run_id != first_run

    await assert_eventually(continued)
    state = await relay.state()
    assert (state.status, state.recorded_connection_id, state.app_version) == ("HEALTHY", "c2", VERSION)
    assert state.seen_signal_ids == ["s1", "d1", "s2"]

    await relay.connect("c1", signal_id="s1")  # a late retry of the first run's connect
    await relay.settle()
    state = await relay.state()
    assert state.connection is not None and state.connection.connection_id == "c2"
    await relay.disconnect("c2")
    await relay.wait_statuses(HEALTHY, DISCONNECTED, RECONNECTED, DISCONNECTED)


async def test_back_before_any_recovery_request_calls_recovery_off(relay: Relay) -> None:
    """DEAD and waiting for a peer, the executor comes back: no request has gone out, so nothing is recovered (a
    recovery now would make a second process run its workflows); it is HEALTHY again, in the same run."""
    fakes = relay.fakes
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    fakes.peers_available = False
    await relay.disconnect("c1")
    await relay.env.sleep(GRACE + timedelta(seconds=5))

    def blocked() -> None:
        assert fakes.statuses() == [HEALTHY, DISCONNECTED, DEAD]
        assert fakes.selects and "executor.recovery.blocked" in fakes.audits()

    await assert_eventually(blocked)
    first_run = (await relay.latest.describe()).run_id
    await relay.connect("c2")
    fakes.peers_available = True

    await relay.wait_statuses(HEALTHY, DISCONNECTED, DEAD, RECONNECTED)
    assert not fakes.dispatches and not fakes.deletes
    # Called off, and the blocked stretch's end said (RecoveryUnblocked): its alert had gone out.
    assert fakes.audits()[-2:] == ["executor.recovery.cancelled", "executor.recovery.unblocked"], fakes.audits()
    assert [c.input.operation for c in fakes.own_alerts] == ["executor.recovery.blocked",
                                                             "executor.recovery.unblocked"]
    assert "called off" in fakes.own_alerts[1].input.details["reason"]
    description = await relay.latest.describe()
    assert description.run_id == first_run and description.status == WorkflowExecutionStatus.RUNNING
    state = await relay.state()
    assert (state.status, state.recorded_connection_id, state.revived) == ("HEALTHY", "c2", False)


async def test_reconnect_during_a_recovery_request_registers_afresh_after_it(relay: Relay) -> None:
    """Back while the request is out: that cannot be taken back, so recovery completes, then it is registered."""
    fakes = relay.fakes
    fakes.dispatch_gate = asyncio.Event()
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1")
    # Just past the grace: time stops skipping once the dispatch hangs, so the rest of a sleep is wall time.
    await relay.env.sleep(GRACE + timedelta(milliseconds=200))
    await assert_eventually(lambda: _assert(len(fakes.dispatches) == 1))
    first_run = (await relay.latest.describe()).run_id
    await relay.connect("c2")
    await relay.settle()
    fakes.dispatch_gate.set()

    await relay.wait_statuses(HEALTHY, DISCONNECTED, DEAD, HEALTHY)
    [delete] = fakes.deletes
    fresh = fakes.records[3]
    assert fresh.input.connection_id == "c2" and fresh.scheduled >= delete.scheduled
    description = await relay.latest.describe()
    assert description.run_id != first_run and description.status == WorkflowExecutionStatus.RUNNING
    state = await relay.state()
    assert (state.status, state.recorded_connection_id) == ("HEALTHY", "c2")


async def test_cancel_during_a_dispatch_ends_the_workflow(relay: Relay) -> None:
    fakes = relay.fakes
    fakes.dispatch_gate = asyncio.Event()
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1")
    # Just past the grace: time stops skipping once the dispatch hangs, so the rest of a sleep is wall time.
    await relay.env.sleep(GRACE + timedelta(milliseconds=200))

    def dispatching() -> None:
        assert len(fakes.dispatches) == 1

    await assert_eventually(dispatching)

    # Cancellation (say, the app was deleted) reaches the workflow as a cancelled activity: not a failed attempt.
    await relay.latest.cancel()
    with pytest.raises(WorkflowFailureError) as failure:
        await relay.result()
    assert isinstance(failure.value.cause, CancelledError)
    assert len(fakes.dispatches) == 1 and fakes.deletes == []
    assert "executor.recovery.failed" not in fakes.audits()
    # Let the hung activity finish: while the server counts it as running, time cannot skip for later tests.
    fakes.dispatch_gate.set()


async def test_connect_and_disconnect_before_the_first_task_are_still_recorded(relay: Relay) -> None:
    # No worker polls this queue until both signals are in: the first task carries connected and disconnected.
    parked = f"{relay.fakes.task_queue}-parked"
    await relay.connect("c1", task_queue=parked)
    await relay.disconnect("c1")
    async with Worker(relay.env.client, task_queue=parked, workflows=[ExecutorLifecycleWorkflow],
                      activities=relay.fakes.db_activities()):
        try:
            await relay.settle()
            # The executor connected and went away: that must be on record, and its grace must start.
            await relay.wait_statuses(HEALTHY, DISCONNECTED, timeout=timedelta(seconds=1))
        finally:
            await relay.stop()  # while this queue still has a worker to run the cancellation


async def test_removed_while_healthy_ends_without_recovery(relay: Relay) -> None:
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    await relay.remove()
    result = await relay.result()
    assert result.status == "REMOVED"
    [delete] = relay.fakes.deletes
    assert delete.input.details["reason"] == "app deleted"
    assert not relay.fakes.selects and not relay.fakes.dispatches


async def test_removed_during_the_grace_ends_without_recovery(relay: Relay) -> None:
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1")
    await relay.wait_statuses(HEALTHY, DISCONNECTED)
    await relay.remove()
    assert (await relay.result()).status == "REMOVED"
    assert relay.fakes.statuses() == [HEALTHY, DISCONNECTED]  # never DEAD
    assert len(relay.fakes.deletes) == 1 and not relay.fakes.selects


async def test_removed_mid_recovery_abandons_the_dispatch(relay: Relay) -> None:
    fakes = relay.fakes
    fakes.dispatch_gate = asyncio.Event()  # the peer never answers
    # A short grace on the wall clock: once a test has left an activity hanging, time no longer skips.
    fakes.grace = timedelta(milliseconds=300)
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1")

    def dispatched() -> None:
        assert fakes.dispatches

    await assert_eventually(dispatched)
    await relay.remove()
    assert (await relay.result()).status == "REMOVED"
    assert "executor.recovery.succeeded" not in fakes.audits()
    assert [d.input.details["reason"] for d in fakes.deletes] == ["app deleted"]
    fakes.dispatch_gate.set()


async def test_app_gone_when_the_grace_starts_ends_the_workflow(relay: Relay) -> None:
    relay.fakes.grace = None
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1")
    assert (await relay.result()).status == "REMOVED"
    assert relay.fakes.statuses() == [HEALTHY]
    [delete] = relay.fakes.deletes
    assert delete.input.details["reason"] == "app no longer exists"


async def test_a_peer_becoming_healthy_wakes_a_blocked_recovery(relay: Relay) -> None:
    fakes = relay.fakes
    fakes.candidate_script = [None]  # the first look finds no peer of the version; the next finds one
    fakes.grace = timedelta(milliseconds=300)  # on the wall clock, whether or not time skips here
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1")

    def blocked() -> None:
        assert fakes.audits() == ["executor.recovery.blocked"]

    await assert_eventually(blocked)
    await relay.latest.signal(ExecutorLifecycleWorkflow.peer_available, PeerAvailableSignal("peer-x", VERSION))
    assert (await relay.result()).status == "RECOVERED"
    first, second = (c.scheduled for c in fakes.selects[:2])
    assert second - first < BLOCKED_RECHECK  # woken by the signal, not by the periodic re-check


async def test_disconnect_while_the_healthy_record_is_written_starts_one_grace(relay: Relay) -> None:
    fakes = relay.fakes
    fakes.healthy_gate = asyncio.Event()
    await relay.connect("c1")

    def recording() -> None:
        assert fakes.timeouts == [] and len(fakes.records) == 0

    await assert_eventually(recording)
    await asyncio.wait_for(fakes.healthy_writing.wait(), 10)  # the healthy write is in flight (held by the gate)
    # Landed on the server when the call returns; the write is a local activity, so its workflow task is busy and
    # the signal reaches the workflow once the write ends.
    await relay.disconnect("c1")
    fakes.healthy_gate.set()
    # One grace, no phantom "reconnected" of the connection that was being recorded.
    await relay.wait_statuses(HEALTHY, DISCONNECTED)
    await relay.settle()
    await asyncio.sleep(0.3)
    assert fakes.statuses() == [HEALTHY, DISCONNECTED] and len(fakes.timeouts) == 1
    await relay.stop()


async def test_cross_version_candidate_is_used_and_the_audit_says_so(relay: Relay) -> None:
    fakes = relay.fakes
    peer = fakes.peers[0]
    fakes.candidate_script = [Candidate(peer.executor_id, peer.gateway_queue, app_version="v-99", cross_version=True)]
    fakes.grace = timedelta(milliseconds=300)  # on the wall clock, whether or not time skips here
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1")
    assert (await relay.result()).status == "RECOVERED"
    [dispatched] = [c.input for c in fakes.audit_calls if c.input.operation == "executor.recovery.dispatched"]
    assert dispatched.details["cross_version"] is True and dispatched.details["candidate_version"] == "v-99"
    assert "own version" in str(dispatched.details["note"])
    # Confirmation still asks about the dead executor's own version: that is what its pending workflows carry.
    [confirm] = fakes.exist_calls
    assert confirm.input.app_version == VERSION


def _assert(condition: bool) -> None:
    assert condition
