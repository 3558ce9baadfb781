"""The types the kernel and the workflows' contracts share: an executor's status and what it says of itself, the
search attributes Relay registers, the alerting rules' state and alerts, orphans. Plain dataclasses and enums, no
I/O: ``core`` imports nothing above it, and the contracts (``workflows.contracts``) import these from here, so a
workflow's payloads, the registry's rows and the REST API's bodies all read the same definitions."""

# No ``from __future__ import annotations``: these are payloads of the workflows, whose annotations must be
# types, not names (``workflows.contracts``' docstring).
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

# Search attributes Relay registers (docker-compose.temporal.yml and `relay dev` create the same list), by name: the
# one place the names are written (workflows.contracts.common makes its typed keys from these).
RELAY_ORG_ATTRIBUTE = "RelayOrg"
RELAY_APP_ATTRIBUTE = "RelayApp"
RELAY_EXECUTOR_ID_ATTRIBUTE = "RelayExecutorId"
RELAY_APP_VERSION_ATTRIBUTE = "RelayAppVersion"
RELAY_EXECUTOR_STATUS_ATTRIBUTE = "RelayExecutorStatus"
SEARCH_ATTRIBUTES: dict[str, str] = {
    RELAY_ORG_ATTRIBUTE: "Keyword",
    RELAY_APP_ATTRIBUTE: "Keyword",
    RELAY_EXECUTOR_ID_ATTRIBUTE: "Keyword",
    RELAY_APP_VERSION_ATTRIBUTE: "Keyword",
    RELAY_EXECUTOR_STATUS_ATTRIBUTE: "Keyword",
}


# A StrEnum: workflow payloads, registry rows, search attributes and REST bodies all carry the plain strings.
# Its docstring is the schema's description in the REST API's OpenAPI document.
class ExecutorStatus(StrEnum):
    """HEALTHY: connected to a gateway. DISCONNECTED: its connection was lost; it may reconnect within the app's
    executorTimeoutSecs. DEAD: it did not; a peer is recovering its pending workflows, then its record is deleted."""

    HEALTHY = "HEALTHY"
    DISCONNECTED = "DISCONNECTED"
    DEAD = "DEAD"


@dataclass
class ExecutorInfo:
    """What an executor says of itself in its ``executor_info`` reply."""

    executor_id: str
    application_version: str = ""
    hostname: str | None = None
    language: str | None = None
    dbos_version: str | None = None
    executor_metadata: dict[str, Any] | None = None


class RuleType(StrEnum):
    WORKFLOW_FAILURE = "WorkflowFailure"
    SLOW_QUEUE = "SlowQueue"
    UNRESPONSIVE_APPLICATION = "UnresponsiveApplication"


@dataclass
class RuleState:
    """A rule as one round read it from the store, and (``query``) the ``get_workflow_aggregates`` body that
    observes it at the round's clock, None when the registry is enough (UnresponsiveApplication)."""

    rule_id: str
    org: str
    app: str
    receiving_app: str
    rule_type: RuleType
    metadata: Any
    created_at: datetime
    min_interval: timedelta | None = None
    last_fired_at: datetime | None = None
    checked_until: datetime | None = None  # the end of the last window observed (WorkflowFailure)
    condition_since: datetime | None = None  # UnresponsiveApplication: when the app was first seen without one
    suppressed: int = 0  # firings held back by min_interval since the rule last fired
    healthy_executors: int = 0  # the app's HEALTHY executors in the registry, when read
    unhealthy_since: datetime | None = None  # the latest change of a non-HEALTHY executor of the app (a hint)
    query: dict[str, Any] | None = None


@dataclass
class OwnEvents:
    """Audit rows of one of Relay's own alert operations about one app, written since the last evaluation;
    ``kind`` is the alert's (``RecoveryBlocked``, ...) and ``message`` its text."""

    org: str
    app: str
    operation: str
    count: int
    executor_ids: list[str] = field(default_factory=list)
    latest_details: dict[str, Any] = field(default_factory=dict)
    kind: str = ""
    message: str = ""


@dataclass
class OwnAlertEvent:
    """One audit row of Relay's own alert operations (``core.alerts.OWN_OPERATIONS``), as the code that wrote it
    hands it to ``start_own_alert`` (or the round, for a row whose delivery was not started). ``event_key`` is the
    row's: the alert's id derives from it (``core.own_alerts``), so every start for one row is one workflow."""

    org: str
    app: str
    operation: str
    event_key: str
    time: datetime
    executor_id: str | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Alert:
    """One alert to deliver. ``alert_id`` is the same on every retry, so a receiver can drop repeats."""

    alert_id: str
    org: str
    app: str
    receiving_app: str
    kind: str
    message: str
    time: datetime
    rule_id: str | None = None


@dataclass
class OrphanInfo:
    """An executor id with PENDING workflows older than the sweep's minimum age and no registry row: what its
    lifecycle workflow is started with (``LifecycleInput.orphan``). ``app_version`` is the version of its oldest
    PENDING workflows (the SDK recovers only its own version's workflows); ``pending`` counts that version's."""

    app_version: str
    pending: int = 0
    oldest_created_at: datetime | None = None
    # Other versions' PENDING workflows of the same executor id: left for a later sweep (one version per run).
    other_versions: list[str] = field(default_factory=list)


@dataclass
class Orphan:
    executor_id: str
    info: OrphanInfo
