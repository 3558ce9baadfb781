"""Socket-bound activities: they run in the gateway process that holds the executor's socket, on that
process's own task queue, and write to the socket through the hub."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from core import logs, units, wire
from core.errors import ExecutorTimeoutError, ExecutorUnavailableError, ProtocolError, RelayError
from core.store import Store
from gateway.hub import Hub
from gateway.management import reply_body
from gateway.session import Reply
from workflows.contracts.common import Activity
from workflows.contracts.gateway_watch import HoldGatewayInput, ProbeGatewayInput, ProbeGatewayReply
from workflows.contracts.lifecycle import (
    DispatchRecoveryInput,
    ExistPendingInput,
    ExistPendingReply,
    RecoveryReply,
    WriteAuditInput,
)
from workflows.contracts.management import ExecutorRequestInput, ExecutorRequestReply, Failure, pack
from workflows.contracts.retention import DispatchRetentionInput, RetentionReply

log = logging.getLogger("relay.gateway")
HEARTBEAT_EVERY = timedelta(seconds=2)
# The longest a probe holds its answer for ``answer_at``: the fence asks a few seconds ahead of a grace's end, so
# a longer hold would be a bug, not a wait (the workflow bounds it as well: the probe's start-to-close timeout).
MAX_PROBE_HOLD = timedelta(seconds=30)


class HubActivities:
    def __init__(self, hub: Hub, contact_for: Callable[[], timedelta] = lambda: timedelta(0),
                 store: Store | None = None) -> None:
        self._hub = hub
        self._contact_for = contact_for  # how long this process has been in contact with Temporal
        self._store = store  # for the audit rows a request carries (none: the workflow writes them)

    @activity.defn(name=Activity.PROBE_GATEWAY)
    async def probe_gateway(self, input: ProbeGatewayInput) -> ProbeGatewayReply:
        """The fence's question: picked up at all, this gateway is alive; does it hold the executor's socket? With
        ``answer_at``, it looks then (or as soon as the socket appears), holding the answer at most
        ``MAX_PROBE_HOLD``."""
        if not input.executor_id:
            return ProbeGatewayReply(contact_for=self._contact_for())
        if input.answer_at is None:
            conn = self._hub.find(input.org, input.app, input.executor_id)
        else:
            # Both instants are Temporal's (the workflow's clock, the server's start time), so a gateway whose own
            # clock is off still looks when the grace ends by Temporal's.
            hold = min(input.answer_at - activity.info().started_time, MAX_PROBE_HOLD)
            conn = await self._hub.arrival(input.org, input.app, input.executor_id, hold)
        # A process that stopped holding (it retires) did not look at ``answer_at``: the workflow asks again then,
        # and finds it gone.
        return ProbeGatewayReply(connection=conn.signal if conn is not None else None, contact_for=self._contact_for(),
                                 held=input.answer_at is not None and self._hub.holding)

    @activity.defn(name=Activity.DISPATCH_RECOVERY)
    async def dispatch_recovery(self, input: DispatchRecoveryInput) -> RecoveryReply:
        for dead in input.dead_executor_ids:
            alive = self._hub.find(input.org, input.app, dead)
            if alive is not None:
                # Last line of the fence: the executor to recover holds a live socket here. Recovering it would
                # make a second process run its workflows. Asked to look (this is the fence's last look), the
                # socket is the answer: the workflow calls the recovery off; otherwise the request is refused.
                if input.look and alive.signal is not None:
                    log.info("recovery of %s/%s/%s called off: it holds a live socket here (%s)", input.org,
                             input.app, dead, alive.connection_id)
                    return RecoveryReply(False, f"executor {dead} is connected to this gateway", alive=alive.signal)
                raise ApplicationError(f"executor {dead} is connected to this gateway: not recovering it",
                                       type="ExecutorAlive", non_retryable=True)
        frame = wire.recovery_request(input.request_id, input.dead_executor_ids)
        audited = input.audit is not None and await self._audit(input.audit)
        reply = await self._request(input.executor_id, input.request_id, frame, input)
        if not isinstance(reply.reply, wire.RecoveryReply):
            return RecoveryReply(False, reply.reply.error_message or f"unexpected {reply.reply.type} reply",
                                 audited=audited)
        if not reply.reply.success or input.confirm is None:
            return RecoveryReply(reply.reply.success, reply.reply.error_message, audited=audited)
        # The confirmation, right away on the same socket: one activity (and one workflow task) where there were two.
        return RecoveryReply(True, reply.reply.error_message,
                             confirmed=await self.exist_pending_workflows(input.confirm), audited=audited)

    async def _audit(self, row: WriteAuditInput) -> bool:
        """Write the audit row a request carries, under its key (landed already counts); False when it could not
        be written here (no store, the database away): the workflow writes it then, under the same key."""
        if self._store is None:
            return False
        try:
            written = await self._store.call(
                self._store.write_audit, org=row.org, app=row.app, executor_id=row.executor_id,
                operation=row.operation, status=row.status, event_key=row.event_key,
                details={**row.details, **units.rest_durations(row.durations)})
        except Exception as err:  # the database away: the request still goes, and the workflow writes the row
            log.debug("%s of %s left to its workflow: %s", row.operation, row.executor_id, err)
            return False
        if written:
            logs.recovery_dispatched(log, org=row.org, app=row.app, executor_id=row.executor_id,
                                     workflow_id=activity.info().workflow_id, details=row.details)
        return True

    @activity.defn(name=Activity.EXIST_PENDING_WORKFLOWS)
    async def exist_pending_workflows(self, input: ExistPendingInput) -> ExistPendingReply:
        frame = wire.exist_pending_workflows_request(input.request_id, input.dead_executor_id, input.app_version)
        reply = await self._request(input.executor_id, input.request_id, frame, input)
        if not isinstance(reply.reply, wire.ExistPendingWorkflowsReply):
            # Unknown answer: assume workflows may remain, so the record is not deleted on a guess.
            return ExistPendingReply(True, reply.reply.error_message or f"unexpected {reply.reply.type} reply")
        return ExistPendingReply(reply.reply.exist, reply.reply.error_message)

    async def _request(self, executor_id: str, request_id: str, frame: str,
                       input: DispatchRecoveryInput | ExistPendingInput | DispatchRetentionInput) -> Reply:
        try:
            conn = self._hub.get(input.org, input.app, executor_id)
            request = asyncio.ensure_future(conn.request(request_id, frame, timeout=input.timeout))
            # Heartbeat while the executor thinks: if this gateway process dies, Temporal notices within the
            # heartbeat timeout and the workflow moves on to another peer.
            while not request.done():
                activity.heartbeat()
                await asyncio.wait([request], timeout=HEARTBEAT_EVERY.total_seconds())
            return request.result()
        except RelayError as err:
            # The workflow picks another peer; retrying here against the same socket would not help.
            raise ApplicationError(err.detail, type=type(err).__name__, non_retryable=True) from None

    @activity.defn(name=Activity.DISPATCH_RETENTION)
    async def dispatch_retention(self, input: DispatchRetentionInput) -> RetentionReply:
        c = input.cutoffs
        frame = wire.retention_request(input.request_id, gc_cutoff=c.gc_cutoff, gc_rows_threshold=c.gc_rows_threshold,
                                       gc_batch_size=c.gc_batch_size, timeout_cutoff=c.timeout_cutoff)
        reply = await self._request(input.executor_id, input.request_id, frame, input)
        if not isinstance(reply.reply, wire.RetentionReply):
            return RetentionReply(False, reply.reply.error_message or f"unexpected {reply.reply.type} reply")
        return RetentionReply(reply.reply.success, reply.reply.error_message)

    @activity.defn(name=Activity.EXECUTOR_REQUEST)
    async def executor_request(self, input: ExecutorRequestInput) -> ExecutorRequestReply:
        """An operator's request routed here from another gateway process (a local activity of its
        ``ManagementRequestWorkflow``): failures are answers, so the caller can choose the next executor."""
        conn = self._hub.find(input.org, input.app, input.executor_id)
        if conn is None:
            return ExecutorRequestReply(failure=Failure.UNAVAILABLE, detail="not connected to its gateway (any more)")
        try:
            reply = await conn.request(input.request_id, input.frame, timeout=input.timeout, large_reply=True)
        except ExecutorTimeoutError as err:
            return ExecutorRequestReply(failure=Failure.TIMEOUT, detail=err.detail)
        except (ExecutorUnavailableError, ProtocolError) as err:
            return ExecutorRequestReply(failure=Failure.BROKEN, detail=err.detail)
        return ExecutorRequestReply(reply_z=pack(reply_body(reply.reply)))

    @activity.defn(name=Activity.HOLD_GATEWAY)
    async def hold_gateway(self, input: HoldGatewayInput) -> None:
        """Heartbeat for as long as this gateway process lives (up to ``hold_for``)."""
        loop = asyncio.get_running_loop()
        until = loop.time() + input.hold_for.total_seconds()
        while loop.time() < until:
            activity.heartbeat(len(self._hub))
            await asyncio.sleep(input.heartbeat_interval.total_seconds())

    def all(self) -> list[Callable[..., Any]]:
        return [self.dispatch_recovery, self.exist_pending_workflows, self.dispatch_retention, self.hold_gateway,
                self.probe_gateway, self.executor_request]
