"""Database activities, run by the worker on the shared task queue, on behalf of the lifecycle workflow."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, ParamSpec, TypeVar

from sqlalchemy.exc import SQLAlchemyError
from temporalio import activity
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.service import RPCError, RPCStatusCode

from core import units
from core.errors import NotFoundError
from core.store import Store, outage, unavailable
from workflows.contracts.common import Activity, Candidate, DisconnectedSignal, lifecycle_workflow_id
from workflows.contracts.gateway_watch import DisconnectGatewayInput, DisconnectGatewayResult
from workflows.contracts.lifecycle import (
    DeleteExecutorInput,
    GetExecutorTimeoutInput,
    PeerAvailableSignal,
    RecordStatusInput,
    SelectCandidateInput,
    WriteAuditInput,
)

log = logging.getLogger("relay.worker")
P = ParamSpec("P")
T = TypeVar("T")
# The failure type of an attempt that found the database away; retried like any failure (never non-retryable).
DATABASE_UNAVAILABLE = "DatabaseUnavailable"
# While the database is away, say so in the log at most this often (every workflow's activity retries meanwhile).
OUTAGE_LOG_EVERY = timedelta(seconds=30)


class RegistryActivities:
    """Bound to one ``Store``; registered with the worker as bound methods."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._down_since: float | None = None  # monotonic time of the first failure of the current outage
        self._reported_at = 0.0

    async def _call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a store call in a thread. A database that is away (``core.store.unavailable``: stopped,
        restarting, locked) fails this attempt with a short, retryable error: the workflow retries it until the
        database is back, and each write lands once by its event key, so nothing is lost or doubled.

        BENIGN: the SDK logs such a failure at DEBUG, not a traceback per attempt per workflow; this class logs
        one line when the outage starts (and every ``OUTAGE_LOG_EVERY`` while it lasts) and one when it ends.
        """
        try:
            result = await asyncio.to_thread(fn, *args, **kwargs)
        except SQLAlchemyError as err:
            if not unavailable(err):
                raise  # a bug, or a duplicate written by an earlier attempt still running: retried all the same
            self._report_down(err)
            raise ApplicationError(f"database unavailable: {outage(err)}", type=DATABASE_UNAVAILABLE,
                                   category=ApplicationErrorCategory.BENIGN) from None
        if self._down_since is not None:
            log.warning("database reachable again after %.1f s; retried activities go on",
                        time.monotonic() - self._down_since)
            self._down_since = None
        return result

    def _report_down(self, err: SQLAlchemyError) -> None:
        now = time.monotonic()
        if self._down_since is None:
            self._down_since = now
        elif now - self._reported_at < OUTAGE_LOG_EVERY.total_seconds():
            return
        self._reported_at = now
        log.warning("database unavailable for %.1f s, database activities retrying: %s", now - self._down_since,
                    outage(err))

    @activity.defn(name=Activity.RECORD_STATUS)
    async def record_status(self, input: RecordStatusInput) -> None:
        dead = await self._call(
            self._store.record_status,
            org=input.org, app=input.app, executor_id=input.executor_id,
            status=input.status, operation=input.operation, event_key=input.event_key,
            info=input.info,
            connection_id=input.connection_id, gateway_queue=input.gateway_queue,
            details={**input.details, **units.rest_durations(input.durations)},
        )
        await self._wake_waiting_recoveries(input, dead)

    async def _wake_waiting_recoveries(self, input: RecordStatusInput, dead: list[str]) -> None:
        """A peer is HEALTHY: DEAD executors' workflows waiting for one look again now, not at their next check."""
        if not dead:
            return
        client = activity.client()
        signal = PeerAvailableSignal(input.executor_id, input.info.application_version if input.info else "")
        for executor_id in dead:
            handle = client.get_workflow_handle(lifecycle_workflow_id(input.org, input.app, executor_id))
            with contextlib.suppress(RPCError):  # ended meanwhile: nothing waits there any more
                await handle.signal("peer_available", signal)

    @activity.defn(name=Activity.GET_EXECUTOR_TIMEOUT)
    async def get_executor_timeout(self, input: GetExecutorTimeoutInput) -> timedelta | None:
        """The app's grace, read when a grace starts; None when the app no longer exists."""
        try:
            app = await self._call(self._store.get_app, input.org, input.app)
        except NotFoundError:
            return None
        return app.executor_timeout

    @activity.defn(name=Activity.SELECT_CANDIDATE)
    async def select_candidate(self, input: SelectCandidateInput) -> Candidate | None:
        found = await self._call(
            self._store.select_candidate,
            org=input.org, app=input.app, app_version=input.app_version, exclude=input.exclude,
            dead_executor_id=input.dead_executor_id,
        )
        if found is None:
            return None
        peer, cross_version = found
        assert peer.gateway_queue is not None
        return Candidate(peer.executor_id, peer.gateway_queue, peer.app_version, cross_version)

    @activity.defn(name=Activity.WRITE_AUDIT)
    async def write_audit(self, input: WriteAuditInput) -> None:
        await self._call(
            self._store.write_audit,
            org=input.org, app=input.app, executor_id=input.executor_id, operation=input.operation,
            status=input.status, details={**input.details, **units.rest_durations(input.durations)},
            event_key=input.event_key,
        )

    @activity.defn(name=Activity.DELETE_EXECUTOR)
    async def delete_executor(self, input: DeleteExecutorInput) -> None:
        await self._call(
            self._store.delete_executor,
            org=input.org, app=input.app, executor_id=input.executor_id, event_key=input.event_key,
            details=input.details,
        )

    @activity.defn(name=Activity.DISCONNECT_GATEWAY_EXECUTORS)
    async def disconnect_gateway_executors(self, input: DisconnectGatewayInput) -> DisconnectGatewayResult:
        """Signal ``disconnected`` for every executor the registry places on a gateway that is gone.

        Each signal carries the connection id the registry recorded: if the executor reconnected elsewhere
        meanwhile, its workflow holds a newer connection and ignores this one as stale.
        """
        held = await self._call(self._store.executors_on_gateway, input.gateway_queue)
        client = activity.client()
        for org, app, executor_id, connection_id in held:
            handle = client.get_workflow_handle(lifecycle_workflow_id(org, app, executor_id))
            signal = DisconnectedSignal(connection_id=connection_id, reason=input.reason,
                                        signal_id=f"gateway-gone/{input.gateway_queue}/{connection_id}")
            try:
                await handle.signal("disconnected", signal)
            except RPCError as err:
                if err.status != RPCStatusCode.NOT_FOUND:
                    raise
        return DisconnectGatewayResult(signalled=len(held))

    def all(self) -> list[Callable[..., Any]]:
        return [self.record_status, self.get_executor_timeout, self.select_candidate, self.write_audit,
                self.delete_executor, self.disconnect_gateway_executors]
