"""The typed values that cross between the gateway, workflows and activities.

Pure dataclasses, so the workflow sandbox can import them. New fields get defaults, so old histories still
decode. Activity and task queue names are defined here, once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

SHARED_TASK_QUEUE = "relay"
GATEWAY_TASK_QUEUE_PREFIX = "relay-gateway-"

# Search attributes Relay registers (docker-compose.temporal.yml and `relay dev` create the same list).
SEARCH_ATTRIBUTES: dict[str, str] = {
    "RelayOrg": "Keyword",
    "RelayApp": "Keyword",
    "RelayExecutorId": "Keyword",
    "RelayAppVersion": "Keyword",
    "RelayExecutorStatus": "Keyword",
}


class Activity:
    """Activity names. Database activities run on the shared queue; socket-bound ones on a gateway's queue."""

    RECORD_STATUS = "record_status"
    GET_EXECUTOR_TIMEOUT = "get_executor_timeout"
    SELECT_CANDIDATE = "select_candidate"
    WRITE_AUDIT = "write_audit"
    DELETE_EXECUTOR = "delete_executor"
    DISPATCH_RECOVERY = "dispatch_recovery"
    EXIST_PENDING_WORKFLOWS = "exist_pending_workflows"
    # Retention (issue 6): database activities on the shared queue, dispatch on the executor's gateway queue.
    LIST_RETENTION_TARGETS = "list_retention_targets"
    SELECT_RETENTION_EXECUTOR = "select_retention_executor"
    WRITE_RETENTION_AUDIT = "write_retention_audit"
    DISPATCH_RETENTION = "dispatch_retention"
    # Gateway watch: held on the gateway's own queue; the sweep runs on the shared queue once it is gone.
    HOLD_GATEWAY = "hold_gateway"
    DISCONNECT_GATEWAY_EXECUTORS = "disconnect_gateway_executors"
    # The fence: asked on a gateway's own queue before anything is declared gone. A gateway that does not pick it
    # up within its schedule-to-start timeout counts as gone; one that does says whether it holds the socket.
    PROBE_GATEWAY = "probe_gateway"


def gateway_workflow_id(gateway_queue: str) -> str:
    return f"relay-gateway/{gateway_queue}"


def lifecycle_workflow_id(org: str, app: str, executor_id: str) -> str:
    return f"relay-executor/{org}/{app}/{executor_id}"


@dataclass
class ExecutorInfo:
    """What an executor says of itself in its ``executor_info`` reply."""

    executor_id: str
    application_version: str = ""
    hostname: str | None = None
    language: str | None = None
    dbos_version: str | None = None
    executor_metadata: dict[str, Any] | None = None


@dataclass
class ConnectedSignal:
    connection_id: str
    gateway_queue: str
    info: ExecutorInfo
    # Idempotency key: the gateway retries signals, and Temporal does not deduplicate them.
    signal_id: str
    source_ip: str = ""


@dataclass
class DisconnectedSignal:
    connection_id: str
    signal_id: str
    reason: str = "closed"


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


@dataclass
class LifecycleState:
    """What continue-as-new carries from one run to the next."""

    status: str = "NEW"
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


@dataclass
class LifecycleResult:
    status: str
    recovered_by: str | None = None
    attempts: int = 0


@dataclass
class RecordStatusInput:
    """Write the executor's registry row and its audit row in one transaction, at most once per event_key."""

    org: str
    app: str
    executor_id: str
    status: str
    operation: str
    event_key: str
    info: ExecutorInfo | None = None
    connection_id: str | None = None
    gateway_queue: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


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


@dataclass
class Candidate:
    executor_id: str
    gateway_queue: str
    app_version: str = ""
    # True when the app allows cross-version recovery and no peer of the dead executor's version was HEALTHY.
    cross_version: bool = False


@dataclass
class WriteAuditInput:
    org: str
    app: str
    executor_id: str
    operation: str
    event_key: str
    status: str = "success"
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class DeleteExecutorInput:
    org: str
    app: str
    executor_id: str
    event_key: str
    details: dict[str, Any] = field(default_factory=dict)


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


@dataclass
class RecoveryReply:
    success: bool
    error_message: str | None = None


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


# -- retention (issue 6) ---------------------------------------------------------------------------------------

# The Temporal Schedule that runs a RetentionWorkflow every RELAY_RETENTION_INTERVAL_SECS. Its runs are named
# ``relay-retention-<timestamp>`` by the schedule; each app's round is the child ``relay-retention/{org}/{app}``.
RETENTION_SCHEDULE_ID = "relay-retention"


def app_retention_workflow_id(org: str, app: str) -> str:
    return f"{RETENTION_SCHEDULE_ID}/{org}/{app}"


@dataclass
class RetentionInput:
    """The schedule's argument to every round; the worker rewrites it when the settings change."""

    interval: timedelta = timedelta(seconds=300)
    gc_batch_size: int = 10_000
    # How long an executor has to answer ``retention`` (the recovery timeout setting).
    reply_timeout: timedelta = timedelta(seconds=60)


@dataclass
class ListRetentionTargetsInput:
    """Every org's apps with a retention setting (the schedule is global), or only ``org`` / ``app``."""

    org: str | None = None
    app: str | None = None


@dataclass
class RetentionTarget:
    """An app with at least one retention setting, and when its last round was started (None: never)."""

    org: str
    app: str
    gc_time_threshold: timedelta | None = None
    gc_rows_threshold: int | None = None
    global_timeout: timedelta | None = None
    last_started_at: datetime | None = None


@dataclass
class RetentionCutoffs:
    """What one ``retention`` message carries, as instants; the wire layer turns them into epoch milliseconds."""

    gc_cutoff: datetime | None
    gc_rows_threshold: int | None
    gc_batch_size: int | None
    timeout_cutoff: datetime | None


@dataclass
class AppRetentionInput:
    # As the round listed it; the app's round reads it again when it starts.
    target: RetentionTarget
    interval: timedelta = timedelta(seconds=300)
    gc_batch_size: int = 10_000
    reply_timeout: timedelta = timedelta(seconds=60)


@dataclass
class AppRetentionResult:
    """``SUCCEEDED`` (an executor started the round), ``SKIPPED`` (audited, with the reason) or ``NOTHING_SET``."""

    outcome: str
    executor_id: str | None = None
    attempts: int = 0
    reason: str | None = None


@dataclass
class RetentionRoundResult:
    started: list[str] = field(default_factory=list)  # "org/app" of each child started
    still_running: list[str] = field(default_factory=list)  # skipped: the previous round of that app runs on


@dataclass
class SelectRetentionExecutorInput:
    org: str
    app: str
    exclude: list[str] = field(default_factory=list)


@dataclass
class WriteRetentionAuditInput:
    """An audit row for one app's round, at most once per event_key.

    ``cutoffs`` are written as sent on the wire (epoch ms) next to the settings they came from and the round's
    clock, so an operator can check the units by eye. ``started_at`` set: also record that a round started then.
    """

    org: str
    app: str
    operation: str
    event_key: str
    clock: datetime
    status: str = "success"
    executor_id: str | None = None
    target: RetentionTarget | None = None
    cutoffs: RetentionCutoffs | None = None
    started_at: datetime | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class DispatchRetentionInput:
    """Send ``retention`` to ``executor_id`` (through the gateway holding its socket)."""

    executor_id: str
    request_id: str
    cutoffs: RetentionCutoffs
    timeout: timedelta = timedelta(seconds=60)
    org: str = ""
    app: str = ""


@dataclass
class RetentionReply:
    success: bool
    error_message: str | None = None


# -- gateway watch -------------------------------------------------------------------------------------------


@dataclass
class GatewayInput:
    """Watch one gateway process. A gateway that dies sends no ``disconnected``: this workflow notices for it."""

    gateway_queue: str
    heartbeat_timeout: timedelta = timedelta(seconds=10)
    # Each hold lasts this long, then the run continues as new (bounded history for a gateway up for months).
    hold_for: timedelta = timedelta(hours=6)


@dataclass
class HoldGatewayInput:
    heartbeat_interval: timedelta
    hold_for: timedelta


@dataclass
class ProbeGatewayInput:
    """Ask a gateway whether it is alive and, when ``executor_id`` is set, whether it holds that executor's socket."""

    org: str = ""
    app: str = ""
    executor_id: str = ""


@dataclass
class ProbeGatewayReply:
    """The gateway picked the probe up, so it is alive and in contact with Temporal.

    ``connection`` is the live socket it holds for the executor (as its ``connected`` signal said), or None.
    ``contact_for`` is how long the gateway has been in contact with Temporal without a break: an executor that
    left while its gateway could not reach Temporal is owed a full grace from the moment contact came back.
    """

    connection: ConnectedSignal | None = None
    contact_for: timedelta = timedelta(0)


@dataclass
class DisconnectGatewayInput:
    gateway_queue: str
    reason: str = "gateway gone"


@dataclass
class DisconnectGatewayResult:
    signalled: int
