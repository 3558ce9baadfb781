"""The orphan sweep's contract: the schedule's round (``OrphanSweepWorkflow``), what an orphan is as the lifecycle
workflow receives it (``OrphanInfo``), and the sweep's activities (stubs; implemented in ``activities.orphans``).
The aggregates request to an executor reuses retention's executor choice (``select_retention_executor``) and the
gateways' ``executor_request``, as the alerts round does.

The decision (which executor ids are orphans) is ``core.orphans``; the workflow only carries its results."""

# No ``from __future__ import annotations``: a contract's annotations are types, not names (the package's docstring).
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from temporalio import activity

from core.types import Orphan as Orphan
from core.types import OrphanInfo as OrphanInfo
from workflows.contracts.common import STUB, Activity

# The Temporal Schedule that starts an OrphanSweepWorkflow every RELAY_ORPHAN_SWEEP_INTERVAL_SECS (its runs are
# named ``relay-orphans-<timestamp>`` by the schedule).
ORPHANS_SCHEDULE_ID = "relay-orphans"


@dataclass
class OrphanSweepInput:
    """The schedule's argument to every sweep; the worker rewrites it when the settings change."""

    min_age: timedelta = timedelta(seconds=3600)
    # How long an executor has to answer ``get_workflow_aggregates``.
    reply_timeout: timedelta = timedelta(seconds=30)
    # Passed on to each lifecycle workflow started (as the gateway starts them).
    recovery_timeout: timedelta = timedelta(seconds=60)
    probe_timeout: timedelta = timedelta(seconds=10)


@dataclass
class OrphanTarget:
    """An app with a HEALTHY executor, and the ``get_workflow_aggregates`` body to ask it at the sweep's clock."""

    org: str
    app: str
    query: dict[str, Any] = field(default_factory=dict)


@dataclass
class ListOrphanTargetsInput:
    now: datetime
    min_age: timedelta = timedelta(seconds=3600)


@dataclass
class FindOrphansInput:
    """Decide from an executor's aggregates reply which executor ids are orphans (``core.orphans``), reading the
    registry after the reply came; audit ``orphans.found`` once per ``event_key`` when there are any."""

    org: str
    app: str
    now: datetime
    reply: dict[str, Any]
    event_key: str
    min_age: timedelta = timedelta(seconds=3600)
    asked: str = ""  # the executor that answered, for the audit row


@dataclass
class StartOrphanRecoveryInput:
    org: str
    app: str
    executor_id: str
    info: OrphanInfo
    recovery_timeout: timedelta = timedelta(seconds=60)
    probe_timeout: timedelta = timedelta(seconds=10)


@dataclass
class OrphanSweepResult:
    started: list[str] = field(default_factory=list)  # "org/app/executor_id" of each lifecycle started
    running: list[str] = field(default_factory=list)  # its lifecycle workflow was already running: left alone
    unchecked: list[str] = field(default_factory=list)  # "org/app: why" for apps no executor answered for


# -- activities (stubs, called by reference; the implementations are registered under the same names) ----------


@activity.defn(name=Activity.LIST_ORPHAN_TARGETS)
async def list_orphan_targets(input: ListOrphanTargetsInput) -> list[OrphanTarget]:
    """Every registered app with a HEALTHY executor, each with the aggregates body to ask."""
    raise NotImplementedError(STUB)


@activity.defn(name=Activity.FIND_ORPHANS)
async def find_orphans(input: FindOrphansInput) -> list[Orphan]:
    """The orphans in the reply (``core.orphans.find_orphans``), audited as ``orphans.found``."""
    raise NotImplementedError(STUB)


@activity.defn(name=Activity.START_ORPHAN_RECOVERY)
async def start_orphan_recovery(input: StartOrphanRecoveryInput) -> bool:
    """Start the orphan's lifecycle workflow; False when one is already running under its id."""
    raise NotImplementedError(STUB)
