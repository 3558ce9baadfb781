"""Database activities of the retention rounds, run by the worker on the shared task queue.

The socket-bound one (``dispatch_retention``) is in ``gateway.activities``, with the other requests to executors.
Rounds are counted where their audit rows are written (``relay_retention_rounds_total{org,app,outcome}``: succeeded
and failed per attempt, skipped), once per row as in ``activities.registry``. The audit log's own retention deletes
in batches, each its own transaction, and counts each batch as it commits (``relay_audit_rows_pruned_total``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from temporalio import activity

from activities.database import database_calls
from core import metrics, units, wire
from core.logs import OncePerWindow
from core.models import Application
from core.names import DEFAULT_ORG
from core.store import Store
from workflows.contracts.common import Activity, Candidate
from workflows.contracts.retention import (
    ListRetentionTargetsInput,
    PruneAuditLogInput,
    RetentionTarget,
    SelectRetentionExecutorInput,
    WriteRetentionAuditInput,
)

log = logging.getLogger("relay.worker")

# A threshold under a second stored before the REST API refused it is said again at most this often per app, not
# every round (RELAY_RETENTION_INTERVAL_SECS): the operator has to change it, and once is not always seen.
SLIP_REPORT_EVERY = timedelta(hours=1)


class RetentionActivities:
    """Bound to one ``Store``; registered with the worker as bound methods."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._db = database_calls(store)
        self._slips = OncePerWindow(SLIP_REPORT_EVERY)

    @activity.defn(name=Activity.LIST_RETENTION_TARGETS)
    async def list_retention_targets(self, input: ListRetentionTargetsInput) -> list[RetentionTarget]:
        rows = await self._db(self._store.list_retention_targets, input.org, input.app)
        return [self._target(app, last) for app, last in rows]

    def _target(self, app: Application, last: datetime | None) -> RetentionTarget:
        """The app's retention settings, a threshold under ``units.MIN_THRESHOLD`` as unset: the REST API refuses
        one as a unit slip (``gcTimeThresholdMs: 7`` would delete every finished workflow), but a database written
        by an older Relay may hold one."""
        slips = {name: value for name, value in (("gcTimeThresholdMs", app.gc_time_threshold),
                                                  ("globalTimeoutMs", app.global_timeout))
                 if value is not None and value < units.MIN_THRESHOLD}
        if slips and self._slips.due((app.org, app.name, *slips.values())):
            log.warning("%s", slip_warning(app.org, app.name, slips))
        return RetentionTarget(
            app.org, app.name, gc_rows_threshold=app.gc_rows_threshold, last_started_at=last,
            gc_time_threshold=None if "gcTimeThresholdMs" in slips else app.gc_time_threshold,
            global_timeout=None if "globalTimeoutMs" in slips else app.global_timeout)

    @activity.defn(name=Activity.SELECT_RETENTION_EXECUTOR)
    async def select_retention_executor(self, input: SelectRetentionExecutorInput) -> Candidate | None:
        found = await self._db(
            self._store.select_retention_executor, org=input.org, app=input.app, exclude=input.exclude,
            latest=input.latest,
        )
        return None if found is None else Candidate(*found)

    @activity.defn(name=Activity.WRITE_RETENTION_AUDIT)
    async def write_retention_audit(self, input: WriteRetentionAuditInput) -> None:
        outcome = _OUTCOMES.get(input.operation)
        written = await self._db(
            self._store.write_retention_audit,
            org=input.org, app=input.app, operation=input.operation, event_key=input.event_key,
            status=input.status, executor_id=input.executor_id, details=audit_details(input),
            started_at=input.started_at, request_id=input.details.get("request_id"),
        )
        if written and outcome is not None:
            metrics.RETENTION_ROUNDS.labels(input.org, input.app, outcome).inc()

    @activity.defn(name=Activity.PRUNE_AUDIT_LOG)
    async def prune_audit_log(self, input: PruneAuditLogInput) -> int:
        # Batch after batch, each through ``Store.call``: on SQLite the lifecycle's writes (``call_first``) go
        # ahead of the next batch, on PostgreSQL they wait for one batch's row locks at most.
        deadline = time.monotonic() + input.budget.total_seconds()
        pruned = batch = 0
        while True:
            batch = await self._db(self._store.prune_audit_batch, before=input.before, limit=input.batch_size)
            pruned += batch
            metrics.AUDIT_ROWS_PRUNED.inc(batch)
            if batch < input.batch_size or time.monotonic() >= deadline:
                break
        if pruned:
            left = "" if batch < input.batch_size else "; more are left for the next round"
            log.info("audit log: %d rows emitted before %s deleted%s", pruned, input.before.isoformat(), left)
        return pruned

    def all(self) -> list[Callable[..., Any]]:
        return [self.list_retention_targets, self.select_retention_executor, self.write_retention_audit,
                self.prune_audit_log]


_FLAGS = {"gcTimeThresholdMs": "--gc-time-threshold", "globalTimeoutMs": "--global-timeout"}


def slip_warning(org: str, app: str, slips: dict[str, timedelta]) -> str:
    """What to say of an app's thresholds under a second: each in its REST unit, and how to fix them."""
    said = " and ".join(f"{name} {units.timedelta_to_ms(value)} ms" for name, value in slips.items())
    update = f"relay apps update {app}" + ("" if org == DEFAULT_ORG else f" --org {org}")
    meant = " ".join(f"{_FLAGS[name]} DURATION" for name in slips)
    clear = " ".join(f"{_FLAGS[name]} none" for name in slips)
    return (f"retention ignores {said} of app {app!r} (org {org!r}): under 1 s, a unit slip an older Relay "
            f"stored. Set what was meant with {update} {meant} (e.g. 7d), or clear it with {update} {clear}")


_OUTCOMES = {"retention.succeeded": "succeeded", "retention.failed": "failed", "retention.skipped": "skipped"}


def audit_details(input: WriteRetentionAuditInput) -> dict[str, Any]:
    """The audit row's details: the body exactly as the wire carries it (epoch ms, from the same function that
    builds the frame), next to the round's clock and the settings it came from, so units can be checked by eye:
    ``clock_epoch_ms - gcTimeThresholdMs == body.gc_cutoff_epoch_ms``."""
    details: dict[str, Any] = {
        "clock": input.clock.isoformat(), "clock_epoch_ms": units.datetime_to_epoch_ms(input.clock), **input.details,
    }
    if input.target is not None:
        t = input.target
        details["settings"] = {
            "gcTimeThresholdMs": units.optional_timedelta_to_ms(t.gc_time_threshold),
            "gcRowsThreshold": t.gc_rows_threshold,
            "globalTimeoutMs": units.optional_timedelta_to_ms(t.global_timeout),
        }
    if input.cutoffs is not None:
        c = input.cutoffs
        details["body"] = wire.retention_body(gc_cutoff=c.gc_cutoff, gc_rows_threshold=c.gc_rows_threshold,
                                              gc_batch_size=c.gc_batch_size, timeout_cutoff=c.timeout_cutoff)
    return details
