"""The executor lifecycle workflow's contract: its input, state and result, the signals only it receives, and
its activities (stubs: the database ones are implemented in ``activities.registry``, the socket-bound ones in
``gateway.activities``)."""

# No ``from __future__ import annotations``: a contract's annotations are types, not names (the package's docstring).
import contextlib
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, TypeAlias

from temporalio import activity
from temporalio.client import Client
from temporalio.service import RPCError

from workflows.contracts.common import (
    STUB,
    Activity,
    Candidate,
    ConnectedSignal,
    ExecutorInfo,
    ExecutorStatus,
    lifecycle_workflow_id,
)
from workflows.contracts.gate import AdmitRecoveryInput, AdmitRecoveryReply
from workflows.contracts.gateway_watch import GatewayGoneReply
from workflows.contracts.orphans import OrphanInfo


class Signal:
    """The lifecycle workflow's signals, each named once: its handlers are registered under these names, and every
    sender (``start_signal`` of a signal-with-start included) names them so, never by a string of its own."""

    CONNECTED = "connected"
    DISCONNECTED = "disconnected"
    PEER_AVAILABLE = "peer_available"
    REMOVED = "removed"

# The workflow's status before it has recorded the executor once: never written to the registry, never shown by
# the REST API, so it is not an ``ExecutorStatus``. Carried state of that age says "NEW", so it stays a string.
NEW: Literal["NEW"] = "NEW"
LifecycleStatus: TypeAlias = ExecutorStatus | Literal["NEW"]


@dataclass
class RemovedSignal:
    """The executor's app was deleted (or the executor removed by an operator): end without recovery."""

    signal_id: str
    reason: str = "app deleted"


@dataclass
class PeerAvailableSignal:
    """An executor of the app became HEALTHY: a recovery waiting for a peer may look again now."""

    executor_id: str
    app_version: str = ""


async def wake_recoveries(client: Client, org: str, app: str, dead: list[str], signal: PeerAvailableSignal) -> None:
    """Tell DEAD executors' workflows that a peer may be available, so one waiting for a peer looks now rather than
    at its next check; best effort (a workflow that ended meanwhile has nothing waiting)."""
    for executor_id in dead:
        handle = client.get_workflow_handle(lifecycle_workflow_id(org, app, executor_id))
        with contextlib.suppress(RPCError):
            await handle.signal(Signal.PEER_AVAILABLE, signal)


@dataclass
class LifecycleState:
    """What continue-as-new carries from one run to the next."""

    status: LifecycleStatus = NEW
    connection: ConnectedSignal | None = None
    recorded_connection_id: str | None = None
    app_version: str = ""
    # A connection that came and went before the run loop recorded it (both signals in one workflow task):
    # still recorded, HEALTHY then DISCONNECTED, so no connection goes unaccounted for.
    unrecorded: ConnectedSignal | None = None
    # While DISCONNECTED: when the grace ends. Carried across continue-as-new, so the grace neither restarts nor
    # stretches when a flapping executor's history is continued mid-grace.
    grace_deadline: datetime | None = None
    seen_signal_ids: list[str] = field(default_factory=list)
    # The task queue of the gateway that last held the executor: the fence asks it before DEAD and before
    # each recovery request. Empty in state carried from before the fence (nothing to ask: not fenced).
    gateway_queue: str = ""
    # The grace of the current DISCONNECTED stretch, as read when it started: an extended grace (the gateway
    # regained contact with Temporal late in it) counts this long from the moment contact came back.
    grace: timedelta | None = None
    # DEAD, but recovery was called off before a request went out: the executor holds a live socket after all.
    # The run records it HEALTHY next instead of recovering it.
    revived: bool = False
    # The current death's key at the recovery gate (``admit_recovery``): carried across continue-as-new, so a run
    # that continues mid-recovery keeps its place; a new death gets a new key.
    gate_ticket: str = ""
    # Started by the orphan sweep and not seen alive since: its audit rows say ``"orphan": true``.
    orphan: bool = False
    # When the gateway saw the current connection close (``DisconnectedSignal.at``): for the signal-delay metric.
    disconnected_at: datetime | None = None
    # The signal id of the ``disconnected`` that ended the current connection, until its DISCONNECTED row is
    # written: that row's event key (``disconnect_event_key``), the same one the gateway that saw the socket close
    # writes it under, so the row lands once, whichever writes it first. Empty in older state, and for a
    # DISCONNECTED no signal brought (the reconciliation's): a key of the workflow's own then.
    disconnect_signal_id: str = ""
    # When the current recovery was first found blocked (no HEALTHY peer of its version)
    # and its RecoveryBlocked alert started; carried across continue-as-new, so the RecoveryUnblocked that ends it
    # goes out from whichever run the recovery goes ahead in, and a continued run does not alert again.
    blocked_since: datetime | None = None


@dataclass
class LifecycleInput:
    org: str
    app: str
    executor_id: str
    state: LifecycleState | None = None
    # How long a peer may take to answer ``recovery`` or ``exist_pending_workflows``.
    recovery_timeout: timedelta = timedelta(seconds=60)
    # How long a gateway has to pick up the fence's probe before it counts as gone (RELAY_GATEWAY_HEARTBEAT_...).
    probe_timeout: timedelta = timedelta(seconds=10)
    # Set by the orphan sweep (``workflows.orphans``) for an executor id with old PENDING workflows and no registry
    # row: the run begins by waiting one grace for it to connect, then declares it DEAD and recovers it.
    orphan: OrphanInfo | None = None
    # Set by the reconciliation (``workflows.reconcile``) for an executor with a registry row and no lifecycle
    # workflow running (Temporal's state lost, or the workflow terminated by hand): the run begins by reading the
    # row back and carrying on from it.
    reconcile: bool = False


@dataclass
class LifecycleResult:
    status: str
    recovered_by: str | None = None
    attempts: int = 0


# What ``record_status`` answers: when its audit row says the event happened (a retry finds the first try's). None in
# histories recorded before it answered, so a name of its own that the workflow code can annotate with.
RecordedAt = datetime | None


@dataclass
class RecordStatusInput:
    """Write the executor's registry row and its audit row in one transaction, at most once per event_key."""

    org: str
    app: str
    executor_id: str
    status: ExecutorStatus
    operation: str
    event_key: str
    info: ExecutorInfo | None = None
    connection_id: str | None = None
    gateway_queue: str | None = None
    details: dict[str, Any] = field(default_factory=dict)
    # Durations for the audit row, by their REST names (``executorTimeoutSecs``): the activity writes each in the
    # unit its name states, so no workflow converts a duration to a number.
    durations: dict[str, timedelta] = field(default_factory=dict)
    # For metrics only (``core.metrics``), None in inputs from before they were sent: a HEALTHY write's handshake
    # time on the gateway (``ConnectedSignal.at``), a DISCONNECTED write's socket close there
    # (``DisconnectedSignal.at``), and a DEAD write's end of the grace.
    connected_at: datetime | None = None
    grace_deadline: datetime | None = None
    disconnected_at: datetime | None = None


def disconnect_event_key(org: str, app: str, executor_id: str, signal_id: str) -> str:
    """The event key of the DISCONNECTED row a ``disconnected`` signal brings: written by the gateway that saw the
    socket close (``Store.record_disconnect``) or by the lifecycle workflow (``begin_grace``), whichever is first;
    the other finds it landed."""
    return f"{lifecycle_workflow_id(org, app, executor_id)}/executor.disconnected/{signal_id}"


@dataclass
class GraceStart:
    """``begin_grace``'s answer: when the DISCONNECTED row says the executor went away, and the grace it audited
    (the app's ``executorTimeoutSecs`` as it was then)."""

    at: datetime
    grace: timedelta


@dataclass
class GetExecutorTimeoutInput:
    org: str
    app: str


@dataclass
class SelectCandidateInput:
    org: str
    app: str
    app_version: str
    exclude: list[str] = field(default_factory=list)
    # The executor being recovered: the chosen peer is recorded as carrying its recovery (load spreading).
    dead_executor_id: str = ""
    # Among the idle peers, one on this gateway queue first: the dead executor's last gateway, which then looks for
    # its socket itself as it sends the request (``DispatchRecoveryInput.look``). "" for no preference.
    prefer_gateway: str = ""


@dataclass
class DeclareDeadInput:
    """``declare_dead``: DEAD recorded (``record``), then a recovery's first steps asked in the same local activity
    (``DEAD_IN_ONE_STEP_PATCH``): the gate (``admit``); if it admits, a peer claimed (``select``); and if one is,
    whether the dead executor's last gateway (``gateway_queue``, "" for none) is known gone, which the fence's last
    look before the request needs. Each step is the activity of its name, at most once per key as it is."""

    record: RecordStatusInput
    admit: AdmitRecoveryInput
    select: SelectCandidateInput
    gateway_queue: str = ""


@dataclass
class DeclaredDead:
    """``declare_dead``'s answer: when the DEAD row says it happened, the gate's answer, the peer claimed (None: none
    of the version, or not asked since the gate did not admit: ``selected`` says which) and the gateway's
    (None: not asked)."""

    recorded_at: RecordedAt
    admission: AdmitRecoveryReply
    selected: bool = False
    candidate: Candidate | None = None
    gateway_gone: GatewayGoneReply | None = None


@dataclass
class WriteAuditInput:
    org: str
    app: str
    executor_id: str
    operation: str
    event_key: str
    status: str = "success"
    details: dict[str, Any] = field(default_factory=dict)
    durations: dict[str, timedelta] = field(default_factory=dict)  # as in ``RecordStatusInput``


@dataclass
class DeleteExecutorInput:
    org: str
    app: str
    executor_id: str
    event_key: str
    details: dict[str, Any] = field(default_factory=dict)
    # A confirmed recovery's ``executor.recovery.succeeded`` row, written in the same transaction, before the
    # deletion (from lifecycle generation 5; before it, a ``write_audit`` of its own).
    succeeded: WriteAuditInput | None = None


@dataclass
class ExistPendingInput:
    """Ask ``executor_id`` whether ``dead_executor_id`` still has PENDING workflows of ``app_version``."""

    executor_id: str
    dead_executor_id: str
    app_version: str
    request_id: str
    timeout: timedelta = timedelta(seconds=60)
    org: str = ""
    app: str = ""


@dataclass
class ExistPendingReply:
    exist: bool
    error_message: str | None = None


@dataclass
class DispatchRecoveryInput:
    """Send ``recovery`` to ``executor_id`` (the candidate) for ``dead_executor_ids``."""

    executor_id: str
    dead_executor_ids: list[str]
    request_id: str
    timeout: timedelta = timedelta(seconds=60)
    # The candidate's org and app: the hub holds sockets per (org, app, executor id).
    org: str = ""
    app: str = ""
    # The confirmation, asked by the gateway right after a successful ``recovery`` reply, in this activity (from
    # lifecycle generation 5; before it, an ``exist_pending_workflows`` activity of its own, a workflow task later).
    confirm: ExistPendingInput | None = None
    # The ``executor.recovery.dispatched`` row, for the gateway to write as it sends the request (from lifecycle
    # generation 5; before it, a local activity of the workflow's own while the request was out).
    audit: WriteAuditInput | None = None
    # This gateway is the dead executors' last one, and the fence's last look is its own (lifecycle generation 6):
    # a socket of theirs here is answered with its connection (``RecoveryReply.alive``), no request sent. Without it
    # (and from older code) such a socket is refused with an ``ExecutorAlive`` error.
    look: bool = False


@dataclass
class RecoveryReply:
    success: bool
    error_message: str | None = None
    # The confirmation's answer, when the input asked for it and the recovery succeeded; None from a gateway that
    # does not ask (older code): the workflow then asks with ``exist_pending_workflows``.
    confirmed: ExistPendingReply | None = None
    # The gateway wrote (or found written) ``audit``; False from one that did not (older code, or its database away):
    # the workflow writes it, under the same key.
    audited: bool = False
    # Asked to look (``DispatchRecoveryInput.look``): the dead executor holds this live socket on the gateway, so no
    # request was sent and the recovery is called off.
    alive: ConnectedSignal | None = None


# -- activities: the workflow calls these stubs by reference; the worker and the gateways register the
# implementations under the same names (a unit test keeps names and signatures equal) --------------------------

@activity.defn(name=Activity.RECORD_STATUS)
async def record_status(input: RecordStatusInput) -> RecordedAt:
    """Write the registry row and its audit row, at most once per event key; when the audit row says it happened
    (None from a history recorded before the activity said so)."""
    raise NotImplementedError(STUB)


@activity.defn(name=Activity.BEGIN_GRACE)
async def begin_grace(input: RecordStatusInput) -> GraceStart | None:
    """Record DISCONNECTED (at most once per event key: the gateway may have written it already) with the app's
    grace, read in the same transaction; when that row says it happened, and the grace. None when the app no longer
    exists."""
    raise NotImplementedError(STUB)


@activity.defn(name=Activity.DECLARE_DEAD)
async def declare_dead(input: DeclareDeadInput) -> DeclaredDead:
    """Record DEAD, then ask the gate, claim a peer and look up the gateway, each only if the one before lets the
    recovery go on (``DeclareDeadInput``)."""
    raise NotImplementedError(STUB)


@activity.defn(name=Activity.GET_EXECUTOR_TIMEOUT)
async def get_executor_timeout(input: GetExecutorTimeoutInput) -> timedelta | None:
    """The app's grace; None when the app no longer exists."""
    raise NotImplementedError(STUB)


@activity.defn(name=Activity.SELECT_CANDIDATE)
async def select_candidate(input: SelectCandidateInput) -> Candidate | None:
    """Claim a HEALTHY peer to recover the dead executor; None when there is none."""
    raise NotImplementedError(STUB)


@activity.defn(name=Activity.WRITE_AUDIT)
async def write_audit(input: WriteAuditInput) -> None:
    """One audit row, at most once per event key."""
    raise NotImplementedError(STUB)


@activity.defn(name=Activity.DELETE_EXECUTOR)
async def delete_executor(input: DeleteExecutorInput) -> None:
    """Delete the registry row (and its recovery claim), audited, at most once per event key."""
    raise NotImplementedError(STUB)


@activity.defn(name=Activity.DISPATCH_RECOVERY)
async def dispatch_recovery(input: DispatchRecoveryInput) -> RecoveryReply:
    """Send ``recovery`` to the candidate, on the task queue of the gateway holding its socket."""
    raise NotImplementedError(STUB)


@activity.defn(name=Activity.EXIST_PENDING_WORKFLOWS)
async def exist_pending_workflows(input: ExistPendingInput) -> ExistPendingReply:
    """Ask the candidate whether the dead executor's workflows remain PENDING, on its gateway's task queue."""
    raise NotImplementedError(STUB)
