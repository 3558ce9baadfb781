"""ExecutorLifecycleWorkflow on the time-skipping test server, with fake activities under the real names.

The fakes record every call (input, attempt, task queue, virtual scheduled time). Database activities run on the
test's shared queue; ``dispatch_recovery`` and ``exist_pending_workflows`` run on each candidate's own gateway
queue, as they do in production, so a call landing on the wrong queue is never answered.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Generic, TypeVar

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.conftest import assert_eventually
from workflows.inputs import (
    Activity,
    Candidate,
    ConnectedSignal,
    DeleteExecutorInput,
    DisconnectedSignal,
    DispatchRecoveryInput,
    ExecutorInfo,
    ExistPendingInput,
    ExistPendingReply,
    GetExecutorTimeoutInput,
    LifecycleInput,
    LifecycleResult,
    LifecycleState,
    RecordStatusInput,
    RecoveryReply,
    SelectCandidateInput,
    WriteAuditInput,
    lifecycle_workflow_id,
)
from workflows.lifecycle import BACKOFF_INITIAL, ExecutorLifecycleWorkflow

ORG, APP, VERSION = "acme", "shop", "v-42"
GRACE = timedelta(seconds=45)  # not the 60 s default, so a test notices a workflow that ignores the app's value
RECOVERY_TIMEOUT = timedelta(seconds=20)
PEERS = ("peer-a", "peer-b")
RESULT_WALL_TIMEOUT = timedelta(seconds=15)

T = TypeVar("T")
Handle = WorkflowHandle[ExecutorLifecycleWorkflow, LifecycleResult]


class TransientError(Exception):
    """Raised by a fake on a first attempt; any non-ApplicationError exception is retried by Temporal."""


@dataclass
class Call(Generic[T]):
    input: T
    attempt: int
    task_queue: str
    scheduled: datetime  # the test server's virtual clock
    failed: bool = False


@dataclass
class FakeRelay:
    """Fake activities under the real names, recording what they were called with."""

    task_queue: str
    grace: timedelta = GRACE
    # select_candidate: answers popped from here first, then the first peer not excluded.
    candidate_script: list[Candidate | None] = field(default_factory=list)
    # dispatch_recovery / exist_pending_workflows: per candidate, answers popped first, then success / none left.
    recovery_replies: dict[str, list[RecoveryReply | Exception]] = field(default_factory=dict)
    pending_replies: dict[str, list[ExistPendingReply]] = field(default_factory=dict)
    # record_status / write_audit operations whose first attempt raises TransientError.
    fail_first_attempt: set[str] = field(default_factory=set)

    records: list[Call[RecordStatusInput]] = field(default_factory=list)
    timeouts: list[Call[GetExecutorTimeoutInput]] = field(default_factory=list)
    selects: list[Call[SelectCandidateInput]] = field(default_factory=list)
    audit_calls: list[Call[WriteAuditInput]] = field(default_factory=list)
    deletes: list[Call[DeleteExecutorInput]] = field(default_factory=list)
    dispatches: list[Call[DispatchRecoveryInput]] = field(default_factory=list)
    exist_calls: list[Call[ExistPendingInput]] = field(default_factory=list)

    @property
    def peers(self) -> list[Candidate]:
        return [Candidate(p, f"{self.task_queue}-gateway-{p}") for p in PEERS]

    def statuses(self) -> list[tuple[str, str]]:
        return [(c.input.status, c.input.operation) for c in self.records if not c.failed]

    def audits(self) -> list[str]:
        return [c.input.operation for c in self.audit_calls if not c.failed]

    # -- database activities (shared queue) -------------------------------------------------------------------

    @activity.defn(name=Activity.RECORD_STATUS)
    async def record_status(self, input: RecordStatusInput) -> None:
        self._fail_first(_record(self.records, input), input.operation)

    @activity.defn(name=Activity.GET_EXECUTOR_TIMEOUT)
    async def get_executor_timeout(self, input: GetExecutorTimeoutInput) -> timedelta:
        _record(self.timeouts, input)
        return self.grace

    @activity.defn(name=Activity.SELECT_CANDIDATE)
    async def select_candidate(self, input: SelectCandidateInput) -> Candidate | None:
        _record(self.selects, input)
        if self.candidate_script:
            return self.candidate_script.pop(0)
        return next((p for p in self.peers if p.executor_id not in input.exclude), None)

    @activity.defn(name=Activity.WRITE_AUDIT)
    async def write_audit(self, input: WriteAuditInput) -> None:
        self._fail_first(_record(self.audit_calls, input), input.operation)

    @activity.defn(name=Activity.DELETE_EXECUTOR)
    async def delete_executor(self, input: DeleteExecutorInput) -> None:
        _record(self.deletes, input)

    # -- socket-bound activities (each candidate's gateway queue) ---------------------------------------------

    @activity.defn(name=Activity.DISPATCH_RECOVERY)
    async def dispatch_recovery(self, input: DispatchRecoveryInput) -> RecoveryReply:
        _record(self.dispatches, input)
        script = self.recovery_replies.get(input.executor_id)
        reply = script.pop(0) if script else RecoveryReply(success=True)
        if isinstance(reply, Exception):
            raise reply
        return reply

    @activity.defn(name=Activity.EXIST_PENDING_WORKFLOWS)
    async def exist_pending_workflows(self, input: ExistPendingInput) -> ExistPendingReply:
        _record(self.exist_calls, input)
        script = self.pending_replies.get(input.executor_id)
        return script.pop(0) if script else ExistPendingReply(exist=False)

    def _fail_first(self, call: Call[T], operation: str) -> None:
        if operation in self.fail_first_attempt and call.attempt == 1:
            call.failed = True
            raise TransientError(f"{operation}: database briefly unavailable")


def _record(calls: list[Call[T]], input: T) -> Call[T]:
    info = activity.info()
    call = Call(input, info.attempt, info.task_queue, info.current_attempt_scheduled_time)
    calls.append(call)
    return call


@dataclass
class Relay:
    """One executor's lifecycle workflow, driven the way the gateway drives it."""

    env: WorkflowEnvironment
    fakes: FakeRelay
    executor_id: str = field(default_factory=lambda: f"exec-{uuid.uuid4()}")
    handle: Handle | None = None

    @property
    def workflow_id(self) -> str:
        return lifecycle_workflow_id(ORG, APP, self.executor_id)

    async def connect(self, connection_id: str, *, signal_id: str | None = None) -> Handle:
        """Signal-with-start ``connected``, as ``Gateway.signal_connected`` does."""
        signal = ConnectedSignal(
            connection_id=connection_id,
            gateway_queue=f"{self.fakes.task_queue}-gateway-self",
            info=ExecutorInfo(self.executor_id, application_version=VERSION, hostname="host-1"),
            signal_id=signal_id or str(uuid.uuid4()),
            source_ip="10.0.0.7",
        )
        self.handle = await self.env.client.start_workflow(
            ExecutorLifecycleWorkflow.run,
            LifecycleInput(ORG, APP, self.executor_id, recovery_timeout=RECOVERY_TIMEOUT),
            id=self.workflow_id,
            task_queue=self.fakes.task_queue,
            start_signal="connected",
            start_signal_args=[signal],
        )
        return self.handle

    async def disconnect(self, connection_id: str, *, signal_id: str | None = None) -> None:
        signal = DisconnectedSignal(connection_id=connection_id, signal_id=signal_id or str(uuid.uuid4()))
        await self.started.signal(ExecutorLifecycleWorkflow.disconnected, signal)

    @property
    def started(self) -> Handle:
        assert self.handle is not None, "connect() first"
        return self.handle

    async def result(self) -> LifecycleResult:
        """The workflow's result, time skipping meanwhile. A workflow that never finishes (say, retrying recovery
        forever against an unanswered queue) spins through virtual time, so bound it on the wall clock."""
        async with asyncio.timeout(RESULT_WALL_TIMEOUT.total_seconds()):
            return await self.started.result()

    async def state(self) -> LifecycleState:
        return await self.started.query(ExecutorLifecycleWorkflow.state)

    async def settle(self) -> None:
        """Wait until the workflow has completed a task after the last signal, so its state reflects it."""

        async def processed() -> None:
            kinds = [e.event_type async for e in self.started.fetch_history_events()]
            last_signal = max(i for i, k in enumerate(kinds) if k == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED)
            assert EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED in kinds[last_signal:]

        await assert_eventually(processed)

    async def wait_statuses(self, *expected: tuple[str, str]) -> None:
        """Wait until exactly ``expected`` has been recorded (a stray extra record fails)."""

        def check() -> None:
            assert self.fakes.statuses() == list(expected)

        await assert_eventually(check)


@pytest.fixture
async def relay(time_skipping_env: WorkflowEnvironment) -> AsyncIterator[Relay]:
    client = time_skipping_env.client
    fakes = FakeRelay(task_queue=f"relay-test-{uuid.uuid4()}")
    relay = Relay(time_skipping_env, fakes)
    db = [fakes.record_status, fakes.get_executor_timeout, fakes.select_candidate, fakes.write_audit,
          fakes.delete_executor]
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(
            Worker(client, task_queue=fakes.task_queue, workflows=[ExecutorLifecycleWorkflow], activities=db)
        )
        for peer in fakes.peers:
            await stack.enter_async_context(
                Worker(client, task_queue=peer.gateway_queue,
                       activities=[fakes.dispatch_recovery, fakes.exist_pending_workflows])
            )
        try:
            yield relay
        finally:
            # Every test shares one server clock: a workflow left running would fire its timers into a later
            # test's time skipping, with no worker left to serve them.
            if relay.handle is not None:
                try:
                    await relay.handle.terminate("test over")
                except RPCError:
                    pass  # already completed


HEALTHY = ("HEALTHY", "executor.healthy")
DISCONNECTED = ("DISCONNECTED", "executor.disconnected")
RECONNECTED = ("HEALTHY", "executor.reconnected")
SUPERSEDED = ("HEALTHY", "executor.superseded")
DEAD = ("DEAD", "executor.dead")


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
    assert disconnected.input.details["grace_seconds"] == GRACE.total_seconds()

    assert [c.input for c in fakes.selects] == [SelectCandidateInput(ORG, APP, VERSION, exclude=[relay.executor_id])]
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

    [delete] = fakes.deletes
    assert (delete.input.executor_id, delete.input.details) == (relay.executor_id, {"recovered_by": peer.executor_id})
    assert fakes.audits() == ["executor.recovery.dispatched", "executor.recovery.succeeded"]
    assert all(a.input.details["request_id"] == dispatch.input.request_id for a in fakes.audit_calls)


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
    failed = fakes.audit_calls[1].input
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
    assert fakes.audits() == ["executor.recovery.waiting", "executor.recovery.dispatched",
                              "executor.recovery.succeeded"]
    assert fakes.audit_calls[0].input.status == "failure"
    # Exponential backoff between looks: at least 1 s, 2 s, 4 s.
    times = [c.scheduled for c in fakes.selects]
    gaps = [later - earlier for earlier, later in zip(times, times[1:], strict=False)]
    assert all(gap >= BACKOFF_INITIAL * 2**n for n, gap in enumerate(gaps)), gaps
    assert len(fakes.dispatches) == 1 and len(fakes.deletes) == 1


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
    assert "executor.recovery.waiting" not in fakes.audits()


async def test_audit_and_status_rows_carry_one_event_key_per_event(relay: Relay) -> None:
    fakes = relay.fakes
    first = fakes.peers[0]
    fakes.recovery_replies[first.executor_id] = [RecoveryReply(success=False)]
    fakes.fail_first_attempt = {"executor.healthy", "executor.disconnected", "executor.dead",
                                "executor.recovery.dispatched", "executor.recovery.failed",
                                "executor.recovery.succeeded"}
    await relay.connect("c1")
    await relay.env.sleep(timedelta(seconds=5))  # skip the activity retry's backoff
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1")

    await relay.result()

    calls: list[Call[RecordStatusInput]] | list[Call[WriteAuditInput]]
    for calls in (fakes.records, fakes.audit_calls):
        first_tries = {c.input.event_key: c.input.operation for c in calls if c.attempt == 1}
        retries = {c.input.event_key: c.input.operation for c in calls if c.attempt > 1}
        assert retries == {k: op for k, op in first_tries.items() if op in fakes.fail_first_attempt}
        assert len([c for c in calls if c.failed]) == len(retries)
    events = [c.input.event_key for c in fakes.records if not c.failed] + [
        c.input.event_key for c in fakes.audit_calls if not c.failed] + [c.input.event_key for c in fakes.deletes]
    assert len(events) == 3 + 4 + 1
    assert len(set(events)) == len(events)  # two dispatched audits, yet two keys
    assert all(key.startswith(relay.workflow_id + "/") for key in events)


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


async def test_success_with_pending_workflows_left_is_a_failure(relay: Relay) -> None:
    fakes = relay.fakes
    first, second = fakes.peers
    fakes.pending_replies[first.executor_id] = [ExistPendingReply(exist=True)]
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1")

    result = await relay.result()

    assert result == LifecycleResult(status="RECOVERED", recovered_by=second.executor_id, attempts=2)
    assert [c.input.executor_id for c in fakes.dispatches] == [first.executor_id, second.executor_id]
    assert [c.input.executor_id for c in fakes.exist_calls] == [first.executor_id, second.executor_id]
    assert fakes.audits() == ["executor.recovery.dispatched", "executor.recovery.failed",
                              "executor.recovery.dispatched", "executor.recovery.succeeded"]
    assert "pending workflows remain" in fakes.audit_calls[1].input.details["reason"]
    [delete] = fakes.deletes
    assert delete.scheduled >= fakes.exist_calls[1].scheduled
