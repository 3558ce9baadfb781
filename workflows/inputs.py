"""The typed values that cross between the gateway, workflows and activities.

Pure dataclasses, so the workflow sandbox can import them. New fields get defaults, so old histories still
decode. Activity and task queue names are defined here, once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
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
class LifecycleState:
    """What continue-as-new carries from one run to the next."""

    status: str = "NEW"
    connection: ConnectedSignal | None = None
    recorded_connection_id: str | None = None
    app_version: str = ""
    seen_signal_ids: list[str] = field(default_factory=list)


@dataclass
class LifecycleInput:
    org: str
    app: str
    executor_id: str
    state: LifecycleState | None = None
    # How long a peer may take to answer ``recovery`` or ``exist_pending_workflows``.
    recovery_timeout: timedelta = timedelta(seconds=60)


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


@dataclass
class Candidate:
    executor_id: str
    gateway_queue: str


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


@dataclass
class ExistPendingReply:
    exist: bool
    error_message: str | None = None
