"""The executor lifecycle workflow: one per executor, HEALTHY → DISCONNECTED → HEALTHY or DEAD → recovered.

Signals only change in-memory state; the run loop turns each change into registry writes (activities), so
every status change is ordered by this workflow. Every signal carries the connection id: a ``disconnected``
for a connection that is not the current one is stale (an old socket noticed late) and changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TypeVar

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, CancelledError, FailureError
from temporalio.workflow import ActivityHandle

from workflows import fence, timing
from workflows.timing import (
    BACKOFF_INITIAL,
    DB_ACTIVITY_TIMEOUT,
    SOCKET_HEARTBEAT_TIMEOUT,
    SOCKET_SCHEDULE_TO_START,
)

with workflow.unsafe.imports_passed_through():
    from workflows.contracts.alerts import OwnAlertEvent, start_own_alert
    from workflows.contracts.common import (
        RELAY_EXECUTOR_STATUS,
        RELAY_ORG,
        Candidate,
        ConnectedSignal,
        DisconnectedSignal,
        ExecutorInfo,
        ExecutorStatus,
    )
    from workflows.contracts.gate import AdmitRecoveryInput, AdmitRecoveryReply, admit_recovery
    from workflows.contracts.gateway_watch import GatewayGoneInput, ProbeGatewayInput, ProbeGatewayReply, gateway_gone
    from workflows.contracts.lifecycle import (
        NEW,
        DeleteExecutorInput,
        DispatchRecoveryInput,
        ExistPendingInput,
        GetExecutorTimeoutInput,
        LifecycleInput,
        LifecycleResult,
        LifecycleState,
        PeerAvailableSignal,
        RecordStatusInput,
        RecoveryReply,
        RemovedSignal,
        SelectCandidateInput,
        Signal,
        WriteAuditInput,
        delete_executor,
        dispatch_recovery,
        exist_pending_workflows,
        get_executor_timeout,
        record_status,
        select_candidate,
        write_audit,
    )
    from workflows.contracts.orphans import OrphanInfo
    from workflows.contracts.reconcile import GetRegistryRowInput, get_registry_row

A = TypeVar("A")
T = TypeVar("T")



class _Removed(Exception):
    """Raised inside the run when a ``removed`` signal ends the workflow's business."""


@dataclass
class _Recovery:
    """One run's progress through a recovery (``_recover``): what its steps read and update."""

    version: str
    admitted: bool  # the gate let it through (or the run predates the gate)
    revival: bool = False  # the last look before a request sees any `connected` (``REVIVAL_PATCH``)
    backoff: timedelta = BACKOFF_INITIAL
    failed: list[str] = field(default_factory=list)  # peers whose attempt failed, tried again once all have
    attempt: int = 0
    blocked: bool = False  # no peer: the blocked row is written once per stretch
    details: dict[str, object] = field(default_factory=dict)  # the current attempt's, for its audit rows

# With no peer of the right version, look again this often at most; a peer becoming HEALTHY wakes it at once.
BLOCKED_RECHECK = timedelta(minutes=5)
# Dedup keys kept per run; signals are retried within seconds, so a short memory is enough.
SEEN_SIGNAL_IDS_KEPT = 256
# Continue-as-new after this many signals even if the server has not suggested it yet.
SIGNAL_BUDGET = 1000
# From this patch on, database activities run as local activities: in the worker running the workflow, one trip
# to the database and no round trip through a task queue, so recording HEALTHY costs one workflow task instead
# of three server round trips (the connect-storm benchmark, P3). Histories recorded before it replay unchanged.
LOCAL_DB_PATCH = "local-db-activities"
# Database activities retry without limit (every write lands once by its event key, so a retry never doubles a
# row), at most this far apart: with Temporal's default (doubling up to 100 s) a 60 s database outage could leave
# a workflow idle for another minute after the database came back. Only the interval is set here: it is not
# part of the history, so histories replay unchanged.
DB_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=5))
# Relay's own loop retries a recovery, on another peer; each socket-bound activity runs once.
ONCE = RetryPolicy(maximum_attempts=1)
# What ``_dispatch`` returns when the executor was back before the request went out.
CALLED_OFF = "called off: the executor is back"
# From this patch on, nothing is declared DEAD, nor recovered, while the gateway that last held the executor
# still holds a live socket for it: that gateway is asked (the fence's probe, on its own task queue) before DEAD
# and again before every recovery request. A missed heartbeat or a late timer means "no news": Temporal itself
# may have been away. Only a gateway that does not pick the probe up in time counts as gone.
FENCE_PATCH = "fence-probe"
# From this patch on, a recovery's first request waits for the app's recovery gate (``core.gate``: an operator's
# pause, the recovery-storm breaker's pacing), asked through a local activity; told to wait, the workflow waits on
# a timer (durable, shown in the UI) and asks again. The gate holds its state in the database, so the workflows of
# many dead executors are paced together.
GATE_PATCH = "recovery-gate"
# From this patch on, the fence looks again right before a recovery request: a `connected` from a newer connection
# that lands while the workflow waits on anything (a probe, the gate, a backoff, a candidate's answer, an audit
# write) calls the recovery off. The request is scheduled in the same workflow task as that last look, and the
# `executor.recovery.dispatched` row is written while it is out; a probe's "gone" no longer hides a `connected`
# that landed while it was waited for, nor overwrites it.
REVIVAL_PATCH = "look-again-before-request"
# From this patch on, a gateway known gone (``core.gateways``: its watch found it gone, it retired, or a successor
# started under its identity) is not probed: it holds no socket, and the probe could only time out.
KNOWN_GONE_PATCH = "known-gone-gateways"
# From this patch on, a run asks ``workflow.patched`` once, for this, instead of once for each of the patches above
# (``PATCHES_IN_GENERATION_1``): each first call in a new run writes a marker and upserts ``TemporalChangeVersion``
# (a visibility write), four of each between the grace's end and DEAD, for an answer that is always "patched" in a
# new run. A run with this marker has them all; one without (started before it) asks for each as it did, so its
# history replays unchanged. A later patch is asked for itself until a next generation lists it.
GENERATION_1_PATCH = "lifecycle-generation-1"
PATCHES_IN_GENERATION_1 = frozenset({LOCAL_DB_PATCH, FENCE_PATCH, GATE_PATCH, REVIVAL_PATCH, KNOWN_GONE_PATCH})
# From this patch on, Relay's own alerts about a recovery go out as they happen: right after the
# `executor.recovery.blocked` row (once per blocked stretch, across continue-as-new), the workflow starts its
# delivery (``start_own_alert``); when the recovery goes ahead (or is called off, the executor back), it writes
# `executor.recovery.unblocked` and starts that alert too (RecoveryUnblocked); and when its admission at the gate
# tripped the storm breaker (the gate wrote that row), the RecoveryBreaker alert. Asked only on those paths: not in
# generation 1.
OWN_ALERTS_PATCH = "own-alerts-at-once"
# Starting an alert's delivery is a local activity calling the client's start_workflow, not a child workflow: one
# marker in this history instead of the child's initiated/started/completed events, which would also wake this
# long-lived workflow when the delivery ends; and the start's id conflict ("already started": delivered) is the
# same one the other writers and the alerts round meet. It is tried a few times only: a recovery never waits on
# an alert, and the alerts round starts any delivery nobody started.
OWN_ALERT_RETRY = RetryPolicy(initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=5),
                              maximum_attempts=3)


@workflow.defn
class ExecutorLifecycleWorkflow:
    @workflow.init
    def __init__(self, input: LifecycleInput) -> None:
        # Signal handlers run before run() does for signals that come with the first task (signal-with-start, or
        # signals sent while the previous run continued-as-new), so the carried state must be in place here.
        self._input = input
        self._state = input.state or LifecycleState()
        self._signals_this_run = 0
        self._stale_disconnects = 0
        self._removed: RemovedSignal | None = None
        self._peer_hint = False
        self._generation_1 = False  # set first thing in run()

    # -- signals -------------------------------------------------------------------------------------------

    @workflow.signal(name=Signal.CONNECTED)
    def connected(self, signal: ConnectedSignal) -> None:
        if self._duplicate(signal.signal_id):
            return
        self._state.connection = signal

    @workflow.signal(name=Signal.DISCONNECTED)
    def disconnected(self, signal: DisconnectedSignal) -> None:
        if self._duplicate(signal.signal_id):
            return
        current = self._state.connection
        if current is None or current.connection_id != signal.connection_id:
            self._stale_disconnects += 1
            return
        if current.connection_id != self._state.recorded_connection_id:
            self._state.unrecorded = current
        self._state.connection = None
        self._state.disconnected_at = signal.at

    @workflow.signal(name=Signal.PEER_AVAILABLE)
    def peer_available(self, signal: PeerAvailableSignal) -> None:
        """A peer became HEALTHY: if recovery is blocked waiting for one, look now. Idempotent, so no dedup."""
        self._peer_hint = True

    @workflow.signal(name=Signal.REMOVED)
    def removed(self, signal: RemovedSignal) -> None:
        """The app was deleted: end now, in whatever state, without recovery."""
        if not self._duplicate(signal.signal_id):
            self._removed = signal

    @workflow.query
    def state(self) -> LifecycleState:
        return self._state

    def _duplicate(self, signal_id: str) -> bool:
        self._signals_this_run += 1
        seen = self._state.seen_signal_ids
        if signal_id in seen:
            return True
        seen.append(signal_id)
        del seen[:-SEEN_SIGNAL_IDS_KEPT]
        return False

    # -- run -----------------------------------------------------------------------------------------------

    @workflow.run
    async def run(self, input: LifecycleInput) -> LifecycleResult:
        self._generation_1 = workflow.patched(GENERATION_1_PATCH)
        try:
            if input.orphan is not None and input.state is None:
                # Started by the orphan sweep (a first run only: a continued run carries its state). With
                # ``orphan`` None nothing here runs, so existing histories replay unchanged.
                await self._begin_orphan(input.orphan)
            if input.reconcile and input.state is None and not await self._begin_reconciled():
                return LifecycleResult(status="NOTHING_TO_RECONCILE")
            while True:
                await workflow.wait_condition(
                    lambda: self._needs_action() or self._should_continue_as_new() or self._removed is not None)
                self._check_removed()
                if not self._needs_action():
                    await workflow.wait_condition(workflow.all_handlers_finished)
                    workflow.continue_as_new(self._next_input(self._state))
                target = self._state.connection or self._state.unrecorded
                if self._state.status == ExecutorStatus.DEAD and not self._state.revived:
                    # Recovery, or a run continued-as-new during recovery.
                    result = await self._recover_and_finish()
                    if result is not None:
                        return result
                    continue  # called off: the executor holds a live socket; record it HEALTHY
                if target is not None and self._unrecorded(target):
                    # First connection, a reconnect, or a new connection superseding the recorded one.
                    self._state.unrecorded = None
                    await self._record_healthy(target)
                elif await self._grace_expired():
                    if self._patched(FENCE_PATCH) and not await self._confirm_gone():
                        continue
                    await self._record(ExecutorStatus.DEAD, "executor.dead", details={})
                    result = await self._recover_and_finish()
                    if result is not None:
                        return result
        except _Removed:
            return await self._remove()

    async def _begin_orphan(self, orphan: OrphanInfo) -> None:
        """An executor id with old PENDING workflows and no registry row (``core.orphans``). It never had a socket
        Relay knows of, so no gateway can be probed for it; instead it gets one grace, the app's
        ``executorTimeoutSecs``, to connect, as any executor that went away does: a process that was in the
        middle of its handshake when the sweep looked is connected well within it (the handshake has 10 s) and
        is then simply recorded HEALTHY. Otherwise it is recorded DEAD (with its version, from the aggregates) and
        the run loop recovers it like any DEAD executor: gate, peer, ``recovery``, confirmation, delete.
        Its ``_still_gone`` checks find no gateway queue to ask, so they count it as gone; a ``connected``
        signal that lands before a request goes out still calls the recovery off."""
        i, state = self._input, self._state
        state.orphan = True
        state.app_version = orphan.app_version
        grace = await self._app_grace()
        await self._audit("executor.orphan.found", "success", {
            "app_version": orphan.app_version, "pending": orphan.pending,
            "oldest_created_at": orphan.oldest_created_at.isoformat() if orphan.oldest_created_at else None,
            "other_versions": orphan.other_versions}, durations={"executorTimeoutSecs": grace})
        self._describe(f"orphan: waiting {grace.total_seconds():g} s for it to connect before recovering it")
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(
                lambda: state.connection is not None or state.unrecorded is not None or self._removed is not None,
                timeout=grace, timeout_summary=f"orphan grace {grace.total_seconds():g} s")
        self._check_removed()
        if state.connection is not None or state.unrecorded is not None:
            return  # alive after all: the run loop records it HEALTHY
        # Deleting the app signals only executors with a registry row, which an orphan does not have yet: look.
        await self._app_grace()
        await self._record(ExecutorStatus.DEAD, "executor.dead", details={"reason": "orphan"},
                           info=ExecutorInfo(i.executor_id, application_version=orphan.app_version))

    async def _begin_reconciled(self) -> bool:
        """Started by the reconciliation for a registry row with no lifecycle workflow running: Temporal's state was
        lost (or restored from an older backup), or the workflow was terminated by hand. The row is read back now,
        when this is the only workflow that can write it (a row read by the round before could be stale), and the
        run carries on from it; False when there is no row any more (the workflow it had ended meanwhile).

        - HEALTHY: the gateway the row names is asked (the fence's probe). A live socket is the connection now; none,
          or the gateway gone, and the run loop makes the executor DISCONNECTED now, its grace starting now.
        - DISCONNECTED: the run loop records it anew, with a full grace from now: whatever ran of the old one,
          Relay could not hear a reconnect during the gap.
        - DEAD: its recovery resumes, through the gate and the fence as always.

        Nothing here is recorded before the audit row says what was found: ``executor.reconciled``."""
        i, state = self._input, self._state
        row = await self._db(get_registry_row, GetRegistryRowInput(i.org, i.app, i.executor_id))
        if row is None:
            return False
        state.status = row.status
        state.app_version = row.app_version
        state.gateway_queue = row.gateway_queue
        state.recorded_connection_id = row.connection_id or None
        if row.status == ExecutorStatus.HEALTHY:
            reply = await self._probe()
            if self._back():
                outcome = "connected meanwhile"
            elif reply is not None and reply.connection is not None:
                state.connection = reply.connection
                outcome = "its gateway holds a live socket"
            else:
                outcome = ("no socket: DISCONNECTED now, a full grace from now" if reply is not None
                           else "its gateway is gone: DISCONNECTED now, a full grace from now")
        elif row.status == ExecutorStatus.DISCONNECTED:
            outcome = "a full grace from now"
        else:
            outcome = "its recovery resumes"
        await self._audit("executor.reconciled", "success", {
            "found": row.status, "gateway_queue": row.gateway_queue, "connection_id": row.connection_id,
            "outcome": outcome})
        self._describe(f"reconciled from the registry: {outcome}")
        return True

    async def _app_grace(self) -> timedelta:
        """The app's grace; ends the run (``_Removed``) when the app no longer exists."""
        grace = await self._db(get_executor_timeout, GetExecutorTimeoutInput(self._input.org, self._input.app))
        if grace is None:
            self._removed = self._removed or RemovedSignal(signal_id="", reason="app no longer exists")
            raise _Removed()
        return grace

    def _unrecorded(self, conn: ConnectedSignal) -> bool:
        return self._state.status != ExecutorStatus.HEALTHY or conn.connection_id != self._state.recorded_connection_id

    def _needs_action(self) -> bool:
        state = self._state
        target = state.connection or state.unrecorded
        if state.status == ExecutorStatus.DEAD or (target is not None and self._unrecorded(target)):
            return True
        # HEALTHY with no connection: a grace to start. DISCONNECTED: a grace to resume after continue-as-new.
        return state.connection is None and state.status in (ExecutorStatus.HEALTHY, ExecutorStatus.DISCONNECTED)

    def _check_removed(self) -> None:
        if self._removed is not None:
            raise _Removed()

    async def _unless_removed(self, work: Awaitable[T]) -> T:
        """Await ``work``, abandoning it (cancelled) if a ``removed`` signal comes first."""
        task = asyncio.ensure_future(work)
        removal = asyncio.ensure_future(workflow.wait_condition(lambda: self._removed is not None))
        await workflow.wait([task, removal], return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            removal.cancel()
            return task.result()
        task.cancel()
        task.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: no "never retrieved" noise
        raise _Removed()

    async def _remove(self) -> LifecycleResult:
        reason = self._removed.reason if self._removed else "app deleted"
        i = self._input
        await self._db(
            delete_executor,
            DeleteExecutorInput(i.org, i.app, i.executor_id, event_key=self._event_key("removed"),
                                details={"reason": reason, "status": self._state.status}),
        )
        return LifecycleResult(status="REMOVED")

    def _should_continue_as_new(self) -> bool:
        return workflow.info().is_continue_as_new_suggested() or self._signals_this_run >= SIGNAL_BUDGET

    def _next_input(self, state: LifecycleState) -> LifecycleInput:
        i = self._input
        return LifecycleInput(i.org, i.app, i.executor_id, state=state, recovery_timeout=i.recovery_timeout,
                              probe_timeout=i.probe_timeout)

    async def _record_healthy(self, conn: ConnectedSignal) -> None:
        state = self._state
        operation = {NEW: "executor.healthy", ExecutorStatus.HEALTHY: "executor.superseded"}.get(
            state.status, "executor.reconnected"
        )
        await self._record(
            ExecutorStatus.HEALTHY,
            operation,
            conn=conn,
            details={"connection_id": conn.connection_id, "previous_status": state.status,
                     "source_ip": conn.source_ip},
        )
        state.recorded_connection_id = conn.connection_id
        state.orphan = False  # seen alive: from now on an executor like any other
        state.app_version = conn.info.application_version
        state.gateway_queue = conn.gateway_queue
        state.grace_deadline = None
        if state.unrecorded is not None and state.unrecorded.connection_id == conn.connection_id:
            # It went away while being recorded: the disconnect handler could not know it was about to be
            # recorded. It is recorded now; the loop goes on to its grace, not to a second "reconnected".
            state.unrecorded = None

    async def _grace_expired(self) -> bool:
        """Record DISCONNECTED (once) and wait out the app's grace; True when no reconnect came in time."""
        state = self._state
        if state.status != ExecutorStatus.DISCONNECTED or state.grace_deadline is None:
            grace = await self._db(get_executor_timeout, GetExecutorTimeoutInput(self._input.org, self._input.app))
            if grace is None:  # the app was deleted (a late `connected` started this run): nothing to recover
                self._removed = self._removed or RemovedSignal(signal_id="", reason="app no longer exists")
                raise _Removed()
            await self._record(
                ExecutorStatus.DISCONNECTED,
                "executor.disconnected",
                details={"connection_id": state.recorded_connection_id},
                durations={"executorTimeoutSecs": grace},
            )
            state.grace_deadline = workflow.now() + grace
            state.grace = grace
            self._describe("")
        remaining = state.grace_deadline - workflow.now()
        if remaining <= timedelta(0):
            return True
        try:
            await workflow.wait_condition(
                lambda: state.connection is not None or state.unrecorded is not None or self._removed is not None
                or self._should_continue_as_new(),
                timeout=remaining,
                timeout_summary=f"grace {remaining.total_seconds():g} s",
            )
        except TimeoutError:
            return True
        self._check_removed()
        if state.connection is None and state.unrecorded is None:
            # History is long (a flapping executor): continue mid-grace; the deadline travels with the state.
            await workflow.wait_condition(workflow.all_handlers_finished)
            workflow.continue_as_new(self._next_input(state))
        return False

    async def _confirm_gone(self) -> bool:
        """The fence, once the grace is over: True when the executor is gone; False when its gateway still holds
        its socket (it is HEALTHY again) or owes it more grace (its gateway regained contact with Temporal late)."""
        state = self._state
        if self._back():
            return False  # a `connected` came with the timer
        reply = await self._probe()
        if self._patched(REVIVAL_PATCH) and self._back():
            return False  # a `connected` landed while the probe was out: newer than whatever the probe says
        if reply is None:
            return True
        if reply.connection is not None:
            await self._audit("executor.fenced", "success", {
                "stage": "before DEAD", "gateway_queue": state.gateway_queue,
                "connection_id": reply.connection.connection_id})
            state.connection = reply.connection
            return False
        # Time Relay could not hear does not count: the grace runs from the later of the close and the moment the
        # gateway regained contact with Temporal (its `disconnected` may have been held back until then).
        regained = workflow.now() - reply.contact_for
        if state.grace is not None and regained + state.grace > workflow.now():
            state.grace_deadline = regained + state.grace
            await self._audit("executor.grace.extended", "success", {
                "gateway_queue": state.gateway_queue, "contact_regained_at": regained.isoformat(),
                "grace_ends": state.grace_deadline.isoformat()}, durations={"executorTimeoutSecs": state.grace})
            self._describe("")
            return False
        return True

    async def _probe(self) -> ProbeGatewayReply | None:
        """Ask the gateway that last held the executor about its socket; None when that gateway is gone (known gone,
        or it did not pick the probe up within ``probe_timeout``) or was never known."""
        i, queue = self._input, self._state.gateway_queue
        if not queue:
            return None
        if self._patched(KNOWN_GONE_PATCH) and (await self._db(gateway_gone, GatewayGoneInput(queue))).gone:
            return None
        return await fence.probe(queue, ProbeGatewayInput(i.org, i.app, i.executor_id), timeout=i.probe_timeout)

    async def _still_gone(self) -> bool:
        """Right before a recovery request goes out: False (and recovery called off) when the executor is back."""
        state = self._state
        revival = self._patched(REVIVAL_PATCH)
        if not (self._back() if revival else state.connection is not None):
            reply = await self._probe()
            if not (revival and self._back()):  # a `connected` that landed meanwhile outranks the probe's answer
                if reply is None or reply.connection is None:
                    return True
                state.connection = reply.connection
        await self._call_off()
        return False

    async def _call_off(self) -> None:
        """No request went out and the executor is back: recovery is called off; the run loop records it."""
        state = self._state
        back = state.connection or state.unrecorded
        assert back is not None
        await self._audit("executor.recovery.cancelled", "success", {
            "reason": "the executor holds a live socket", "gateway_queue": back.gateway_queue,
            "connection_id": back.connection_id})
        state.revived = True

    def _back(self) -> bool:
        """A `connected` landed since the executor was last recorded gone (its connection may have closed again
        before the run loop recorded it: ``unrecorded``). Either way the process is alive: no recovery for it."""
        return self._state.connection is not None or self._state.unrecorded is not None

    async def _recover_and_finish(self) -> LifecycleResult | None:
        """Recover, then end; None when recovery was called off because the executor is alive after all."""
        recovered = await self._unless_removed(self._recover())
        if recovered is None:
            await self._unblocked("recovery called off: the executor is back")
            return None
        candidate, attempts = recovered
        result = LifecycleResult(status="RECOVERED", recovered_by=candidate.executor_id, attempts=attempts)
        if self._state.connection is not None:
            # It came back while it was being recovered: recovery cannot be taken back, so register it afresh.
            await workflow.wait_condition(workflow.all_handlers_finished)
            fresh = LifecycleState(
                connection=self._state.connection, seen_signal_ids=self._state.seen_signal_ids
            )
            workflow.continue_as_new(self._next_input(fresh))
        return result

    async def _recover(self) -> tuple[Candidate, int] | None:
        """Recover until a peer confirms it, never giving up while the app exists; None when called off before a
        request went out (the executor holds a live socket after all). The README's story, step by step: the gate
        admits (``_admitted``), a peer is found or waited for (``_peer``), the fence looks again (``_still_gone``),
        the request goes out and is confirmed (``_dispatch_and_confirm``); a failure backs off, tries another."""
        fenced = self._patched(FENCE_PATCH)
        run = _Recovery(version=self._version(), admitted=not self._patched(GATE_PATCH))
        run.revival = fenced and self._patched(REVIVAL_PATCH)
        back = self._back if run.revival else lambda: fenced and self._state.connection is not None
        while True:
            await self._continue_as_new_if_long()
            if back() and not await self._still_gone():
                return None  # it came back before any request went out (a wait for a peer, or a backoff)
            if not run.admitted:
                run.admitted = await self._admitted(back)
                continue  # after a wait: look again for continue-as-new and a revived executor
            candidate = await self._peer(run, back)
            if candidate is None:
                continue  # after a wait for a peer, or a backoff: look again
            if fenced and not await self._still_gone():
                return None
            error = await self._dispatch_and_confirm(candidate, run)
            if error is CALLED_OFF:
                return None
            if error is None:
                await self._recovered(candidate, run.details)
                return candidate, run.attempt
            await self._audit("executor.recovery.failed", "failure", {**run.details, "reason": error})
            run.failed.append(candidate.executor_id)
            run.backoff = await timing.backoff(run.backoff, f"after attempt {run.attempt}")

    async def _continue_as_new_if_long(self) -> None:
        """A long wait for a peer must not grow history without bound: the next run resumes recovery."""
        if self._should_continue_as_new():
            await workflow.wait_condition(workflow.all_handlers_finished)
            workflow.continue_as_new(self._next_input(self._state))

    async def _peer(self, run: _Recovery, back: Callable[[], bool]) -> Candidate | None:
        """A HEALTHY peer of the dead executor's version, claimed for this recovery; None after waiting for one (no
        peer: blocked until one connects) or backing off (every peer failed once: all are tried again)."""
        i = self._input
        self._peer_hint = False
        candidate = await self._db(
            select_candidate,
            SelectCandidateInput(i.org, i.app, run.version, exclude=[i.executor_id, *run.failed],
                                 dead_executor_id=i.executor_id),
        )
        if candidate is not None:
            run.blocked = False
        elif run.failed:
            run.failed.clear()
            run.backoff = await timing.backoff(run.backoff, "every peer failed once")
        else:
            await self._blocked(run, back)
        return candidate

    async def _blocked(self, run: _Recovery, back: Callable[[], bool]) -> None:
        """No peer of the version: alert once per blocked stretch (the workflow's details say so for as long as it
        lasts), then wait for a peer to become HEALTHY (its ``peer_available``), the executor to come back, or the
        recheck."""
        if not run.blocked:
            reason = f"no HEALTHY executor of version {run.version!r}"
            key = await self._audit("executor.recovery.blocked", "failure", {"reason": reason})
            self._describe(f"**recovery blocked**: {reason}; waiting for one to connect")
            run.blocked = True
            if self._state.blocked_since is None and self._patched(OWN_ALERTS_PATCH):
                self._state.blocked_since = workflow.now()
                await self._own_alert("executor.recovery.blocked", key, {"reason": reason})
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(lambda: self._peer_hint or back(), timeout=BLOCKED_RECHECK,
                                          timeout_summary="waiting for a HEALTHY peer")

    async def _dispatch_and_confirm(self, candidate: Candidate, run: _Recovery) -> str | None:
        """One attempt via ``candidate``: the request, its answer and the confirmation. The failure reason, None on
        success, or ``CALLED_OFF`` (the executor was back before the request went out)."""
        await self._unblocked(f"a HEALTHY executor of version {run.version!r} is there: recovery goes ahead via "
                              f"{candidate.executor_id}", candidate=candidate.executor_id)
        run.attempt += 1
        request_id = str(workflow.uuid4())
        run.details = {"candidate": candidate.executor_id, "attempt": run.attempt, "request_id": request_id}
        if candidate.cross_version:
            run.details.update(cross_version=True, candidate_version=candidate.app_version,
                               note="current SDKs recover only their own version's workflows; confirmation "
                                    "may keep failing")
        self._describe(f"recovery via `{candidate.executor_id}`, attempt {run.attempt}")
        if run.revival:
            return await self._dispatch(candidate, request_id, run.attempt, run.details)
        await self._audit("executor.recovery.dispatched", "success", run.details)
        return await self._attempt(candidate, run.attempt, self._request(candidate, request_id, run.attempt))

    async def _recovered(self, candidate: Candidate, details: dict[str, object]) -> None:
        """Confirmed: the audit row, then the dead executor's registry row deleted."""
        i = self._input
        await self._audit("executor.recovery.succeeded", "success", details)
        await self._db(
            delete_executor,
            DeleteExecutorInput(i.org, i.app, i.executor_id, event_key=self._event_key("deleted"),
                                details={"recovered_by": candidate.executor_id}),
        )

    async def _dispatch(self, candidate: Candidate, request_id: str, attempt: int,
                        details: dict[str, object]) -> str | None:
        """The last look, then the request: the failure reason, None on success, or ``CALLED_OFF``.

        Nothing is awaited between the look and scheduling the request, so a `connected` that lands before the
        request is out is always seen (whatever came before: a probe, the gate, a candidate's answer). The
        `dispatched` row is written while the request is out."""
        if self._back():
            await self._call_off()
            return CALLED_OFF
        request = self._request(candidate, request_id, attempt)
        try:
            await self._audit("executor.recovery.dispatched", "success", details)
        except BaseException:
            request.cancel()  # removed (or cancelled) meanwhile: the request goes with the workflow
            raise
        return await self._attempt(candidate, attempt, request)

    async def _admitted(self, back: Callable[[], bool]) -> bool:
        """Ask the recovery gate; True: go. Otherwise wait until it says to ask again (or the executor is back),
        then False. A pause lifted early is seen at the next ask: the gate makes a paused recovery ask at least
        every ``RELAY_RECOVERY_PAUSE_RECHECK_SECS``, so no signal is needed and none can be lost."""
        i, state = self._input, self._state
        if not state.gate_ticket:
            state.gate_ticket = str(workflow.uuid4())
        ask = AdmitRecoveryInput(i.org, i.app, i.executor_id, state.gate_ticket, now=workflow.now(),
                                 event_key=f"{workflow.info().workflow_id}/gate/{state.gate_ticket}")
        reply: AdmitRecoveryReply = await workflow.execute_local_activity(
            admit_recovery, ask, start_to_close_timeout=DB_ACTIVITY_TIMEOUT, retry_policy=DB_RETRY)
        if reply.tripped and self._patched(OWN_ALERTS_PATCH):  # this admission tripped the storm breaker
            await self._own_alert("app.recovery.breaker_tripped", reply.tripped, dict(reply.storm))
        if reply.go or reply.until is None:
            return True
        wait = reply.until - workflow.now()
        self._describe(f"**recovery held** ({reply.reason}) until {reply.until.isoformat()}")
        if wait > timedelta(0):
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(back, timeout=wait, timeout_summary=f"recovery held: {reply.reason}")
        return False

    def _request(self, candidate: Candidate, request_id: str, attempt: int) -> ActivityHandle[RecoveryReply]:
        """Schedule the ``recovery`` request through the candidate's gateway (in this workflow task)."""
        i = self._input
        return workflow.start_activity(
            dispatch_recovery,
            DispatchRecoveryInput(candidate.executor_id, [i.executor_id], request_id, i.recovery_timeout,
                                  org=i.org, app=i.app),
            task_queue=candidate.gateway_queue, retry_policy=ONCE,
            schedule_to_start_timeout=SOCKET_SCHEDULE_TO_START, start_to_close_timeout=self._socket_timeout(),
            heartbeat_timeout=SOCKET_HEARTBEAT_TIMEOUT,
            summary=f"recovery via {candidate.executor_id} attempt {attempt}",
        )

    def _socket_timeout(self) -> timedelta:
        return self._input.recovery_timeout + timedelta(seconds=5)

    async def _attempt(self, candidate: Candidate, attempt: int, request: ActivityHandle[RecoveryReply]
                       ) -> str | None:
        """One recovery attempt, its request already out: its answer, then the confirmation. Returns the failure
        reason, or None."""
        i = self._input
        try:
            reply = await request
            if not reply.success:
                return f"recovery answered success=false: {reply.error_message}"
            confirm = await workflow.execute_activity(
                exist_pending_workflows,
                ExistPendingInput(candidate.executor_id, i.executor_id, self._version(),
                                  request_id=str(workflow.uuid4()), timeout=i.recovery_timeout, org=i.org, app=i.app),
                task_queue=candidate.gateway_queue, retry_policy=ONCE,
                schedule_to_start_timeout=SOCKET_SCHEDULE_TO_START, start_to_close_timeout=self._socket_timeout(),
                heartbeat_timeout=SOCKET_HEARTBEAT_TIMEOUT,
                summary=f"confirm recovery via {candidate.executor_id}",
            )
        except ActivityError as err:
            if isinstance(err.cause, CancelledError):
                raise  # the workflow is being cancelled, not the attempt failing: do not retry on another peer
            return str(err.cause or err)
        if confirm.error_message:
            return f"exist_pending_workflows failed: {confirm.error_message}"
        if confirm.exist:
            return "pending workflows remain after recovery"
        return None

    def _version(self) -> str:
        return self._state.app_version

    async def _record(self, status: ExecutorStatus, operation: str, *, conn: ConnectedSignal | None = None,
                      details: dict[str, object], durations: dict[str, timedelta] | None = None,
                      info: ExecutorInfo | None = None) -> None:
        i = self._input
        if self._state.orphan:
            details = {**details, "orphan": True}
        await self._db(
            record_status,
            RecordStatusInput(
                i.org, i.app, i.executor_id, status, operation, event_key=self._event_key(operation),
                info=conn.info if conn else info,
                connection_id=conn.connection_id if conn else None,
                gateway_queue=conn.gateway_queue if conn else None,
                details=dict(details),
                durations=dict(durations or {}),
                connected_at=conn.at if conn else None,
                grace_deadline=self._state.grace_deadline if status == ExecutorStatus.DEAD else None,
                disconnected_at=self._state.disconnected_at if status == ExecutorStatus.DISCONNECTED else None,
            ),
        )
        self._state.status = status
        self._state.revived = False
        self._state.gate_ticket = ""  # a death after this one asks the gate anew
        self._describe("")
        if workflow.info().typed_search_attributes.get(RELAY_ORG) is not None:
            # Started by a gateway with Relay's attributes (registered on the server): keep the status findable.
            workflow.upsert_search_attributes([RELAY_EXECUTOR_STATUS.value_set(status.value)])

    async def _audit(self, operation: str, status: str, details: dict[str, object], *,
                     durations: dict[str, timedelta] | None = None) -> str:
        """Write an audit row; its event key."""
        i = self._input
        if self._state.orphan:
            details = {**details, "orphan": True}
        key = self._event_key(operation)
        await self._db(
            write_audit,
            WriteAuditInput(i.org, i.app, i.executor_id, operation, key, status, dict(details),
                            dict(durations or {})),
        )
        return key

    async def _unblocked(self, outcome: str, *, candidate: str | None = None) -> None:
        """The end of a blocked stretch whose RecoveryBlocked alert went out (``blocked_since``, set only since
        ``OWN_ALERTS_PATCH``): audited, and its RecoveryUnblocked alert started. Nothing otherwise."""
        since = self._state.blocked_since
        if since is None or not self._patched(OWN_ALERTS_PATCH):
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
        """A database activity (registry, audit, candidate selection): local since ``LOCAL_DB_PATCH``."""
        if self._patched(LOCAL_DB_PATCH):
            return await workflow.execute_local_activity(activity, arg, start_to_close_timeout=DB_ACTIVITY_TIMEOUT,
                                                         retry_policy=DB_RETRY)
        return await workflow.execute_activity(activity, arg, start_to_close_timeout=DB_ACTIVITY_TIMEOUT,
                                               retry_policy=DB_RETRY)

    def _patched(self, patch_id: str) -> bool:
        """``workflow.patched``, unless the run's generation already says (``GENERATION_1_PATCH``)."""
        return (self._generation_1 and patch_id in PATCHES_IN_GENERATION_1) or workflow.patched(patch_id)

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
