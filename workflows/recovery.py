"""The recovery of a DEAD executor, step by step as docs/pages/concepts/recovery.md tells it, and the fence around it.

The fence (``_confirm_gone`` before DEAD, ``_still_gone`` and ``_dispatch``'s last look before every request) asks
the gateway that last held the executor, and calls recovery off when the executor is back. The recovery
(``_recover``) waits for the gate (``_admitted``), a peer (``_peer``, ``_blocked``), then sends the request and
confirms it (``_dispatch_and_confirm``, ``_attempt``) and deletes the dead executor's row (``_recovered``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, CancelledError
from temporalio.workflow import ActivityHandle

from workflows import fence, timing
from workflows.lifecycle_base import (
    CONFIRM_WITH_REQUEST_PATCH,
    DB_RETRY,
    DEAD_IN_ONE_STEP_PATCH,
    DISPATCHED_BY_GATEWAY_PATCH,
    LAST_LOOK_BY_THE_SENDER_PATCH,
    RECOVERED_IN_ONE_WRITE_PATCH,
    Abandoned,
    LifecycleBase,
)
from workflows.timing import (
    BACKOFF_INITIAL,
    DB_ACTIVITY_TIMEOUT,
    FENCE_LEAD,
    SOCKET_HEARTBEAT_TIMEOUT,
    SOCKET_SCHEDULE_TO_START,
)

with workflow.unsafe.imports_passed_through():
    from workflows.contracts.common import Candidate, ExecutorStatus
    from workflows.contracts.gate import AdmitRecoveryInput, AdmitRecoveryReply, admit_recovery
    from workflows.contracts.gateway_watch import (
        GatewayGoneInput,
        GatewayGoneReply,
        ProbeGatewayInput,
        ProbeGatewayReply,
        gateway_gone,
    )
    from workflows.contracts.lifecycle import (
        DeclaredDead,
        DeclareDeadInput,
        DeleteExecutorInput,
        DispatchRecoveryInput,
        ExistPendingInput,
        LifecycleResult,
        LifecycleState,
        RecoveryReply,
        SelectCandidateInput,
        WriteAuditInput,
        declare_dead,
        delete_executor,
        dispatch_recovery,
        exist_pending_workflows,
        select_candidate,
        write_audit,
    )



@dataclass
class _Recovery:
    """One run's progress through a recovery (``_recover``): what its steps read and update."""

    version: str
    admitted: bool = False  # the gate let it through
    backoff: timedelta = BACKOFF_INITIAL
    failed: list[str] = field(default_factory=list)  # peers whose attempt failed, tried again once all have
    attempt: int = 0
    blocked: bool = False  # no peer: the blocked row is written once per stretch
    details: dict[str, object] = field(default_factory=dict)  # the current attempt's, for its audit rows
    # ``declare_dead``'s answers, for the steps right after it; dropped at the first wait, after which each step asks.
    declared: DeclaredDead | None = None

# With no peer of the right version, look again this often at most; a peer becoming HEALTHY wakes it at once.

BLOCKED_RECHECK = timedelta(minutes=5)
# Relay's own loop retries a recovery, on another peer; each socket-bound activity runs once.
ONCE = RetryPolicy(maximum_attempts=1)
# What ``_dispatch`` returns when the executor was back before the request went out.
CALLED_OFF = "called off: the executor is back"


class RecoverySteps(LifecycleBase):
    """The fence and the recovery: the lifecycle workflow's steps from the grace's end to the deletion."""

    async def _confirm_gone(self) -> bool:
        """The fence, once the grace is over: True when the executor is gone; False when its gateway still holds
        its socket (it is HEALTHY again) or owes it more grace (its gateway regained contact with Temporal late)."""
        state = self._state
        if self._back():
            return False  # a `connected` came with the timer
        try:
            reply = await self._unless(self._probe_at_grace_end(), self._back)
        except Abandoned:
            return False  # back before the grace ended: the probe's answer no longer matters
        if self._back():
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

    def _fence_lead(self) -> timedelta:
        """How long before the grace's end the fence is asked (``_probe_at_grace_end``): ``FENCE_LEAD``, at most half
        the grace. The probe's round trip (a workflow task, the gateway's pick-up, another workflow task) then runs
        inside the grace instead of after it: in a burst of deaths that round trip was most of DEAD's lateness."""
        grace = self._state.grace
        return FENCE_LEAD if grace is None else min(FENCE_LEAD, grace / 2)

    def _grace_left(self) -> timedelta:
        """What is left of the grace by this workflow's clock: negative once it has ended, zero when none runs."""
        deadline = self._state.grace_deadline
        return timedelta(0) if deadline is None else deadline - workflow.now()

    async def _probe(self, *, at_grace_end: bool = False, known: GatewayGoneReply | None = None
                     ) -> ProbeGatewayReply | None:
        """Ask the gateway that last held the executor about its socket (``at_grace_end``: as of the grace's end);
        None when that gateway is gone (known gone, or it did not pick the probe up within ``probe_timeout``) or was
        never known. ``known``: whether it is known gone, asked just now (``declare_dead``)."""
        i, queue = self._input, self._state.gateway_queue
        if not queue:
            return None
        if known is None:  # a gateway known gone (``core.gateways``) holds no socket: a probe could only time out
            known = await self._db(gateway_gone, GatewayGoneInput(queue))
        if known.gone:
            return None
        answer_at = self._state.grace_deadline if at_grace_end else None
        hold = max(self._grace_left(), timedelta(0)) if at_grace_end else timedelta(0)
        return await fence.probe(queue, ProbeGatewayInput(i.org, i.app, i.executor_id, answer_at=answer_at),
                                 timeout=i.probe_timeout, hold=hold)

    async def _probe_at_grace_end(self) -> ProbeGatewayReply | None:
        """The fence's probe, asked ahead of the grace's end (``_fence_lead``): the gateway looks when the
        grace ends, or answers when the socket appears. An answer that came sooner says nothing of the grace's end
        (the gateway is gone or known gone, or is older code that answers at once): the grace is waited out, and an
        older gateway asked again then. Never returns before the grace's end by this workflow's clock."""
        if self._grace_left() <= timedelta(0):
            return await self._probe()
        self._describe(f"the fence: asking `{self._state.gateway_queue}` for its answer at the grace's end")
        reply = await self._probe(at_grace_end=True)
        if reply is not None and reply.connection is not None:
            return reply  # the socket is back: no need to wait for the grace's end
        left = self._grace_left()
        if left > timedelta(0):  # the gateway's clock ahead of Temporal's, or no held answer: the grace first
            await workflow.sleep(left, summary="the rest of the grace")
        if reply is not None and not reply.held:
            return await self._probe()
        return reply

    async def _still_gone(self, known: GatewayGoneReply | None = None) -> bool:
        """Right before a recovery request goes out: False (and recovery called off) when the executor is back.
        ``known``: whether its gateway is known gone, asked just now (``declare_dead``)."""
        state = self._state
        if not self._back():
            reply = await self._probe(known=known)
            if not self._back():  # a `connected` that landed meanwhile outranks the probe's answer
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

    async def _declare_dead(self) -> DeclaredDead | None:
        """Record DEAD. Since ``DEAD_IN_ONE_STEP_PATCH`` in one local activity with the recovery's first steps (the
        gate, a peer, the gateway known gone), whose answers ``_recover`` takes up; None before it."""
        if not self._patched(DEAD_IN_ONE_STEP_PATCH):
            await self._record(ExecutorStatus.DEAD, "executor.dead", details={})
            return None
        i, state = self._input, self._state
        self._peer_hint = False  # the peer is looked for now: a peer that connects after this wakes a blocked wait
        state.gate_ticket = ""  # a new death: the gate is asked about it anew (as ``_recorded`` has it)
        ask = self._admission_ask()
        declared: DeclaredDead = await self._db(declare_dead, DeclareDeadInput(
            self._status_input(ExecutorStatus.DEAD, "executor.dead", details={}), ask,
            SelectCandidateInput(i.org, i.app, self._version(), exclude=[i.executor_id],
                                 dead_executor_id=i.executor_id, prefer_gateway=state.gateway_queue),
            gateway_queue=state.gateway_queue))
        self._recorded(ExecutorStatus.DEAD)
        state.gate_ticket = ask.ticket
        return declared

    async def _recover_and_finish(self, declared: DeclaredDead | None = None) -> LifecycleResult | None:
        """Recover, then end; None when recovery was called off because the executor is alive after all.
        ``declared``: ``declare_dead``'s answers, when DEAD was just recorded with them."""
        recovered = await self._unless_removed(self._recover(declared))
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

    async def _recover(self, declared: DeclaredDead | None = None) -> tuple[Candidate, int] | None:
        """Recover until a peer confirms it, never giving up while the app exists; None when called off before a
        request went out (the executor holds a live socket after all). The story of docs/pages/concepts/recovery.md,
        step by step: the gate admits (``_admitted``), a peer is found or waited for (``_peer``), the fence looks again
        (``_still_gone``), the request goes out and is confirmed (``_dispatch_and_confirm``); a failure backs off, tries
        another. ``declared``: the first steps' answers, asked with DEAD (``declare_dead``), taken up in place of
        asking."""
        run = _Recovery(version=self._version(), declared=declared)
        back = self._back
        while True:
            await self._continue_as_new_if_long()
            if back() and not await self._still_gone():
                return None  # it came back before any request went out (a wait for a peer, or a backoff)
            if not run.admitted:
                run.admitted = await self._admitted(back, run.declared.admission if run.declared else None)
                if not run.admitted:
                    run.declared = None  # it waited: from here on each step is asked
                continue  # after a wait: look again for continue-as-new and a revived executor
            candidate = await self._peer(run, back)
            if candidate is None:
                continue  # after a wait for a peer, or a backoff: look again
            known, run.declared = (run.declared.gateway_gone if run.declared else None), None
            look = self._sender_looks(candidate, run, known)
            if not look and not await self._still_gone(known):
                return None
            error = await self._dispatch_and_confirm(candidate, run, look=look)
            if error is CALLED_OFF:
                return None
            if error is None:
                await self._recovered(candidate, run.details)
                return candidate, run.attempt
            await self._audit("executor.recovery.failed", "failure", {**run.details, "reason": error})
            run.failed.append(candidate.executor_id)
            run.backoff = await timing.backoff(run.backoff, f"after attempt {run.attempt}")

    def _sender_looks(self, candidate: Candidate, run: _Recovery, known: GatewayGoneReply | None) -> bool:
        """Whether the fence's last look is the request's own (``LAST_LOOK_BY_THE_SENDER_PATCH``): the peer is on the
        dead executor's last gateway, which looks for its socket as it picks the request up, later than a probe
        would and in the same place. Only on a recovery's first attempt, with the gateway not known gone and the
        executor not back; the patch is asked last, so a run of an older generation writes its marker only here."""
        queue = self._state.gateway_queue
        return (run.attempt == 0 and bool(queue) and candidate.gateway_queue == queue
                and not (known is not None and known.gone) and not self._back()
                and self._patched(LAST_LOOK_BY_THE_SENDER_PATCH))

    async def _peer(self, run: _Recovery, back: Callable[[], bool]) -> Candidate | None:
        """A HEALTHY peer of the dead executor's version, claimed for this recovery; None after waiting for one (no
        peer: blocked until one connects) or backing off (every peer failed once: all are tried again)."""
        i = self._input
        if run.declared is not None and run.declared.selected:
            candidate = run.declared.candidate  # claimed with DEAD, just now
            if candidate is None:
                run.declared = None  # it waits for a peer: from here on each step is asked
        else:
            self._peer_hint = False
            candidate = await self._db(
                select_candidate,
                SelectCandidateInput(i.org, i.app, run.version, exclude=[i.executor_id, *run.failed],
                                     dead_executor_id=i.executor_id, prefer_gateway=self._state.gateway_queue),
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
            if self._state.blocked_since is None:
                self._state.blocked_since = workflow.now()
                await self._own_alert("executor.recovery.blocked", key, {"reason": reason})
        with contextlib.suppress(TimeoutError):
            await workflow.wait_condition(lambda: self._peer_hint or back(), timeout=BLOCKED_RECHECK,
                                          timeout_summary="waiting for a HEALTHY peer")

    async def _dispatch_and_confirm(self, candidate: Candidate, run: _Recovery, *, look: bool = False) -> str | None:
        """One attempt via ``candidate``: the request, its answer and the confirmation. The failure reason, None on
        success, or ``CALLED_OFF`` (the executor was back before the request went out). ``look``: the gateway's
        look is the fence's last (``_sender_looks``)."""
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
        return await self._dispatch(candidate, request_id, run.attempt, run.details, look=look)

    async def _recovered(self, candidate: Candidate, details: dict[str, object]) -> None:
        """Confirmed: the audit row, then the dead executor's registry row deleted; since
        ``RECOVERED_IN_ONE_WRITE_PATCH`` both in one local activity."""
        i = self._input
        succeeded = None
        if self._patched(RECOVERED_IN_ONE_WRITE_PATCH):
            succeeded = self._audit_input("executor.recovery.succeeded", "success", details)
        else:
            await self._audit("executor.recovery.succeeded", "success", details)
        await self._db(
            delete_executor,
            DeleteExecutorInput(i.org, i.app, i.executor_id, event_key=self._event_key("deleted"),
                                details={"recovered_by": candidate.executor_id}, succeeded=succeeded),
        )

    async def _dispatch(self, candidate: Candidate, request_id: str, attempt: int,
                        details: dict[str, object], *, look: bool = False) -> str | None:
        """The last look, then the request: the failure reason, None on success, or ``CALLED_OFF``.

        Nothing is awaited between the look and scheduling the request, so a `connected` that lands before the
        request is out is always seen (whatever came before: a probe, the gate, a candidate's answer). The
        `dispatched` row is written while the request is out: since ``DISPATCHED_BY_GATEWAY_PATCH`` by the gateway
        as it sends it (or by this workflow, under the same key, when the gateway did not say it did)."""
        if self._back():
            await self._call_off()
            return CALLED_OFF
        if self._patched(DISPATCHED_BY_GATEWAY_PATCH):
            audit = self._audit_input("executor.recovery.dispatched", "success", details)
            return await self._attempt(candidate, attempt,
                                       self._request(candidate, request_id, attempt, audit, look=look), audit)
        request = self._request(candidate, request_id, attempt, look=look)
        try:
            await self._audit("executor.recovery.dispatched", "success", details)
        except BaseException:
            request.cancel()  # removed (or cancelled) meanwhile: the request goes with the workflow
            raise
        return await self._attempt(candidate, attempt, request)

    def _admission_ask(self) -> AdmitRecoveryInput:
        """The gate's question about this death (its ticket made on the first ask)."""
        i, state = self._input, self._state
        if not state.gate_ticket:
            state.gate_ticket = str(workflow.uuid4())
        return AdmitRecoveryInput(i.org, i.app, i.executor_id, state.gate_ticket, now=workflow.now(),
                                  event_key=f"{workflow.info().workflow_id}/gate/{state.gate_ticket}")

    async def _admitted(self, back: Callable[[], bool], reply: AdmitRecoveryReply | None = None) -> bool:
        """Ask the recovery gate (or take ``reply``, its answer asked with DEAD); True: go. Otherwise wait until it
        says to ask again (or the executor is back), then False. A pause lifted early is seen at the next ask: the
        gate makes a paused recovery ask at least every ``RELAY_RECOVERY_PAUSE_RECHECK_SECS``, so no signal is
        needed and none can be lost."""
        if reply is None:
            reply = await workflow.execute_local_activity(
                admit_recovery, self._admission_ask(), start_to_close_timeout=DB_ACTIVITY_TIMEOUT,
                retry_policy=DB_RETRY)
        if reply.tripped:  # this admission tripped the storm breaker
            await self._own_alert("app.recovery.breaker_tripped", reply.tripped, dict(reply.storm))
        if reply.go or reply.until is None:
            return True
        wait = reply.until - workflow.now()
        self._describe(f"**recovery held** ({reply.reason}) until {reply.until.isoformat()}")
        if wait > timedelta(0):
            with contextlib.suppress(TimeoutError):
                await workflow.wait_condition(back, timeout=wait, timeout_summary=f"recovery held: {reply.reason}")
        return False

    def _request(self, candidate: Candidate, request_id: str, attempt: int, audit: WriteAuditInput | None = None,
                 *, look: bool = False) -> ActivityHandle[RecoveryReply]:
        """Schedule the ``recovery`` request through the candidate's gateway (in this workflow task); since
        ``CONFIRM_WITH_REQUEST_PATCH`` with its confirmation (``_confirm_input``) for the gateway to ask right after;
        ``look``: the gateway answers the dead executor's socket there instead of sending (``_sender_looks``)."""
        i = self._input
        confirm = self._confirm_input(candidate) if self._patched(CONFIRM_WITH_REQUEST_PATCH) else None
        return workflow.start_activity(
            dispatch_recovery,
            DispatchRecoveryInput(candidate.executor_id, [i.executor_id], request_id, i.recovery_timeout,
                                  org=i.org, app=i.app, confirm=confirm, audit=audit, look=look),
            task_queue=candidate.gateway_queue, retry_policy=ONCE,
            schedule_to_start_timeout=SOCKET_SCHEDULE_TO_START,
            # Two requests when the confirmation comes along, each given the recovery timeout.
            start_to_close_timeout=self._socket_timeout() + (i.recovery_timeout if confirm else timedelta(0)),
            heartbeat_timeout=SOCKET_HEARTBEAT_TIMEOUT,
            summary=f"recovery via {candidate.executor_id} attempt {attempt}",
        )

    def _confirm_input(self, candidate: Candidate) -> ExistPendingInput:
        """The confirmation's question to ``candidate``: are any of the dead executor's workflows PENDING still?"""
        i = self._input
        return ExistPendingInput(candidate.executor_id, i.executor_id, self._version(),
                                 request_id=str(workflow.uuid4()), timeout=i.recovery_timeout, org=i.org, app=i.app)

    def _socket_timeout(self) -> timedelta:
        return self._input.recovery_timeout + timedelta(seconds=5)

    async def _attempt(self, candidate: Candidate, attempt: int, request: ActivityHandle[RecoveryReply],
                       audit: WriteAuditInput | None = None) -> str | None:
        """One recovery attempt, its request already out: its answer, then the confirmation. Returns the failure
        reason, or None. ``audit``: the `dispatched` row the request carried, written here unless the gateway says
        it wrote it."""
        try:
            try:
                reply = await request
            except ActivityError as err:
                if audit is not None and not isinstance(err.cause, CancelledError):
                    await self._db(write_audit, audit)  # no answer: the gateway may not have written it
                raise
            if reply.alive is not None:
                # The gateway's look found the dead executor's socket: no request went out (no dispatched row).
                if not self._back():  # a `connected` that landed meanwhile outranks the look's answer
                    self._state.connection = reply.alive
                await self._call_off()
                return CALLED_OFF
            if audit is not None and not reply.audited:
                await self._db(write_audit, audit)
            if not reply.success:
                return f"recovery answered success=false: {reply.error_message}"
            confirm = reply.confirmed  # the gateway asked right after (``CONFIRM_WITH_REQUEST_PATCH``)
            if confirm is None:
                confirm = await workflow.execute_activity(
                    exist_pending_workflows, self._confirm_input(candidate),
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
