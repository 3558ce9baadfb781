"""The reconciliation's contract: the schedule's round (``ReconcileWorkflow``), the registry row a lifecycle workflow
started by it reads back (``RegistryRow``), and the activities (stubs; implemented in ``activities.reconcile`` and
``activities.registry``).

A registry row must always have its lifecycle workflow: the row says what Relay knows of an executor, the workflow
is what acts on it (the grace timer, the recovery). When Temporal's state is lost (a fresh cluster, a restore from
an older backup) or a workflow is terminated by hand, rows are left without one, and nothing would ever happen to
them. The round finds those rows and starts each one's lifecycle workflow again, from the row
(``LifecycleInput.reconcile``)."""

# No ``from __future__ import annotations``: a contract's annotations are types, not names (the package's docstring).
from dataclasses import dataclass, field
from datetime import timedelta

from temporalio import activity

from workflows.contracts.common import STUB, Activity, ExecutorStatus

# The Temporal Schedule that starts a ReconcileWorkflow every RELAY_RECONCILE_INTERVAL_SECS (its runs are named
# ``relay-reconcile-<timestamp>``); the worker also triggers one at start-up.
RECONCILE_SCHEDULE_ID = "relay-reconcile"


@dataclass
class ReconcileInput:
    """The schedule's argument to every round; the worker rewrites it when the settings change."""

    # Passed on to each lifecycle workflow started (as the gateway starts them).
    recovery_timeout: timedelta = timedelta(seconds=60)
    probe_timeout: timedelta = timedelta(seconds=10)


@dataclass
class ReconcileResult:
    rows: int = 0  # registry rows looked at
    running: int = 0  # rows whose lifecycle workflow runs (as visibility or a refused start said)
    # "org/app/executor_id: STATUS" of each row whose lifecycle workflow was started again.
    started: list[str] = field(default_factory=list)


@dataclass
class GetRegistryRowInput:
    org: str
    app: str
    executor_id: str


@dataclass
class RegistryRow:
    """What the registry says of an executor, as a lifecycle workflow started by the reconciliation reads it back."""

    status: ExecutorStatus
    app_version: str = ""
    # Where its socket was last: the gateway the fence asks.
    gateway_queue: str = ""
    connection_id: str = ""


# -- activities (stubs, called by reference; the implementations are registered under the same names) ----------


@activity.defn(name=Activity.RECONCILE_REGISTRY)
async def reconcile_registry(input: ReconcileInput) -> ReconcileResult:
    """Start the lifecycle workflow of every registry row that has none running."""
    raise NotImplementedError(STUB)


@activity.defn(name=Activity.GET_REGISTRY_ROW)
async def get_registry_row(input: GetRegistryRowInput) -> RegistryRow | None:
    """The executor's registry row; None when it has none (its lifecycle ended meanwhile)."""
    raise NotImplementedError(STUB)
