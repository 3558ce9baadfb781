"""The retention workflows' contract: the schedule's round (``RetentionWorkflow``: the apps' rounds and the audit
log's retention), one app's round (``AppRetentionWorkflow``), and their activities (stubs: the database ones are
implemented in ``activities.retention``, ``dispatch_retention`` in ``gateway.activities``)."""

# No ``from __future__ import annotations``: a contract's annotations are types, not names (the package's docstring).
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from temporalio import activity

from workflows.contracts.common import STUB, Activity, Candidate

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
    # Audit rows older than this are deleted by the round (RELAY_AUDIT_RETENTION_DAYS). A schedule written before
    # this field decodes with the setting's default, until the worker rewrites it.
    audit_retention: timedelta = timedelta(days=90)


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
    audit_rows_pruned: int = 0  # audit rows older than the audit retention, deleted by this round


@dataclass
class PruneAuditLogInput:
    """Delete the audit rows emitted before ``before`` (every org's), oldest first, ``batch_size`` rows per
    transaction, for at most ``budget``: what is left over is the next round's."""

    before: datetime
    batch_size: int = 1000
    budget: timedelta = timedelta(seconds=60)


@dataclass
class SelectRetentionExecutorInput:
    org: str
    app: str
    exclude: list[str] = field(default_factory=list)
    latest: str | None = None  # the latest application version as the SDK reports it: its executors first


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


# -- activities (stubs, called by reference; the implementations are registered under the same names) ----------


@activity.defn(name=Activity.LIST_RETENTION_TARGETS)
async def list_retention_targets(input: ListRetentionTargetsInput) -> list[RetentionTarget]:
    """The apps with a retention setting, each with the start of its last round."""
    raise NotImplementedError(STUB)


@activity.defn(name=Activity.SELECT_RETENTION_EXECUTOR)
async def select_retention_executor(input: SelectRetentionExecutorInput) -> Candidate | None:
    """A HEALTHY executor of the app, newest version first; None when there is none left."""
    raise NotImplementedError(STUB)


@activity.defn(name=Activity.WRITE_RETENTION_AUDIT)
async def write_retention_audit(input: WriteRetentionAuditInput) -> None:
    """One audit row of an app's round (and, with ``started_at``, that a round started), once per event key."""
    raise NotImplementedError(STUB)


@activity.defn(name=Activity.PRUNE_AUDIT_LOG)
async def prune_audit_log(input: PruneAuditLogInput) -> int:
    """Delete old audit rows in batches; how many were deleted."""
    raise NotImplementedError(STUB)


@activity.defn(name=Activity.DISPATCH_RETENTION)
async def dispatch_retention(input: DispatchRetentionInput) -> RetentionReply:
    """Send ``retention`` to the executor, on the task queue of the gateway holding its socket."""
    raise NotImplementedError(STUB)
