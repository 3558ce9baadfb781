"""Activities of the orphan sweep (``workflows.orphans``), run by the worker on the shared task queue: the apps to
sweep, the decision (``core.orphans``) with its audit row, and starting an orphan's lifecycle workflow.

``orphans.found`` is audited (and ``relay_orphans_found_total{org,app}`` counted) once per app per sweep that
finds any, where its row is written, and its ``OrphansFound`` alert's delivery is started right after
(``activities.alerts.start_own_alert_delivery``; the alerts round starts it if that failed). An orphan's lifecycle
workflow is started as a gateway starts one (same id, shared queue, Relay's search attributes), but without a
signal: ``LifecycleInput.orphan`` tells it what it is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from temporalio import activity
from temporalio.exceptions import WorkflowAlreadyStartedError

from activities.alerts import start_own_alert_delivery
from activities.database import database_calls
from core import metrics, orphans
from core.store import Store
from workflows.contracts.alerts import OwnAlertEvent
from workflows.contracts.common import (
    LIFECYCLE_WORKFLOW_TYPE,
    SHARED_TASK_QUEUE,
    Activity,
    lifecycle_search_attributes,
    lifecycle_workflow_id,
)
from workflows.contracts.lifecycle import LifecycleInput
from workflows.contracts.orphans import (
    FindOrphansInput,
    ListOrphanTargetsInput,
    Orphan,
    OrphanTarget,
    StartOrphanRecoveryInput,
)

# The lifecycle workflow's type, by name (activities may not import workflow code).
LIFECYCLE_WORKFLOW = LIFECYCLE_WORKFLOW_TYPE

log = logging.getLogger("relay.worker")


class OrphanActivities:
    """Bound to one ``Store``; registered with the worker as bound methods."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._db = database_calls(store)

    @activity.defn(name=Activity.LIST_ORPHAN_TARGETS)
    async def list_orphan_targets(self, input: ListOrphanTargetsInput) -> list[OrphanTarget]:
        apps = await self._db(self._store.apps_with_healthy_executors)
        body = orphans.aggregates_body(input.now, input.min_age)
        return [OrphanTarget(org, app, dict(body)) for org, app in apps]

    @activity.defn(name=Activity.FIND_ORPHANS)
    async def find_orphans(self, input: FindOrphansInput) -> list[Orphan]:
        # Read after the executor answered: an executor that registered meanwhile is left alone.
        registered = await self._db(self._store.registered_executor_ids)
        found = orphans.find_orphans(input.reply, registered=registered, now=input.now, min_age=input.min_age)
        if found:
            details = orphans.audit_details(found, asked=input.asked, min_age=input.min_age)
            written = await self._db(
                self._store.write_audit, org=input.org, app=input.app, operation="orphans.found",
                status="failure", details=details, event_key=input.event_key)
            if written:
                metrics.ORPHANS_FOUND.labels(input.org, input.app).inc(len(found))
            # Also when a retry finds the row written: the alert's id comes from the row, so it is started once.
            event = OwnAlertEvent(input.org, input.app, "orphans.found", input.event_key, input.now, None, details)
            try:
                await start_own_alert_delivery(activity.client(), event)
            except Exception as err:  # any failure: the alerts round starts it from the row
                log.warning("OrphansFound alert of %s/%s not started now (the alerts round will): %s", input.org,
                            input.app, err)
        return found

    @activity.defn(name=Activity.START_ORPHAN_RECOVERY)
    async def start_orphan_recovery(self, input: StartOrphanRecoveryInput) -> bool:
        org, app, executor_id = input.org, input.app, input.executor_id
        try:
            await activity.client().start_workflow(
                LIFECYCLE_WORKFLOW,
                LifecycleInput(org, app, executor_id, recovery_timeout=input.recovery_timeout,
                               probe_timeout=input.probe_timeout, orphan=input.info),
                id=lifecycle_workflow_id(org, app, executor_id),
                task_queue=SHARED_TASK_QUEUE,
                search_attributes=lifecycle_search_attributes(org, app, executor_id, input.info.app_version),
                static_summary=f"orphaned DBOS executor {executor_id} of {org}/{app}",
            )
        except WorkflowAlreadyStartedError:
            return False  # its lifecycle runs (it connected meanwhile, or a recovery is under way): left to it
        return True

    def all(self) -> list[Callable[..., Any]]:
        return [self.list_orphan_targets, self.find_orphans, self.start_orphan_recovery]
