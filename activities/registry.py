"""Database activities, run by the worker on the shared task queue, on behalf of the lifecycle workflow.

They also report each lifecycle event once, where it is written: a console line (connected, disconnected, DEAD,
recovery dispatched, succeeded, failed, blocked, called off) with ``org``, ``app``, ``executor_id``, ``workflow_id``
and ``request_id`` as record attributes, and the worker's metrics (``core.metrics``). Only the call that wrote the
event's row reports it (the store says so): an activity retried after its row landed reports nothing again.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio import activity
from temporalio.service import RPCError, RPCStatusCode

from activities.database import database_calls
from core import gateways, logs, metrics, units
from core.errors import NotFoundError
from core.store import Store
from core.store.registry import RecoveredRow
from workflows.contracts.common import (
    Activity,
    Candidate,
    DisconnectedSignal,
    ExecutorStatus,
    lifecycle_workflow_id,
)
from workflows.contracts.gateway_watch import (
    DisconnectGatewayInput,
    DisconnectGatewayResult,
    GatewayGoneInput,
    GatewayGoneReply,
)
from workflows.contracts.lifecycle import (
    DeleteExecutorInput,
    GetExecutorTimeoutInput,
    GraceStart,
    PeerAvailableSignal,
    RecordStatusInput,
    SelectCandidateInput,
    Signal,
    WriteAuditInput,
    wake_recoveries,
)
from workflows.contracts.reconcile import GetRegistryRowInput, RegistryRow

log = logging.getLogger("relay.worker")


class RegistryActivities:
    """Bound to one ``Store``; registered with the worker as bound methods."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._db = database_calls(store)

    @activity.defn(name=Activity.RECORD_STATUS)
    async def record_status(self, input: RecordStatusInput) -> datetime | None:
        written = await self._db.first(
            self._store.record_status,
            org=input.org, app=input.app, executor_id=input.executor_id,
            status=input.status, operation=input.operation, event_key=input.event_key,
            info=input.info,
            connection_id=input.connection_id, gateway_queue=input.gateway_queue,
            details={**input.details, **units.rest_durations(input.durations)},
        )
        if written.written:
            _report_status(input)
        if written.gateway_gone:
            await _disconnect_from_gone_gateway(input)
        else:
            await self._wake_waiting_recoveries(input, written.dead)
        return written.at

    async def _wake_waiting_recoveries(self, input: RecordStatusInput, dead: list[str]) -> None:
        """A peer is HEALTHY: DEAD executors' workflows waiting for one look again now, not at their next check."""
        if dead:
            signal = PeerAvailableSignal(input.executor_id, input.info.application_version if input.info else "")
            await wake_recoveries(activity.client(), input.org, input.app, dead, signal)

    @activity.defn(name=Activity.BEGIN_GRACE)
    async def begin_grace(self, input: RecordStatusInput) -> GraceStart | None:
        begun = await self._db.first(self._store.begin_grace, org=input.org, app=input.app,
                                     executor_id=input.executor_id, event_key=input.event_key, details=input.details)
        if begun is None:
            return None
        # Reported once: by the try that wrote the row, or, if the gateway did, by the first try to find it.
        if begun.written or begun.by_gateway:
            _report_status(dataclasses.replace(input, durations={"executorTimeoutSecs": begun.grace}))
        return GraceStart(at=begun.at, grace=begun.grace)

    @activity.defn(name=Activity.GET_EXECUTOR_TIMEOUT)
    async def get_executor_timeout(self, input: GetExecutorTimeoutInput) -> timedelta | None:
        """The app's grace, read when a grace starts; None when the app no longer exists."""
        try:
            app = await self._db.first(self._store.get_app, input.org, input.app)
        except NotFoundError:
            return None
        return app.executor_timeout

    @activity.defn(name=Activity.SELECT_CANDIDATE)
    async def select_candidate(self, input: SelectCandidateInput) -> Candidate | None:
        found = await self._db(
            self._store.select_candidate,
            org=input.org, app=input.app, app_version=input.app_version, exclude=input.exclude,
            dead_executor_id=input.dead_executor_id, prefer_gateway=input.prefer_gateway,
        )
        if found is None:
            return None
        peer, cross_version = found
        assert peer.gateway_queue is not None
        return Candidate(peer.executor_id, peer.gateway_queue, peer.app_version, cross_version)

    @activity.defn(name=Activity.WRITE_AUDIT)
    async def write_audit(self, input: WriteAuditInput) -> None:
        written = await self._db(
            self._store.write_audit,
            org=input.org, app=input.app, executor_id=input.executor_id, operation=input.operation,
            status=input.status, details={**input.details, **units.rest_durations(input.durations)},
            event_key=input.event_key,
        )
        if written and input.operation in _RECOVERY_EVENTS:
            dead_since = None
            if input.operation == "executor.recovery.succeeded":  # the record is deleted after this, not before
                dead_since = await self._db(self._store.dead_since, org=input.org, app=input.app,
                                              executor_id=input.executor_id)
            _report_recovery(input, dead_since)

    @activity.defn(name=Activity.DELETE_EXECUTOR)
    async def delete_executor(self, input: DeleteExecutorInput) -> None:
        succeeded = input.succeeded
        deleted = await self._db(
            self._store.delete_executor,
            org=input.org, app=input.app, executor_id=input.executor_id, event_key=input.event_key,
            details=input.details, recovered=RecoveredRow(succeeded.event_key, {
                **succeeded.details, **units.rest_durations(succeeded.durations)}) if succeeded else None,
        )
        if succeeded is not None and deleted.deleted:
            _report_recovery(succeeded, deleted.dead_since)

    @activity.defn(name=Activity.DISCONNECT_GATEWAY_EXECUTORS)
    async def disconnect_gateway_executors(self, input: DisconnectGatewayInput) -> DisconnectGatewayResult:
        """Record the gateway as gone (``core.gateways``: the fence will not wait on it again), then signal
        ``disconnected`` for every executor the registry places on it.

        Each signal carries the connection id the registry recorded: if the executor reconnected elsewhere
        meanwhile, its workflow holds a newer connection and ignores this one as stale.
        """
        if await self._db(self._store.gateways.mark_gone, input.gateway_queue, gateways.WATCH):
            log.warning("gateway %s is gone (%s); disconnecting the executors it held", input.gateway_queue,
                        input.reason)
        held = await self._db(self._store.executors_on_gateway, input.gateway_queue)
        client = activity.client()
        for org, app, executor_id, connection_id in held:
            handle = client.get_workflow_handle(lifecycle_workflow_id(org, app, executor_id))
            signal = DisconnectedSignal(connection_id=connection_id, reason=input.reason,
                                        signal_id=_gone_signal_id(input.gateway_queue, connection_id))
            try:
                await handle.signal(Signal.DISCONNECTED, signal)
            except RPCError as err:
                if err.status != RPCStatusCode.NOT_FOUND:
                    raise
        return DisconnectGatewayResult(signalled=len(held))

    @activity.defn(name=Activity.GATEWAY_GONE)
    async def gateway_gone(self, input: GatewayGoneInput) -> GatewayGoneReply:
        reason = await self._db.first(self._store.gateways.gone_reason, input.gateway_queue)
        return GatewayGoneReply(gone=reason is not None, reason=reason or "")

    @activity.defn(name=Activity.GET_REGISTRY_ROW)
    async def get_registry_row(self, input: GetRegistryRowInput) -> RegistryRow | None:
        row = await self._db(self._store.registry_row, input.org, input.app, input.executor_id)
        if row is None:
            return None
        return RegistryRow(row.status, app_version=row.app_version, gateway_queue=row.gateway_queue or "",
                           connection_id=row.connection_id or "")

    def all(self) -> list[Callable[..., Any]]:
        return [self.record_status, self.begin_grace, self.get_executor_timeout, self.select_candidate,
                self.write_audit, self.delete_executor, self.disconnect_gateway_executors, self.gateway_gone,
                self.get_registry_row]


# -- reporting lifecycle events: a console line each, and metrics -------------------------------------------------

_CONNECTED = {"executor.healthy": "connected", "executor.reconnected": "reconnected",
              "executor.superseded": "connected again (a new socket superseded its previous one)"}
_RECOVERY_EVENTS = frozenset({"executor.recovery.dispatched", "executor.recovery.succeeded",
                              "executor.recovery.failed", "executor.recovery.blocked",
                              "executor.recovery.cancelled"})


def _extra(org: str, app: str, executor_id: str, **more: object) -> dict[str, object]:
    """The record attributes a structured log line carries (``core.logs``)."""
    return {"org": org, "app": app, "executor_id": executor_id, "workflow_id": activity.info().workflow_id, **more}


def _seconds_since(then: datetime | None) -> float | None:
    return None if then is None else (datetime.now(UTC) - then).total_seconds()


def _gone_signal_id(gateway_queue: str, connection_id: str) -> str:
    """One ``disconnected`` per socket of a gateway found gone, whoever sends it (the sweep, or a late record)."""
    return f"gateway-gone/{gateway_queue}/{connection_id}"


async def _disconnect_from_gone_gateway(input: RecordStatusInput) -> None:
    """The connection just recorded HEALTHY is on a gateway already known gone, which holds no socket: its watch's
    sweep ran before this row named it (the workflow took the ``connected`` in after it), so the workflow is told
    here, as the sweep tells the others, and its grace starts."""
    queue, connection_id = input.gateway_queue or "", input.connection_id or ""
    log.warning("executor %s was recorded on gateway %s, already gone; disconnecting it", input.executor_id, queue,
                extra=_extra(input.org, input.app, input.executor_id))
    handle = activity.client().get_workflow_handle(lifecycle_workflow_id(input.org, input.app, input.executor_id))
    await handle.signal(Signal.DISCONNECTED, DisconnectedSignal(
        connection_id=connection_id, reason=f"gateway gone: {queue}", signal_id=_gone_signal_id(queue, connection_id)))


def _report_status(input: RecordStatusInput) -> None:
    org, app, executor_id, status = input.org, input.app, input.executor_id, input.status
    metrics.TRANSITIONS.labels(org, app, status).inc()
    extra = _extra(org, app, executor_id)
    if status == ExecutorStatus.HEALTHY:
        delay = _seconds_since(input.connected_at)
        if delay is not None:
            metrics.SIGNAL_DELAY.observe(max(delay, 0.0))
        version = input.info.application_version if input.info else ""
        log.info("executor %s of %s/%s %s (version %r)", executor_id, org, app,
                 _CONNECTED.get(input.operation, "is HEALTHY"), version, extra=extra)
    elif status == ExecutorStatus.DISCONNECTED:
        delay = _seconds_since(input.disconnected_at)
        if delay is not None:
            metrics.SIGNAL_DELAY.observe(max(delay, 0.0))
        grace = input.durations.get("executorTimeoutSecs")
        log.info("executor %s of %s/%s disconnected; DEAD unless it reconnects within %s", executor_id, org, app,
                 f"{grace.total_seconds():g} s" if grace is not None else "its grace", extra=extra)
    elif status == ExecutorStatus.DEAD:
        late = _seconds_since(input.grace_deadline)
        if late is not None:
            metrics.DEAD_LATENESS.observe(max(late, 0.0))
        log.warning("executor %s of %s/%s is DEAD%s; recovering its workflows", executor_id, org, app,
                    f" ({late:.2f} s after its grace ended)" if late is not None else "", extra=extra)


def _report_recovery(input: WriteAuditInput, dead_since: datetime | None) -> None:
    org, app, executor_id, details = input.org, input.app, input.executor_id, input.details
    request_id = details.get("request_id")
    extra = _extra(org, app, executor_id, **({"request_id": request_id} if request_id else {}))
    peer, attempt = details.get("candidate"), details.get("attempt")
    if input.operation == "executor.recovery.dispatched":
        logs.recovery_dispatched(log, org=org, app=app, executor_id=executor_id,
                                 workflow_id=activity.info().workflow_id, details=details)
    elif input.operation == "executor.recovery.succeeded":
        metrics.RECOVERIES.labels(org, app, "succeeded").inc()
        took = _seconds_since(dead_since)
        if took is not None:
            metrics.RECOVERY_DURATION.labels(org, app).observe(max(took, 0.0))
        log.info("executor %s of %s/%s recovered by %s (attempt %s%s)", executor_id, org, app, peer, attempt,
                 f", {took:.2f} s after DEAD" if took is not None else "", extra=extra)
    elif input.operation == "executor.recovery.failed":
        metrics.RECOVERIES.labels(org, app, "failed").inc()
        log.warning("recovery of executor %s of %s/%s by %s failed (attempt %s): %s", executor_id, org, app, peer,
                    attempt, str(details.get("reason", ""))[:300], extra=extra)
    elif input.operation == "executor.recovery.blocked":
        metrics.RECOVERIES.labels(org, app, "blocked").inc()
        log.warning("recovery of executor %s of %s/%s blocked: %s", executor_id, org, app, details.get("reason"),
                    extra=extra)
    elif input.operation == "executor.recovery.cancelled":
        log.info("recovery of executor %s of %s/%s called off: %s", executor_id, org, app, details.get("reason"),
                 extra=extra)
