"""Fakes and a driver for ExecutorLifecycleWorkflow tests on the time-skipping server.

``FakeRelay`` holds fake activities under the real names, recording every call (input, attempt, task queue,
virtual scheduled time). ``Relay`` drives one executor's workflow the way the gateway does.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.common import TypedSearchAttributes
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.conftest import assert_eventually
from worker import workflow_runner
from workflows.contracts.alerts import OwnAlertEvent
from workflows.contracts.common import (
    Activity,
    Candidate,
    ConnectedSignal,
    DisconnectedSignal,
    ExecutorInfo,
    lifecycle_workflow_id,
)
from workflows.contracts.gate import AdmitRecoveryInput, AdmitRecoveryReply
from workflows.contracts.gateway_watch import (
    GatewayGoneInput,
    GatewayGoneReply,
    ProbeGatewayInput,
    ProbeGatewayReply,
)
from workflows.contracts.lifecycle import (
    DeclaredDead,
    DeclareDeadInput,
    DeleteExecutorInput,
    DispatchRecoveryInput,
    ExistPendingInput,
    ExistPendingReply,
    GetExecutorTimeoutInput,
    GraceStart,
    LifecycleInput,
    LifecycleResult,
    LifecycleState,
    RecordStatusInput,
    RecoveryReply,
    RemovedSignal,
    SelectCandidateInput,
    WriteAuditInput,
)
from workflows.contracts.orphans import OrphanInfo
from workflows.contracts.reconcile import GetRegistryRowInput, RegistryRow
from workflows.lifecycle import ExecutorLifecycleWorkflow

ORG, APP, VERSION = "acme", "shop", "v-42"
GRACE = timedelta(seconds=45)  # not the 60 s default, so a test notices a workflow that ignores the app's value
RECOVERY_TIMEOUT = timedelta(seconds=20)
PEERS = ("peer-a", "peer-b")
RESULT_WALL_TIMEOUT = timedelta(seconds=6)
STOP_WALL_TIMEOUT = timedelta(seconds=20)

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
    grace: timedelta | None = GRACE  # None: the app no longer exists
    # select_candidate: answers popped from here first, then the first peer not excluded.
    candidate_script: list[Candidate | None] = field(default_factory=list)
    peers_available: bool = True  # False: no peer is HEALTHY, select_candidate finds none
    # dispatch_recovery / exist_pending_workflows: per candidate, answers popped first, then success / none left.
    recovery_replies: dict[str, list[RecoveryReply | Exception]] = field(default_factory=dict)
    pending_replies: dict[str, list[ExistPendingReply]] = field(default_factory=dict)
    # When set, dispatch_recovery hangs (a peer that never answers) until this is set.
    dispatch_gate: asyncio.Event | None = None
    # dispatch_recovery writes the dispatched row it is given and asks the confirmation it is given right after a
    # successful recovery, as a gateway does; False: a gateway of older code, which ignores both (the workflow then
    # writes the row and asks with exist_pending_workflows).
    current_gateway: bool = True
    # When set, record_status for "executor.healthy" waits for it (a slow registry write)...
    healthy_gate: asyncio.Event | None = None
    # ... and this is set once that write has begun.
    healthy_writing: asyncio.Event = field(default_factory=asyncio.Event)
    # record_status / write_audit operations whose first attempt raises TransientError.
    fail_first_attempt: set[str] = field(default_factory=set)
    # The test server's clock. A local activity's scheduled time is the worker's wall clock, not the workflow's.
    clock: Callable[[], Awaitable[datetime]] | None = None
    # probe_gateway on the executor's own gateway queue: answers popped first, then "alive, not held, in contact
    # for a day" (a gateway that saw the socket close and never lost Temporal).
    probe_replies: list[ProbeGatewayReply] = field(default_factory=list)
    # record_status: how long after the activity was called its row says the write happened (a slow database).
    write_lag: timedelta = timedelta(0)
    # The gate ``declare_dead`` asks: this fake's ``admit_recovery`` unless a test puts the real one here.
    gate: Callable[[AdmitRecoveryInput], Awaitable[AdmitRecoveryReply]] | None = None
    # probe_gateway: whether it holds an answer asked for ``answer_at`` (today's gateway) or answers at once (older).
    held_answers: bool = True
    # probe_gateway with ``answer_at``: hold the answer until then, as a gateway does, in wall time (time does not
    # skip while an activity runs: up to ``FENCE_LEAD`` per death), so that the history has the commands a real
    # gateway's leaves (the recorder). Otherwise the answer comes at once, "held", and the workflow waits out the
    # rest of the grace on a timer of its own.
    hold_probes: bool = False
    # admit_recovery: holds popped from here first, each "wait this long from when you asked, because <reason>";
    # then "go" (no pause, no storm).
    gate_holds: list[tuple[str, timedelta]] = field(default_factory=list)
    # admit_recovery: the next admission trips the storm breaker, its row written under this event key.
    gate_trip: str = ""
    # gateway_gone: the gateway queues known gone (``core.gateways``); any other is live and probed.
    gone_queues: set[str] = field(default_factory=set)
    # When set, probe_gateway, select_candidate and admit_recovery (by activity name) each wait, once started, until
    # the event is set: the test lands a signal meanwhile. ``started`` is set when such a wait begins.
    holds: dict[str, asyncio.Event] = field(default_factory=dict)
    started: dict[str, asyncio.Event] = field(default_factory=dict)
    # get_registry_row: the row a workflow started by the reconciliation reads back (None: no row).
    registry_row: RegistryRow | None = None
    # dispatch_recovery on the executor's own gateway queue (a peer there, ``self_peer``): the executor's socket that
    # gateway finds (None: none). Asked to look (``DispatchRecoveryInput.look``), today's gateway answers with it;
    # an older one (``looking_gateway`` False), or one not asked, refuses with ``ExecutorAlive``. No request goes out.
    alive_here: ConnectedSignal | None = None
    looking_gateway: bool = True

    records: list[Call[RecordStatusInput]] = field(default_factory=list)
    timeouts: list[Call[GetExecutorTimeoutInput]] = field(default_factory=list)
    selects: list[Call[SelectCandidateInput]] = field(default_factory=list)
    audit_calls: list[Call[WriteAuditInput]] = field(default_factory=list)
    deletes: list[Call[DeleteExecutorInput]] = field(default_factory=list)
    dispatches: list[Call[DispatchRecoveryInput]] = field(default_factory=list)
    exist_calls: list[Call[ExistPendingInput]] = field(default_factory=list)
    probes: list[Call[ProbeGatewayInput]] = field(default_factory=list)
    admissions: list[Call[AdmitRecoveryInput]] = field(default_factory=list)
    gone_checks: list[Call[GatewayGoneInput]] = field(default_factory=list)
    declares: list[Call[DeclareDeadInput]] = field(default_factory=list)
    row_reads: list[Call[GetRegistryRowInput]] = field(default_factory=list)
    own_alerts: list[Call[OwnAlertEvent]] = field(default_factory=list)  # start_own_alert: deliveries started
    fail_own_alerts: bool = False  # start_own_alert fails, for good (Temporal refusing the start)

    @property
    def self_queue(self) -> str:
        """The gateway queue of the executor under test (``Relay.connected_signal``)."""
        return f"{self.task_queue}-gateway-self"

    @property
    def self_peer(self) -> Candidate:
        """A peer on the executor's own gateway (``self_queue``): not among ``peers``; a test scripts it."""
        return Candidate("peer-s", self.self_queue)

    @property
    def peers(self) -> list[Candidate]:
        return [Candidate(p, f"{self.task_queue}-gateway-{p}") for p in PEERS]

    def statuses(self) -> list[tuple[str, str]]:
        return [(c.input.status, c.input.operation) for c in self.records if not c.failed]

    def audits(self) -> list[str]:
        """The audit rows written, once per event key (as the store writes them)."""
        keys = {c.input.event_key: c.input.operation for c in self.audit_calls if not c.failed}
        return list(keys.values())

    def summary(self) -> dict[str, int]:
        """Call counts, for failure messages."""
        return {
            Activity.RECORD_STATUS: len(self.records), Activity.GET_EXECUTOR_TIMEOUT: len(self.timeouts),
            Activity.SELECT_CANDIDATE: len(self.selects), Activity.WRITE_AUDIT: len(self.audit_calls),
            Activity.DELETE_EXECUTOR: len(self.deletes), Activity.DISPATCH_RECOVERY: len(self.dispatches),
            Activity.EXIST_PENDING_WORKFLOWS: len(self.exist_calls), Activity.PROBE_GATEWAY: len(self.probes),
            Activity.ADMIT_RECOVERY: len(self.admissions), Activity.GATEWAY_GONE: len(self.gone_checks),
            Activity.GET_REGISTRY_ROW: len(self.row_reads), Activity.START_OWN_ALERT: len(self.own_alerts),
            Activity.DECLARE_DEAD: len(self.declares),
        }

    def db_activities(self) -> list[Callable[..., Any]]:
        return [self.record_status, self.begin_grace, self.declare_dead, self.get_executor_timeout,
                self.select_candidate, self.write_audit, self.delete_executor, self.admit_recovery, self.gateway_gone,
                self.get_registry_row, self.start_own_alert]

    def gateway_activities(self) -> list[Callable[..., Any]]:
        return [self.dispatch_recovery, self.exist_pending_workflows]

    def self_gateway_activities(self) -> list[Callable[..., Any]]:
        return [self.probe_gateway, self.dispatch_recovery, self.exist_pending_workflows]

    @activity.defn(name=Activity.PROBE_GATEWAY)
    async def probe_gateway(self, input: ProbeGatewayInput) -> ProbeGatewayReply:
        await self._call(self.probes, input)
        await self._hold(Activity.PROBE_GATEWAY)
        if self.hold_probes and input.answer_at is not None:
            await asyncio.sleep(max((input.answer_at - activity.info().started_time).total_seconds(), 0.0))
        reply = self.probe_replies.pop(0) if self.probe_replies else ProbeGatewayReply(contact_for=timedelta(days=1))
        # Today's gateway says it held the answer it was asked to hold (this one answers at once: as if the socket
        # stayed away until then); an older one (``held_answers`` False) never does.
        return dataclasses.replace(reply, held=self.held_answers and input.answer_at is not None)

    # -- database activities (shared queue) -------------------------------------------------------------------

    @activity.defn(name=Activity.RECORD_STATUS)
    async def record_status(self, input: RecordStatusInput) -> datetime | None:
        if self.healthy_gate is not None and input.operation == "executor.healthy":
            self.healthy_writing.set()
            await self.healthy_gate.wait()
        call = await self._call(self.records, input)
        self._fail_first(call, input.operation)
        return call.scheduled + self.write_lag  # the row's time: the test server's clock, as the worker's would be

    @activity.defn(name=Activity.BEGIN_GRACE)
    async def begin_grace(self, input: RecordStatusInput) -> GraceStart | None:
        """The app's grace read (counted in ``timeouts``) and DISCONNECTED recorded (in ``records``), in one call, as
        ``Store.begin_grace`` does; nothing recorded when the app is gone (``grace`` None)."""
        await self._call(self.timeouts, GetExecutorTimeoutInput(input.org, input.app))
        if self.grace is None:
            return None
        call = await self._call(self.records, dataclasses.replace(
            input, durations={**input.durations, "executorTimeoutSecs": self.grace}))
        self._fail_first(call, input.operation)
        return GraceStart(at=call.scheduled + self.write_lag, grace=self.grace)

    @activity.defn(name=Activity.DECLARE_DEAD)
    async def declare_dead(self, input: DeclareDeadInput) -> DeclaredDead:
        """DEAD recorded (in ``records``), the gate asked (``admissions``), a peer selected (``selects``) and the
        gateway looked up (``gone_checks``), each only if the one before lets recovery go on, as
        ``GateActivities.declare_dead`` does; ``declares`` counts the calls."""
        await self._call(self.declares, input)
        recorded_at = await self.record_status(input.record)
        declared = DeclaredDead(recorded_at, await (self.gate or self.admit_recovery)(input.admit))
        if declared.admission.go or declared.admission.until is None:
            declared.selected = True
            declared.candidate = await self.select_candidate(input.select)
            if declared.candidate is not None and input.gateway_queue:
                declared.gateway_gone = await self.gateway_gone(GatewayGoneInput(input.gateway_queue))
        return declared

    @activity.defn(name=Activity.GET_EXECUTOR_TIMEOUT)
    async def get_executor_timeout(self, input: GetExecutorTimeoutInput) -> timedelta | None:
        await self._call(self.timeouts, input)
        return self.grace

    @activity.defn(name=Activity.SELECT_CANDIDATE)
    async def select_candidate(self, input: SelectCandidateInput) -> Candidate | None:
        await self._call(self.selects, input)
        await self._hold(Activity.SELECT_CANDIDATE)
        if self.candidate_script:
            return self.candidate_script.pop(0)
        if not self.peers_available:
            return None
        return next((p for p in self.peers if p.executor_id not in input.exclude), None)

    @activity.defn(name=Activity.WRITE_AUDIT)
    async def write_audit(self, input: WriteAuditInput) -> None:
        self._fail_first(await self._call(self.audit_calls, input), input.operation)

    @activity.defn(name=Activity.DELETE_EXECUTOR)
    async def delete_executor(self, input: DeleteExecutorInput) -> None:
        if input.succeeded is not None:  # its audit row, in the same write
            self._fail_first(await self._call(self.audit_calls, input.succeeded), input.succeeded.operation)
        await self._call(self.deletes, input)

    @activity.defn(name=Activity.ADMIT_RECOVERY)
    async def admit_recovery(self, input: AdmitRecoveryInput) -> AdmitRecoveryReply:
        await self._call(self.admissions, input)
        await self._hold(Activity.ADMIT_RECOVERY)
        tripped, self.gate_trip = self.gate_trip, ""
        if tripped:
            return AdmitRecoveryReply(go=True, tripped=tripped, storm={"down": 3, "population": 4})
        if not self.gate_holds:
            return AdmitRecoveryReply(go=True)
        reason, wait = self.gate_holds.pop(0)
        return AdmitRecoveryReply(go=False, until=input.now + wait, reason=reason)

    @activity.defn(name=Activity.GATEWAY_GONE)
    async def gateway_gone(self, input: GatewayGoneInput) -> GatewayGoneReply:
        await self._call(self.gone_checks, input)
        gone = input.gateway_queue in self.gone_queues
        return GatewayGoneReply(gone=gone, reason="retired" if gone else "")

    @activity.defn(name=Activity.GET_REGISTRY_ROW)
    async def get_registry_row(self, input: GetRegistryRowInput) -> RegistryRow | None:
        await self._call(self.row_reads, input)
        return self.registry_row

    @activity.defn(name=Activity.START_OWN_ALERT)
    async def start_own_alert(self, input: OwnAlertEvent) -> bool:
        """Records the delivery started; True unless one was started for the same row already."""
        started = all(c.input.event_key != input.event_key for c in self.own_alerts)
        await self._call(self.own_alerts, input)
        if self.fail_own_alerts:
            raise ApplicationError("start_workflow refused", non_retryable=True)
        return started

    async def _hold(self, name: str) -> None:
        """Wait here while the test holds activity ``name`` (``holds``), saying so (``started``)."""
        event = self.holds.get(name)
        if event is None:
            return
        self.started.setdefault(name, asyncio.Event()).set()
        while not event.is_set():  # heartbeat-free: a local activity or one with a start-to-close timeout
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), 0.5)

    # -- socket-bound activities (each candidate's gateway queue) ---------------------------------------------

    @activity.defn(name=Activity.DISPATCH_RECOVERY)
    async def dispatch_recovery(self, input: DispatchRecoveryInput) -> RecoveryReply:
        await self._call(self.dispatches, input)
        if self.alive_here is not None and activity.info().task_queue == self.self_queue:
            if input.look and self.looking_gateway:
                return RecoveryReply(False, "connected to this gateway", alive=self.alive_here)
            raise ApplicationError("connected to this gateway: not recovering it", type="ExecutorAlive",
                                   non_retryable=True)
        audited = False
        if input.audit is not None and self.current_gateway:
            try:
                self._fail_first(await self._call(self.audit_calls, input.audit), input.audit.operation)
                audited = True
            except TransientError:
                pass  # the gateway's database away: the request still goes, the workflow writes the row
        if self.dispatch_gate is not None:
            while not self.dispatch_gate.is_set():  # a peer that never answers, on a gateway that is alive
                activity.heartbeat()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.dispatch_gate.wait(), 0.5)
        script = self.recovery_replies.get(input.executor_id)
        reply = script.pop(0) if script else RecoveryReply(success=True)
        if isinstance(reply, Exception):
            raise reply
        if reply.success and input.confirm is not None and self.current_gateway:
            return RecoveryReply(True, reply.error_message, confirmed=await self._exist_pending(input.confirm),
                                 audited=audited)
        return dataclasses.replace(reply, audited=audited)

    @activity.defn(name=Activity.EXIST_PENDING_WORKFLOWS)
    async def exist_pending_workflows(self, input: ExistPendingInput) -> ExistPendingReply:
        return await self._exist_pending(input)

    async def _exist_pending(self, input: ExistPendingInput) -> ExistPendingReply:
        await self._call(self.exist_calls, input)
        script = self.pending_replies.get(input.executor_id)
        return script.pop(0) if script else ExistPendingReply(exist=False)

    async def _call(self, calls: list[Call[T]], input: T) -> Call[T]:
        info = activity.info()
        scheduled = info.current_attempt_scheduled_time
        if info.is_local and self.clock is not None:
            scheduled = await self.clock()
        call = Call(input, info.attempt, info.task_queue, scheduled)
        calls.append(call)
        return call

    def _fail_first(self, call: Call[T], operation: str) -> None:
        if operation in self.fail_first_attempt and call.attempt == 1:
            call.failed = True
            raise TransientError(f"{operation}: database briefly unavailable")


def keyed(calls: Sequence[Call[RecordStatusInput] | Call[WriteAuditInput]]) -> list[tuple[str, str, int, bool]]:
    """(event_key, operation, attempt, failed) of each try."""
    return [(c.input.event_key, c.input.operation, c.attempt, c.failed) for c in calls]


@dataclass
class Relay:
    """One executor's lifecycle workflow, driven the way the gateway drives it."""

    env: WorkflowEnvironment
    fakes: FakeRelay
    executor_id: str = field(default_factory=lambda: f"exec-{uuid.uuid4()}")
    # The time-skipping client's start_workflow handle: unlike get_workflow_handle(), its result() skips time.
    # It follows continue-as-new, so the first one serves for the whole test.
    started: Handle | None = None

    @property
    def workflow_id(self) -> str:
        return lifecycle_workflow_id(ORG, APP, self.executor_id)

    @property
    def latest(self) -> Handle:
        """The current run, whichever it is: like the gateway, never pinned to a run that continued-as-new."""
        return self.env.client.get_workflow_handle_for(ExecutorLifecycleWorkflow.run, self.workflow_id)

    def connected_signal(self, connection_id: str, *, signal_id: str | None = None) -> ConnectedSignal:
        return ConnectedSignal(
            connection_id=connection_id,
            gateway_queue=self.fakes.self_queue,
            info=ExecutorInfo(self.executor_id, application_version=VERSION, hostname="host-1"),
            signal_id=signal_id or str(uuid.uuid4()),
            source_ip="10.0.0.7",
        )

    async def connect(self, connection_id: str, *, signal_id: str | None = None, task_queue: str | None = None
                      ) -> None:
        """Signal-with-start ``connected``, as ``Gateway.signal_connected`` does."""
        signal = self.connected_signal(connection_id, signal_id=signal_id)
        await self.signal_with_start("connected", signal, task_queue=task_queue)

    async def signal_with_start(self, name: str, signal: ConnectedSignal | DisconnectedSignal, *,
                                state: LifecycleState | None = None, task_queue: str | None = None) -> None:
        handle = await self.env.client.start_workflow(
            ExecutorLifecycleWorkflow.run,
            LifecycleInput(ORG, APP, self.executor_id, state=state, recovery_timeout=RECOVERY_TIMEOUT),
            id=self.workflow_id,
            task_queue=task_queue or self.fakes.task_queue,
            start_signal=name,
            start_signal_args=[signal],
        )
        self.started = self.started or handle

    async def start_orphan(self, info: OrphanInfo, *,
                           search_attributes: TypedSearchAttributes | None = None) -> None:
        """Start the workflow as the orphan sweep does (``activities.orphans``): no signal, ``orphan`` set."""
        handle = await self.env.client.start_workflow(
            ExecutorLifecycleWorkflow.run,
            LifecycleInput(ORG, APP, self.executor_id, recovery_timeout=RECOVERY_TIMEOUT, orphan=info),
            id=self.workflow_id,
            task_queue=self.fakes.task_queue,
            search_attributes=search_attributes or TypedSearchAttributes.empty,
        )
        self.started = self.started or handle

    async def start_reconciled(self) -> None:
        """Start the workflow as the reconciliation does (``activities.reconcile``): no signal, ``reconcile`` set."""
        handle = await self.env.client.start_workflow(
            ExecutorLifecycleWorkflow.run,
            LifecycleInput(ORG, APP, self.executor_id, recovery_timeout=RECOVERY_TIMEOUT, reconcile=True),
            id=self.workflow_id,
            task_queue=self.fakes.task_queue,
        )
        self.started = self.started or handle

    async def disconnect(self, connection_id: str, *, signal_id: str | None = None) -> None:
        signal = DisconnectedSignal(connection_id=connection_id, signal_id=signal_id or str(uuid.uuid4()))
        await self.latest.signal(ExecutorLifecycleWorkflow.disconnected, signal)

    async def remove(self, reason: str = "app deleted") -> None:
        signal = RemovedSignal(signal_id=str(uuid.uuid4()), reason=reason)
        await self.latest.signal(ExecutorLifecycleWorkflow.removed, signal)

    async def result(self) -> LifecycleResult:
        """The workflow's result, time skipping meanwhile. A workflow that never finishes (say, retrying recovery
        forever against an unanswered queue) spins through virtual time, so this is bounded on the wall clock."""
        assert self.started is not None, "nothing started"
        waiting = asyncio.ensure_future(self.started.result())
        done, _ = await asyncio.wait([waiting], timeout=RESULT_WALL_TIMEOUT.total_seconds())
        if not done:
            await self.stop(waiting)
            pytest.fail(f"no result within {RESULT_WALL_TIMEOUT} of wall time; calls: {self.fakes.summary()}")
        return waiting.result()

    async def stop(self, waiting: asyncio.Future[LifecycleResult] | None = None) -> None:
        """End the workflow if it is still running, without breaking time skipping for the tests after this one.

        Every test shares one server clock. Cancelling ``result()`` mid-call, or terminating a workflow while one
        of its tasks is in flight, leaves the test server's time-skipping lock held: later tests then wait on the
        wall clock. A cancel request ends the workflow through a normal workflow task instead.
        """
        if self.started is None:
            return
        try:
            await self.latest.cancel()
        except RPCError:
            return  # already closed
        waiting = waiting or asyncio.ensure_future(self.started.result())
        done, _ = await asyncio.wait([waiting], timeout=STOP_WALL_TIMEOUT.total_seconds())
        if done:
            with contextlib.suppress(WorkflowFailureError):
                waiting.result()
        else:
            waiting.cancel()
            await self.latest.terminate("test over: cancel not honoured")

    async def state(self) -> LifecycleState:
        return await self.latest.query(ExecutorLifecycleWorkflow.state)

    async def settle(self) -> None:
        """Wait until the workflow has completed a task after the last signal, so its state reflects it."""

        async def processed() -> None:
            kinds = [e.event_type async for e in self.latest.fetch_history_events()]
            signaled = [i for i, k in enumerate(kinds) if k == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED]
            assert signaled, kinds
            assert EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED in kinds[signaled[-1]:]

        await assert_eventually(processed)

    async def wait_statuses(self, *expected: tuple[str, str], timeout: timedelta = timedelta(seconds=10)) -> None:
        """Wait until exactly ``expected`` has been recorded (a stray extra record fails)."""

        def check() -> None:
            assert self.fakes.statuses() == list(expected)

        await assert_eventually(check, timeout=timeout)


HEALTHY = ("HEALTHY", "executor.healthy")
DISCONNECTED = ("DISCONNECTED", "executor.disconnected")
RECONNECTED = ("HEALTHY", "executor.reconnected")
SUPERSEDED = ("HEALTHY", "executor.superseded")
DEAD = ("DEAD", "executor.dead")


@contextlib.asynccontextmanager
async def served(env: WorkflowEnvironment, prefix: str) -> AsyncIterator[Relay]:
    """One executor's lifecycle workflow with FakeRelay's activities: its worker, each peer's gateway fakes on its
    own queue, and its own gateway's probe; the workflow is stopped at the end."""
    client = env.client
    fakes = FakeRelay(task_queue=f"{prefix}-{uuid.uuid4()}", clock=env.get_current_time)
    relay = Relay(env, fakes)
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(Worker(client, task_queue=fakes.task_queue,
                                               workflows=[ExecutorLifecycleWorkflow],
                                               activities=fakes.db_activities(),
                                               workflow_runner=workflow_runner(client.data_converter)))
        for peer in fakes.peers:
            await stack.enter_async_context(
                Worker(client, task_queue=peer.gateway_queue, activities=fakes.gateway_activities()))
        await stack.enter_async_context(
            Worker(client, task_queue=fakes.self_queue, activities=fakes.self_gateway_activities()))
        try:
            yield relay
        finally:
            await relay.stop()
