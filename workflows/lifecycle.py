"""The executor lifecycle workflow: one per executor, HEALTHY → DISCONNECTED → HEALTHY or DEAD → recovered.

Signals only change in-memory state; the run loop turns each change into registry writes (activities), so
every status change is ordered by this workflow. Every signal carries the connection id: a ``disconnected``
for a connection that is not the current one is stale (an old socket noticed late) and changes nothing.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from workflows.inputs import (
        Activity,
        Candidate,
        ConnectedSignal,
        DeleteExecutorInput,
        DisconnectedSignal,
        DispatchRecoveryInput,
        ExistPendingInput,
        ExistPendingReply,
        GetExecutorTimeoutInput,
        LifecycleInput,
        LifecycleResult,
        LifecycleState,
        RecordStatusInput,
        RecoveryReply,
        SelectCandidateInput,
        WriteAuditInput,
    )

HEALTHY, DISCONNECTED, DEAD, NEW = "HEALTHY", "DISCONNECTED", "DEAD", "NEW"

DB_ACTIVITY_TIMEOUT = timedelta(seconds=30)
# A gateway that vanished never picks the task up: notice it fast instead of waiting out the reply timeout.
SOCKET_SCHEDULE_TO_START = timedelta(seconds=10)
BACKOFF_INITIAL = timedelta(seconds=1)
BACKOFF_MAX = timedelta(seconds=30)
# Dedup keys kept per run; signals are retried within seconds, so a short memory is enough.
SEEN_SIGNAL_IDS_KEPT = 256
# Continue-as-new after this many signals even if the server has not suggested it yet.
SIGNAL_BUDGET = 1000


@workflow.defn
class ExecutorLifecycleWorkflow:
    def __init__(self) -> None:
        self._state = LifecycleState()
        self._signals_this_run = 0
        self._stale_disconnects = 0

    # -- signals -------------------------------------------------------------------------------------------

    @workflow.signal
    def connected(self, signal: ConnectedSignal) -> None:
        if self._duplicate(signal.signal_id):
            return
        self._state.connection = signal

    @workflow.signal
    def disconnected(self, signal: DisconnectedSignal) -> None:
        if self._duplicate(signal.signal_id):
            return
        current = self._state.connection
        if current is None or current.connection_id != signal.connection_id:
            self._stale_disconnects += 1
            return
        self._state.connection = None

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
        self._input = input
        if input.state is not None:
            # Signals may have arrived before this first line ran; keep them on top of the carried state.
            arrived = self._state
            self._state = input.state
            self._state.seen_signal_ids.extend(arrived.seen_signal_ids)
            if arrived.connection is not None:
                self._state.connection = arrived.connection
        while True:
            await workflow.wait_condition(lambda: self._needs_action() or self._should_continue_as_new())
            if not self._needs_action():
                await workflow.wait_condition(workflow.all_handlers_finished)
                workflow.continue_as_new(self._next_input(self._state))
            connection = self._state.connection
            if connection is not None:
                # First connection, a reconnect, or a new connection superseding the recorded one.
                await self._record_healthy(connection)
            elif await self._grace_expired():
                return await self._die_and_recover()

    def _needs_action(self) -> bool:
        state = self._state
        if state.connection is None:
            return state.status == HEALTHY
        return state.status != HEALTHY or state.connection.connection_id != state.recorded_connection_id

    def _should_continue_as_new(self) -> bool:
        return workflow.info().is_continue_as_new_suggested() or self._signals_this_run >= SIGNAL_BUDGET

    def _next_input(self, state: LifecycleState) -> LifecycleInput:
        i = self._input
        return LifecycleInput(i.org, i.app, i.executor_id, state=state, recovery_timeout=i.recovery_timeout)

    async def _record_healthy(self, conn: ConnectedSignal) -> None:
        state = self._state
        operation = {NEW: "executor.healthy", HEALTHY: "executor.superseded"}.get(
            state.status, "executor.reconnected"
        )
        await self._record(
            HEALTHY,
            operation,
            conn=conn,
            details={"connection_id": conn.connection_id, "previous_status": state.status,
                     "source_ip": conn.source_ip},
        )
        state.recorded_connection_id = conn.connection_id
        state.app_version = conn.info.application_version

    async def _grace_expired(self) -> bool:
        """Record DISCONNECTED and wait out the app's grace; True when no reconnect came in time."""
        previous = self._state.recorded_connection_id
        grace: timedelta = await workflow.execute_activity(
            Activity.GET_EXECUTOR_TIMEOUT,
            GetExecutorTimeoutInput(self._input.org, self._input.app),
            result_type=timedelta,
            start_to_close_timeout=DB_ACTIVITY_TIMEOUT,
        )
        await self._record(
            DISCONNECTED,
            "executor.disconnected",
            details={"connection_id": previous, "grace_seconds": grace.total_seconds()},
        )
        try:
            await workflow.wait_condition(
                lambda: self._state.connection is not None,
                timeout=grace,
                timeout_summary=f"grace {grace.total_seconds():g} s",
            )
            return False
        except TimeoutError:
            return True

    async def _die_and_recover(self) -> LifecycleResult:
        await self._record(DEAD, "executor.dead", details={})
        candidate, attempts = await self._recover()
        result = LifecycleResult(status="RECOVERED", recovered_by=candidate.executor_id, attempts=attempts)
        if self._state.connection is not None:
            # It came back while it was being recovered: recovery cannot be taken back, so register it afresh.
            await workflow.wait_condition(workflow.all_handlers_finished)
            fresh = LifecycleState(
                connection=self._state.connection, seen_signal_ids=self._state.seen_signal_ids
            )
            workflow.continue_as_new(self._next_input(fresh))
        return result

    async def _recover(self) -> tuple[Candidate, int]:
        """Dispatch ``recovery`` to a HEALTHY peer of the same version until one confirms it; never give up."""
        i = self._input
        version = self._version()
        backoff = BACKOFF_INITIAL
        failed: list[str] = []
        attempt = 0
        waiting_audited = False
        while True:
            candidate: Candidate | None = await workflow.execute_activity(
                Activity.SELECT_CANDIDATE,
                SelectCandidateInput(i.org, i.app, version, exclude=[i.executor_id, *failed]),
                result_type=Candidate | None,  # type: ignore[arg-type]
                start_to_close_timeout=DB_ACTIVITY_TIMEOUT,
            )
            if candidate is None:
                if failed:
                    failed.clear()  # every peer failed once: try them again after the backoff
                elif not waiting_audited:
                    await self._audit("executor.recovery.waiting", "failure",
                                      {"reason": f"no HEALTHY executor of version {version!r}"})
                    waiting_audited = True
                backoff = await self._backoff(backoff, "no candidate")
                continue
            attempt += 1
            request_id = str(workflow.uuid4())
            details = {"candidate": candidate.executor_id, "attempt": attempt, "request_id": request_id}
            await self._audit("executor.recovery.dispatched", "success", details)
            error = await self._attempt(candidate, request_id, attempt)
            if error is None:
                await self._audit("executor.recovery.succeeded", "success", details)
                await workflow.execute_activity(
                    Activity.DELETE_EXECUTOR,
                    DeleteExecutorInput(i.org, i.app, i.executor_id, event_key=self._event_key("deleted"),
                                        details={"recovered_by": candidate.executor_id}),
                    start_to_close_timeout=DB_ACTIVITY_TIMEOUT,
                )
                return candidate, attempt
            await self._audit("executor.recovery.failed", "failure", {**details, "reason": error})
            failed.append(candidate.executor_id)
            backoff = await self._backoff(backoff, f"after attempt {attempt}")

    async def _attempt(self, candidate: Candidate, request_id: str, attempt: int) -> str | None:
        """One recovery attempt through the candidate's gateway. Returns the failure reason, or None."""
        i = self._input
        options = {
            "task_queue": candidate.gateway_queue,
            "schedule_to_start_timeout": SOCKET_SCHEDULE_TO_START,
            "start_to_close_timeout": i.recovery_timeout + timedelta(seconds=5),
            # Relay's own loop retries, on another peer; the activity itself runs once.
            "retry_policy": RetryPolicy(maximum_attempts=1),
        }
        try:
            reply: RecoveryReply = await workflow.execute_activity(
                Activity.DISPATCH_RECOVERY,
                DispatchRecoveryInput(candidate.executor_id, [i.executor_id], request_id, i.recovery_timeout),
                result_type=RecoveryReply,
                summary=f"recovery via {candidate.executor_id} attempt {attempt}",
                **options,  # type: ignore[arg-type]
            )
            if not reply.success:
                return f"recovery answered success=false: {reply.error_message}"
            confirm: ExistPendingReply = await workflow.execute_activity(
                Activity.EXIST_PENDING_WORKFLOWS,
                ExistPendingInput(candidate.executor_id, i.executor_id, self._version(),
                                  request_id=str(workflow.uuid4()), timeout=i.recovery_timeout),
                result_type=ExistPendingReply,
                summary=f"confirm recovery via {candidate.executor_id}",
                **options,  # type: ignore[arg-type]
            )
        except ActivityError as err:
            return str(err.cause or err)
        if confirm.error_message:
            return f"exist_pending_workflows failed: {confirm.error_message}"
        if confirm.exist:
            return "pending workflows remain after recovery"
        return None

    async def _backoff(self, current: timedelta, why: str) -> timedelta:
        jitter = current * workflow.random().uniform(0, 0.2)
        await workflow.sleep(current + jitter, summary=f"backoff {current.total_seconds():g} s {why}")
        return min(current * 2, BACKOFF_MAX)

    def _version(self) -> str:
        return self._state.app_version

    async def _record(self, status: str, operation: str, *, conn: ConnectedSignal | None = None,
                      details: dict[str, object]) -> None:
        i = self._input
        await workflow.execute_activity(
            Activity.RECORD_STATUS,
            RecordStatusInput(
                i.org, i.app, i.executor_id, status, operation, event_key=self._event_key(operation),
                info=conn.info if conn else None,
                connection_id=conn.connection_id if conn else None,
                gateway_queue=conn.gateway_queue if conn else None,
                details=dict(details),
            ),
            start_to_close_timeout=DB_ACTIVITY_TIMEOUT,
        )
        self._state.status = status

    async def _audit(self, operation: str, status: str, details: dict[str, object]) -> None:
        i = self._input
        await workflow.execute_activity(
            Activity.WRITE_AUDIT,
            WriteAuditInput(i.org, i.app, i.executor_id, operation, self._event_key(operation), status,
                            dict(details)),
            start_to_close_timeout=DB_ACTIVITY_TIMEOUT,
        )

    def _event_key(self, operation: str) -> str:
        # workflow.uuid4() is replay-safe, so a retried activity carries the same key and lands once.
        return f"{workflow.info().workflow_id}/{operation}/{workflow.uuid4()}"
