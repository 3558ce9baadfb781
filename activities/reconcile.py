"""The reconciliation's activity (``workflows.reconcile``), run by the worker on the shared task queue: every registry
row without a running lifecycle workflow gets one again, started from the row (``LifecycleInput.reconcile``).

Which workflows run is read from Temporal's visibility (one list of the running lifecycle workflows, paged), so a
round costs a few calls however large the fleet; a row whose workflow visibility does not list is started with
Temporal's default conflict policy, which refuses a start while a run of that id is open. So visibility lagging
(a workflow just started, or just ended) costs at most a refused start, or a round's delay, never a second
workflow. Where visibility cannot be asked (the time-skipping test server), every row's start is tried.

What the row says is not passed to the workflow: it reads the row back itself, once it is the only workflow that
can write it (``ExecutorLifecycleWorkflow._begin_reconciled``), and audits ``executor.reconciled``. Here the round
counts each start (``relay_executors_reconciled_total{org,app,status}``) and logs one summary line.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any

from temporalio import activity
from temporalio.api.workflowservice.v1 import ListWorkflowExecutionsRequest
from temporalio.client import Client
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from activities.database import database_calls
from activities.orphans import LIFECYCLE_WORKFLOW
from core import metrics
from core.store import Store
from workflows.contracts.common import (
    SHARED_TASK_QUEUE,
    Activity,
    ExecutorStatus,
    lifecycle_search_attributes,
    lifecycle_workflow_id,
)
from workflows.contracts.lifecycle import LifecycleInput
from workflows.contracts.reconcile import ReconcileInput, ReconcileResult

log = logging.getLogger("relay.worker")

# Starts in flight at once: a round after Temporal's state was lost restarts the whole fleet.
START_CONCURRENCY = 16
RUNNING_LIFECYCLES = f"WorkflowType = '{LIFECYCLE_WORKFLOW}' AND ExecutionStatus = 'Running'"


class ReconcileActivities:
    """Bound to one ``Store``; registered with the worker as bound methods."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._db = database_calls(store)

    @activity.defn(name=Activity.RECONCILE_REGISTRY)
    async def reconcile_registry(self, input: ReconcileInput) -> ReconcileResult:
        client = activity.client()
        # Listed before the registry is read: a row written after the list (a new executor) has its workflow
        # running, and its start is simply refused.
        running = await running_lifecycles(client)
        rows = await self._db(self._store.registry_rows)
        result = ReconcileResult(rows=len(rows))
        started: Counter[ExecutorStatus] = Counter()
        slots = asyncio.Semaphore(START_CONCURRENCY)

        async def reconcile(org: str, app: str, executor_id: str, status: ExecutorStatus, version: str) -> None:
            async with slots:
                activity.heartbeat()
                if await _start(client, input, org, app, executor_id, version):
                    result.started.append(f"{org}/{app}/{executor_id}: {status}")
                    started[status] += 1
                    metrics.EXECUTORS_RECONCILED.labels(org, app, status).inc()
                else:
                    result.running += 1

        # Only the rows visibility does not list get a coroutine: in a healthy fleet, none.
        missing = [row for row in rows if running is None or lifecycle_workflow_id(*row[:3]) not in running]
        result.running += len(rows) - len(missing)
        await asyncio.gather(*(reconcile(*row) for row in missing))
        result.started.sort()
        log.info("reconciliation: %d registry rows, %d with their lifecycle workflow running, %d started again%s",
                 result.rows, result.running, len(result.started),
                 f" ({', '.join(f'{s} {n}' for s, n in sorted(started.items()))})" if started else "")
        return result

    def all(self) -> list[Callable[..., Any]]:
        return [self.reconcile_registry]


async def running_lifecycles(client: Client, *, page_size: int = 1000) -> set[str] | None:
    """The ids of the running lifecycle workflows, as visibility lists them; None where it cannot be asked.

    Read off the service's own pages (``Client.workflow_service``), the id alone: ``Client.list_workflows`` builds a
    ``WorkflowExecution`` per run, its search attributes and memo decoded, which at 10,000 executors cost the worker
    about 2 s of CPU a round, a fifth of a worker's CPU while a tenth of the fleet was being recovered
    (``BENCH_SCALE_PY_SPY=1 python -m tests.bench scale``)."""
    ids: set[str] = set()
    token = b""
    try:
        while True:
            page = await client.workflow_service.list_workflow_executions(ListWorkflowExecutionsRequest(
                namespace=client.namespace, page_size=page_size, next_page_token=token, query=RUNNING_LIFECYCLES))
            ids.update(info.execution.workflow_id for info in page.executions)
            token = page.next_page_token
            if not token:
                return ids
    except RPCError as err:
        log.debug("visibility unavailable (%s): trying every row's start", err.message)
        return None


async def _start(client: Client, input: ReconcileInput, org: str, app: str, executor_id: str,
                 version: str) -> bool:
    """Start the executor's lifecycle workflow from its row; False when one runs under its id."""
    try:
        await client.start_workflow(
            LIFECYCLE_WORKFLOW,
            LifecycleInput(org, app, executor_id, recovery_timeout=input.recovery_timeout,
                           probe_timeout=input.probe_timeout, reconcile=True),
            id=lifecycle_workflow_id(org, app, executor_id),
            task_queue=SHARED_TASK_QUEUE,
            search_attributes=lifecycle_search_attributes(org, app, executor_id, version),
            static_summary=f"DBOS executor {executor_id} of {org}/{app} (reconciled from the registry)",
        )
    except WorkflowAlreadyStartedError:
        return False
    return True
