"""The executor lifecycle workflow: one per executor, HEALTHY → DISCONNECTED → HEALTHY or DEAD → recovered.

Signals only change in-memory state; the run loop turns each change into registry writes (activities), so
every status change is ordered by this workflow. Every signal carries the connection id: a ``disconnected``
for a connection that is not the current one is stale (an old socket noticed late) and changes nothing.

One class in three modules: this one holds the signals, the run loop and the way to DEAD (records, the grace);
``workflows/recovery.py`` the fence and the recovery (``RecoverySteps``); ``workflows/lifecycle_base.py`` the
state, the writes and the patches every step shares (``LifecycleBase``).
"""

from __future__ import annotations

import contextlib
from datetime import timedelta

from temporalio import workflow

from workflows.lifecycle_base import Removed
from workflows.lifecycle_generations import (
    GENERATION_3_PATCH,
    GENERATION_4_PATCH,
    GENERATION_5_PATCH,
    GENERATION_6_PATCH,
)
from workflows.recovery import RecoverySteps

with workflow.unsafe.imports_passed_through():
    from workflows.contracts.common import (
        LIFECYCLE_WORKFLOW_TYPE,
        ConnectedSignal,
        DisconnectedSignal,
        ExecutorInfo,
        ExecutorStatus,
    )
    from workflows.contracts.lifecycle import (
        NEW,
        DeleteExecutorInput,
        GetExecutorTimeoutInput,
        GraceStart,
        LifecycleInput,
        LifecycleResult,
        LifecycleState,
        PeerAvailableSignal,
        RecordStatusInput,
        RemovedSignal,
        Signal,
        begin_grace,
        delete_executor,
        disconnect_event_key,
        get_executor_timeout,
    )
    from workflows.contracts.orphans import OrphanInfo
    from workflows.contracts.reconcile import GetRegistryRowInput, get_registry_row

# Dedup keys kept per run; signals are retried within seconds, so a short memory is enough.
SEEN_SIGNAL_IDS_KEPT = 256


@workflow.defn(name=LIFECYCLE_WORKFLOW_TYPE)  # the class's own name, said once for the activities that query by it
class ExecutorLifecycleWorkflow(RecoverySteps):
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
        self._generation = 0  # set first thing in run()

    # -- signals -------------------------------------------------------------------------------------------

    @workflow.signal(name=Signal.CONNECTED)
    def connected(self, signal: ConnectedSignal) -> None:
        if self._duplicate(signal.signal_id):
            return
        self._state.connection = signal
        self._state.disconnect_signal_id = ""  # a new connection: no disconnect of an older one is to be written

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
        self._state.disconnect_signal_id = signal.signal_id

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
        # A new run writes generation 6's marker only. A run started on generation 5's, 4's or 3's code replays
        # that one's: asked for here so that its marker meets a call (Core fails a recorded marker that no call asks
        # for); generation 3's answer is needed by nothing, every branch it stands for being the only one left.
        # Older runs are not replayed (workflows/lifecycle_generations.py).
        if workflow.patched(GENERATION_6_PATCH):
            self._generation = 6
        elif workflow.patched(GENERATION_5_PATCH):
            self._generation = 5
        elif workflow.patched(GENERATION_4_PATCH):
            self._generation = 4
        else:
            workflow.patched(GENERATION_3_PATCH)
            self._generation = 3
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
                    if not await self._confirm_gone():
                        continue
                    result = await self._recover_and_finish(await self._declare_dead())
                    if result is not None:
                        return result
        except Removed:
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
            raise Removed()
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

    async def _remove(self) -> LifecycleResult:
        reason = self._removed.reason if self._removed else "app deleted"
        i = self._input
        await self._db(
            delete_executor,
            DeleteExecutorInput(i.org, i.app, i.executor_id, event_key=self._event_key("removed"),
                                details={"reason": reason, "status": self._state.status}),
        )
        return LifecycleResult(status="REMOVED")

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

    async def _begin_grace(self) -> GraceStart:
        """Record DISCONNECTED with the app's grace in one local activity, under the key its signal names, or found
        written there by the gateway; when the grace began (the row's time) and how long it is.

        One write, not two (the grace read, then the row): the gateway that saw the socket close writes the same row
        under the same key as it signals (``Store.record_disconnect``), so the registry says DISCONNECTED without
        waiting for this workflow's task, and the row lands once. The grace runs from that row's time: the close,
        as the gateway saw it (the fence still gives back any time its gateway was out of contact with Temporal)."""
        state, i = self._state, self._input
        signal_id, state.disconnect_signal_id = state.disconnect_signal_id, ""
        operation = "executor.disconnected"
        key = (disconnect_event_key(i.org, i.app, i.executor_id, signal_id) if signal_id
               else self._event_key(operation))
        details: dict[str, object] = {"connection_id": state.recorded_connection_id}
        if state.orphan:
            details["orphan"] = True
        begun = await self._db(begin_grace, RecordStatusInput(
            i.org, i.app, i.executor_id, ExecutorStatus.DISCONNECTED, operation, event_key=key, details=details,
            disconnected_at=state.disconnected_at))
        if begun is None:  # the app was deleted (a late `connected` started this run): nothing to recover
            self._removed = self._removed or RemovedSignal(signal_id="", reason="app no longer exists")
            raise Removed()
        self._recorded(ExecutorStatus.DISCONNECTED)
        return begun

    async def _grace_expired(self) -> bool:
        """Record DISCONNECTED (once) and wait out the app's grace, but for the fence's lead (``_fence_lead``); True
        when no reconnect came in time."""
        state = self._state
        if state.status != ExecutorStatus.DISCONNECTED or state.grace_deadline is None:
            begun = await self._begin_grace()
            state.grace_deadline = begun.at + begun.grace
            state.grace = begun.grace
            self._describe("")
        ahead = self._fence_lead()  # the fence's probe goes out that long before the grace's end
        remaining = self._grace_left() - ahead
        if remaining <= timedelta(0):
            return True
        try:
            await workflow.wait_condition(
                lambda: state.connection is not None or state.unrecorded is not None or self._removed is not None
                or self._should_continue_as_new(),
                timeout=remaining,
                timeout_summary=f"grace {remaining.total_seconds():g} s"
                                + (f", then the fence's last {ahead.total_seconds():g} s" if ahead else ""),
            )
        except TimeoutError:
            return True
        self._check_removed()
        if state.connection is None and state.unrecorded is None:
            # History is long (a flapping executor): continue mid-grace; the deadline travels with the state.
            await workflow.wait_condition(workflow.all_handlers_finished)
            workflow.continue_as_new(self._next_input(state))
        return False
