"""What every step of the executor lifecycle workflow shares: the run's state, the registry and audit writes, the
patches the workflow's history depends on, and the checks for a removal and a long history.

``ExecutorLifecycleWorkflow`` (``workflows/lifecycle.py``) is built on ``RecoverySteps`` (``workflows/recovery.py``),
built on ``LifecycleBase`` here: one workflow class, its methods in three modules by concern.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, CancelledError, FailureError

from workflows.timing import DB_ACTIVITY_TIMEOUT

with workflow.unsafe.imports_passed_through():
    from workflows.contracts.alerts import OwnAlertEvent, start_own_alert
    from workflows.contracts.common import (
        RELAY_EXECUTOR_STATUS,
        RELAY_ORG,
        ConnectedSignal,
        ExecutorInfo,
        ExecutorStatus,
    )
    from workflows.contracts.lifecycle import (
        LifecycleInput,
        LifecycleState,
        RecordedAt,
        RecordStatusInput,
        RemovedSignal,
        WriteAuditInput,
        record_status,
        write_audit,
    )

A = TypeVar("A")
T = TypeVar("T")


class Removed(Exception):
    """Raised inside the run when a ``removed`` signal ends the workflow's business."""


class Abandoned(Exception):
    """``LifecycleBase._unless``: the work was abandoned, its stop condition having come true first."""


# Continue-as-new after this many signals even if the server has not suggested it yet.
SIGNAL_BUDGET = 1000
# Database activities retry without limit (every write lands once by its event key, so a retry never doubles a
# row), at most this far apart: with Temporal's default (doubling up to 100 s) a 60 s database outage could leave
# a workflow idle for another minute after the database came back. Only the interval is set here: it is not
# part of the history, so histories replay unchanged.
DB_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=5))
# Starting an alert's delivery is a local activity calling the client's start_workflow, not a child workflow: one
# marker in this history instead of the child's initiated/started/completed events, which would also wake this
# long-lived workflow when the delivery ends; and the start's id conflict ("already started": delivered) is the
# same one the other writers and the alerts round meet. It is tried a few times only: a recovery never waits on
# an alert, and the alerts round starts any delivery nobody started.
OWN_ALERT_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=5),
                              maximum_attempts=3)

# -- patches (docs/pages/contributing/patch-policy.md) -----------------------------------------------------------
# A new run asks ``workflow.patched`` once, for its generation's marker (``workflows.lifecycle_generations``),
# which stands for every patch listed with it: each first call in a new run writes a marker and upserts
# ``TemporalChangeVersion`` (a visibility write). A run started on generation 3's code replays that marker and asks
# for the patches after it one by one, as it did. Generations 0 to 2 (and the branches only they took: remote
# database activities, no fence, no gate, no look again before a request, known-gone gateways probed, no own
# alerts, the fence asked after the grace, DISCONNECTED in two writes) are not replayed any more.
#
# From this patch on, DEAD is recorded with one local activity, ``declare_dead``, that goes on to the recovery's first
# steps: the gate's answer, and if it admits, a peer claimed, and if one is, whether the dead executor's gateway is
# known gone (the last look's probe skips a gone one). Before it these were four local activities in a row, each a
# round through the worker (an activation, the activity, an activation): in a burst of deaths, the rounds of the
# first to die queued ahead of the DEAD rows of the last. Whatever comes after a wait (a held gate, no peer, a
# backoff) asks each step on its own, as before.
DEAD_IN_ONE_STEP_PATCH = "dead-and-first-steps-in-one"
# From this patch on, a status recorded that the ``RelayExecutorStatus`` attribute already holds is not upserted
# again: an executor that reconnects while HEALTHY (its gateway lost, its socket superseded) and a new run's first
# HEALTHY (the gateway starts it with the attribute set) each cost one Temporal action less.
UNCHANGED_STATUS_PATCH = "unchanged-status-not-upserted"
# Generation 4: generation 3 and the two patches above.
PATCHES_IN_GENERATION_4 = frozenset({DEAD_IN_ONE_STEP_PATCH, UNCHANGED_STATUS_PATCH})
# From this patch on, the recovery request asks its gateway to confirm it too (``DispatchRecoveryInput.confirm``):
# the gateway sends ``exist_pending_workflows`` on the same socket as soon as ``recovery`` succeeds, and the reply
# carries both answers. The confirmation is the same question to the same peer, only one activity and one workflow
# task sooner. A gateway that does not (older code) leaves ``confirmed`` unset, and the workflow asks as before.
CONFIRM_WITH_REQUEST_PATCH = "confirmed-with-the-request"
# From this patch on, a confirmed recovery's ``executor.recovery.succeeded`` row and the deletion are one local
# activity (``DeleteExecutorInput.succeeded``), one transaction, where there were two of each.
RECOVERED_IN_ONE_WRITE_PATCH = "recovered-and-deleted-in-one-write"
# From this patch on, the ``executor.recovery.dispatched`` row goes with the request (``DispatchRecoveryInput.audit``)
# and the gateway writes it as it sends: no local activity (and no marker) in the workflow task that sends it. The
# workflow writes it itself, under the same key, only when the gateway did not say it did (older code, its database
# away, the request failed before an answer).
DISPATCHED_BY_GATEWAY_PATCH = "dispatched-row-by-the-gateway"
# Generation 5: generation 4 and the three patches above.
PATCHES_IN_GENERATION_5 = PATCHES_IN_GENERATION_4 | {CONFIRM_WITH_REQUEST_PATCH, RECOVERED_IN_ONE_WRITE_PATCH,
                                                     DISPATCHED_BY_GATEWAY_PATCH}
# From this patch on, the last look before a recovery request is the sending gateway's own when the peer is on the
# dead executor's last gateway: that gateway looks for the dead executor's socket as it picks the request up
# (``DispatchRecoveryInput.look``), later than a probe would and in the same place, and answers a live socket
# with its connection (``RecoveryReply.alive``), which calls the recovery off as a probe's would. One activity and
# one workflow task less per death; the peer is looked for on that gateway first (``SelectCandidateInput.prefer_
# gateway``). Only a recovery's first attempt goes without the probe: a gateway of older code refuses with an
# error instead (``ExecutorAlive``), a failed attempt, and every attempt after a failure is probed as before.
LAST_LOOK_BY_THE_SENDER_PATCH = "last-look-by-the-sending-gateway"
# Generation 6: generation 5 and the patch above.
PATCHES_IN_GENERATION_6 = PATCHES_IN_GENERATION_5 | {LAST_LOOK_BY_THE_SENDER_PATCH}
# The patches each generation this code replays stands for (generation 3 stands for none still asked).
PATCHES_BY_GENERATION = {4: PATCHES_IN_GENERATION_4, 5: PATCHES_IN_GENERATION_5, 6: PATCHES_IN_GENERATION_6}


class LifecycleBase:
    """The state one run holds (set by the workflow's ``__init__``) and the helpers every step uses."""

    _input: LifecycleInput
    _state: LifecycleState
    _signals_this_run: int
    _removed: RemovedSignal | None
    _peer_hint: bool
    _generation: int  # the generation whose marker the run has: 6, 5, 4 or 3 (the oldest replayed)

    def _check_removed(self) -> None:
        if self._removed is not None:
            raise Removed()

    async def _unless(self, work: Awaitable[T], stop: Callable[[], bool]) -> T:
        """Await ``work``, abandoning it (cancelled) and raising ``Abandoned`` if ``stop()`` comes true first."""
        task = asyncio.ensure_future(work)
        stopped = asyncio.ensure_future(workflow.wait_condition(stop))
        await workflow.wait([task, stopped], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            stopped.cancel()
            return task.result()
        task.cancel()
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: no "never retrieved" noise
        raise Abandoned()

    async def _unless_removed(self, work: Awaitable[T]) -> T:
        """Await ``work``, abandoning it (cancelled) if a ``removed`` signal comes first."""
        try:
            return await self._unless(work, lambda: self._removed is not None)
        except Abandoned:
            raise Removed() from None

    def _should_continue_as_new(self) -> bool:
        return workflow.info().is_continue_as_new_suggested() or self._signals_this_run >= SIGNAL_BUDGET

    def _next_input(self, state: LifecycleState) -> LifecycleInput:
        i = self._input
        return LifecycleInput(i.org, i.app, i.executor_id, state=state, recovery_timeout=i.recovery_timeout,
                              probe_timeout=i.probe_timeout)

    async def _continue_as_new_if_long(self) -> None:
        """A long wait for a peer must not grow history without bound: the next run resumes recovery."""
        if self._should_continue_as_new():
            await workflow.wait_condition(workflow.all_handlers_finished)
            workflow.continue_as_new(self._next_input(self._state))

    def _version(self) -> str:
        return self._state.app_version

    async def _record(self, status: ExecutorStatus, operation: str, *, conn: ConnectedSignal | None = None,
                      details: dict[str, object], durations: dict[str, timedelta] | None = None,
                      info: ExecutorInfo | None = None) -> RecordedAt:
        """Write the status and its audit row; when the row says it happened (None from an older history)."""
        recorded_at = await self._db(record_status, self._status_input(
            status, operation, conn=conn, details=details, durations=durations, info=info))
        self._recorded(status)
        return recorded_at

    def _status_input(self, status: ExecutorStatus, operation: str, *, conn: ConnectedSignal | None = None,
                      details: dict[str, object], durations: dict[str, timedelta] | None = None,
                      info: ExecutorInfo | None = None) -> RecordStatusInput:
        """What ``record_status`` writes for ``status``: the registry row and its audit row, under a new key."""
        i = self._input
        if self._state.orphan:
            details = {**details, "orphan": True}
        return RecordStatusInput(
            i.org, i.app, i.executor_id, status, operation, event_key=self._event_key(operation),
            info=conn.info if conn else info,
            connection_id=conn.connection_id if conn else None,
            gateway_queue=conn.gateway_queue if conn else None,
            details=dict(details),
            durations=dict(durations or {}),
            connected_at=conn.at if conn else None,
            grace_deadline=self._state.grace_deadline if status == ExecutorStatus.DEAD else None,
            disconnected_at=self._state.disconnected_at if status == ExecutorStatus.DISCONNECTED else None,
        )

    def _recorded(self, status: ExecutorStatus) -> None:
        """The registry says ``status`` now: the state, the UI's details and the status attribute follow."""
        self._state.status = status
        self._state.revived = False
        self._state.gate_ticket = ""  # a death after this one asks the gate anew
        self._describe("")
        attributes = workflow.info().typed_search_attributes
        if attributes.get(RELAY_ORG) is not None:
            # Started by a gateway with Relay's attributes (registered on the server): keep the status findable.
            if attributes.get(RELAY_EXECUTOR_STATUS) == status.value and self._patched(UNCHANGED_STATUS_PATCH):
                return
            workflow.upsert_search_attributes([RELAY_EXECUTOR_STATUS.value_set(status.value)])

    async def _audit(self, operation: str, status: str, details: dict[str, object], *,
                     durations: dict[str, timedelta] | None = None) -> str:
        """Write an audit row; its event key."""
        row = self._audit_input(operation, status, details, durations=durations)
        await self._db(write_audit, row)
        return row.event_key

    def _audit_input(self, operation: str, status: str, details: dict[str, object], *,
                     durations: dict[str, timedelta] | None = None) -> WriteAuditInput:
        """An audit row about this executor under a new event key (an orphan's rows say so), for ``_audit`` or for
        an activity that writes it along with its own work."""
        i = self._input
        if self._state.orphan:
            details = {**details, "orphan": True}
        return WriteAuditInput(i.org, i.app, i.executor_id, operation, self._event_key(operation), status,
                               dict(details), dict(durations or {}))

    async def _unblocked(self, outcome: str, *, candidate: str | None = None) -> None:
        """The end of a blocked stretch whose RecoveryBlocked alert went out (``blocked_since``): audited, and its
        RecoveryUnblocked alert started. Nothing otherwise."""
        since = self._state.blocked_since
        if since is None:
            return
        self._state.blocked_since = None
        details: dict[str, object] = {"reason": outcome, "blocked_since": since.isoformat()}
        if candidate is not None:
            details["candidate"] = candidate
        blocked_for = {"blockedSecs": workflow.now() - since}
        key = await self._audit("executor.recovery.unblocked", "success", details, durations=blocked_for)
        await self._own_alert("executor.recovery.unblocked", key, details)

    async def _own_alert(self, operation: str, event_key: str, details: dict[str, object]) -> None:
        """Start the delivery of the alert of the audit row just written (``event_key``): ``OWN_ALERT_RETRY``."""
        i = self._input
        event = OwnAlertEvent(i.org, i.app, operation, event_key, workflow.now(), i.executor_id, dict(details))
        try:
            await workflow.execute_local_activity(start_own_alert, event, start_to_close_timeout=DB_ACTIVITY_TIMEOUT,
                                                  retry_policy=OWN_ALERT_RETRY)
        except FailureError as err:
            # A local activity's failure comes as its own error (an ApplicationError, a TimeoutError), not wrapped
            # in an ActivityError as a remote activity's is.
            cause = err.cause if isinstance(err, ActivityError) else err
            if isinstance(cause, CancelledError):
                raise  # the workflow is being cancelled (removed): not an alert that failed to start
            workflow.logger.warning("%s alert not started (the alerts round starts it): %s", operation, cause)

    async def _db(self, activity: Callable[[A], Awaitable[T]], arg: A) -> T:
        """A database activity (registry, audit, candidate selection), as a local activity: in the worker running
        the workflow, one trip to the database and no round trip through a task queue, so recording HEALTHY costs
        one workflow task instead of three server round trips (the connect-storm benchmark, P3)."""
        return await workflow.execute_local_activity(activity, arg, start_to_close_timeout=DB_ACTIVITY_TIMEOUT,
                                                     retry_policy=DB_RETRY)

    def _patched(self, patch_id: str) -> bool:
        """``workflow.patched``, unless the run's generation already says (``PATCHES_BY_GENERATION``)."""
        return patch_id in PATCHES_BY_GENERATION.get(self._generation, ()) or workflow.patched(patch_id)

    def _describe(self, note: str) -> None:
        """The workflow's current details in the Temporal UI: state, grace deadline, recovery progress."""
        state = self._state
        lines = [f"**{state.status}** — executor `{self._input.executor_id}` of "
                 f"`{self._input.org}/{self._input.app}`, version `{state.app_version}`"]
        if state.status == ExecutorStatus.DISCONNECTED and state.grace_deadline is not None:
            lines.append(f"grace ends {state.grace_deadline.isoformat()}")
        if note:
            lines.append(note)
        workflow.set_current_details("\n\n".join(lines))

    def _event_key(self, operation: str) -> str:
        # workflow.uuid4() is replay-safe, so a retried activity carries the same key and lands once.
        return f"{workflow.info().workflow_id}/{operation}/{workflow.uuid4()}"
