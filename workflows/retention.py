"""Retention rounds: garbage collection of old workflows and the global workflow timeout, per app; and the audit
log's own retention (RELAY_AUDIT_RETENTION_DAYS).

The Temporal Schedule ``relay-retention`` (created by the worker at start-up) starts a ``RetentionWorkflow``
every ``RELAY_RETENTION_INTERVAL_SECS``. It lists the apps with a retention setting and starts one
``AppRetentionWorkflow`` per app, which computes the app's cutoffs from its own clock and sends ``retention`` to
one HEALTHY executor of the app, retrying on another after a failure.

The round starts its children and returns without waiting for them (parent close policy ABANDON): the schedule
skips a round while the previous one still runs (overlap SKIP), so a round that waited for its slowest app would
make every other app wait too. A child's workflow id is fixed per app, so two rounds of one app never overlap:
the later start fails, and that app is skipped (audited) for the round. Then the round deletes the audit rows
older than the audit retention, in batches (``activities.retention``), for a bounded time: a backlog is worked off
over the next rounds, and writers never wait behind one huge delete.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, WorkflowAlreadyStartedError

from workflows import timing
from workflows.timing import (
    BACKOFF_INITIAL,
    DB_ACTIVITY_TIMEOUT,
    SOCKET_SCHEDULE_TO_START,
)

with workflow.unsafe.imports_passed_through():
    from workflows.contracts.common import Candidate
    from workflows.contracts.management import ExecutorRequestInput, executor_request, latest_version, unpack
    from workflows.contracts.retention import (
        AppRetentionInput,
        AppRetentionResult,
        DispatchRetentionInput,
        ListRetentionTargetsInput,
        PruneAuditLogInput,
        RetentionCutoffs,
        RetentionInput,
        RetentionRoundResult,
        RetentionTarget,
        SelectRetentionExecutorInput,
        WriteRetentionAuditInput,
        app_retention_workflow_id,
        dispatch_retention,
        list_retention_targets,
        prune_audit_log,
        select_retention_executor,
        write_retention_audit,
    )

SUCCEEDED, SKIPPED, NOTHING_SET = "SUCCEEDED", "SKIPPED", "NOTHING_SET"
# Since this patch the round asks an executor for the app's latest version (``list_application_versions``)
# and sends ``retention`` to that version's executors first; before it, registration order alone ranked versions.
LATEST_FROM_SDK_PATCH = "retention-latest-from-sdk"
# Since this patch the round also prunes the audit log; rounds recorded before it did not.
AUDIT_RETENTION_PATCH = "audit-retention"
# The pruning activity stops after its budget (PruneAuditLogInput) and says how far it got; this leaves room for its
# last batch. A failed prune is retried a little, then left to the next round: the next round must not wait on it.
PRUNE_AUDIT_TIMEOUT = timedelta(seconds=90)
PRUNE_AUDIT_RETRY = RetryPolicy(maximum_attempts=3)

# Scheduled rounds start a little after their nominal time, each by a different delay; "recent" ends this much
# before a full interval so that jitter never makes a scheduled round look recent to the one before it.
RECENT_SLACK_MAX = timedelta(seconds=30)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


# -- the arithmetic (pure, unit-tested) ------------------------------------------------------------------------


def has_retention(target: RetentionTarget) -> bool:
    """At least one setting is set. A non-positive one counts as unset: a row threshold <= 0 becomes
    ``OFFSET -1`` in the SDKs (an error on PostgreSQL), and a time threshold <= 0 would collect every finished
    workflow at once."""
    return (_positive(target.gc_time_threshold) or _positive(target.global_timeout)
            or (target.gc_rows_threshold is not None and target.gc_rows_threshold > 0))


def retention_cutoffs(target: RetentionTarget, *, now: datetime, gc_batch_size: int) -> RetentionCutoffs | None:
    """What to send for ``target`` at ``now``; None when the app has nothing set (it then gets no message)."""
    if not has_retention(target):
        return None
    rows = target.gc_rows_threshold if target.gc_rows_threshold is not None and target.gc_rows_threshold > 0 else None
    return RetentionCutoffs(gc_cutoff=_before(now, target.gc_time_threshold), gc_rows_threshold=rows,
                            gc_batch_size=gc_batch_size if gc_batch_size > 0 else None,
                            timeout_cutoff=_before(now, target.global_timeout))


def _positive(duration: timedelta | None) -> bool:
    return duration is not None and duration > timedelta(0)


def _before(now: datetime, duration: timedelta | None) -> datetime | None:
    if duration is None or duration <= timedelta(0):
        return None
    # Clamped to the epoch (0 on the wire): a threshold longer than the epoch's age would otherwise underflow
    # ``datetime`` or go negative, and "before 1970" selects the same nothing.
    return EPOCH if duration >= now - EPOCH else now - duration


def recent_window(interval: timedelta) -> timedelta:
    """How long after a round started another one for the same app is not sent."""
    return interval - min(interval / 2, RECENT_SLACK_MAX)


def is_recent(last_started_at: datetime | None, *, now: datetime, interval: timedelta) -> bool:
    return last_started_at is not None and now - last_started_at < recent_window(interval)


# -- one round -------------------------------------------------------------------------------------------------


@workflow.defn
class RetentionWorkflow:
    """One round, started by the schedule: a child per app with a retention setting, not awaited."""

    @workflow.run
    async def run(self, input: RetentionInput) -> RetentionRoundResult:
        self._clock = workflow.now()
        targets = await workflow.execute_activity(
            list_retention_targets,
            ListRetentionTargetsInput(),
            start_to_close_timeout=DB_ACTIVITY_TIMEOUT,
        )
        due = [t for t in targets if has_retention(t)]
        started = await asyncio.gather(*(self._start(t, input) for t in due))
        result = RetentionRoundResult()
        for target, ok in zip(due, started, strict=True):
            (result.started if ok else result.still_running).append(f"{target.org}/{target.app}")
        if workflow.patched(AUDIT_RETENTION_PATCH):
            result.audit_rows_pruned = await self._prune_audit_log(input)
        return result

    async def _prune_audit_log(self, input: RetentionInput) -> int:
        """Delete the audit rows older than the retention, counted from the round's clock; how many."""
        before = self._clock - input.audit_retention
        try:
            return await workflow.execute_activity(
                prune_audit_log, PruneAuditLogInput(before=before),
                start_to_close_timeout=PRUNE_AUDIT_TIMEOUT, retry_policy=PRUNE_AUDIT_RETRY,
                summary=f"audit rows emitted before {before:%Y-%m-%d %H:%M:%S} UTC",
            )
        except ActivityError:
            return 0  # the database is away, or the rows are locked: the next round tries again

    async def _start(self, target: RetentionTarget, input: RetentionInput) -> bool:
        try:
            await workflow.start_child_workflow(
                AppRetentionWorkflow.run,
                AppRetentionInput(target, interval=input.interval, gc_batch_size=input.gc_batch_size,
                                  reply_timeout=input.reply_timeout),
                id=app_retention_workflow_id(target.org, target.app),
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
                static_summary=f"retention of {target.org}/{target.app}",
            )
            return True
        except WorkflowAlreadyStartedError:
            await _audit(WriteRetentionAuditInput(
                target.org, target.app, "retention.skipped", _event_key("retention.skipped"), self._clock,
                status="failure", target=target,
                details={"reason": "the previous round of this app is still running"},
            ))
            return False


# -- one app ---------------------------------------------------------------------------------------------------


@workflow.defn
class AppRetentionWorkflow:
    """One app's round: ``retention`` to one HEALTHY executor (newest version first), retried on another until
    one answers ``success: true`` ("started", for current SDKs) or the round's time is up."""

    @workflow.run
    async def run(self, input: AppRetentionInput) -> AppRetentionResult:
        self._input = input
        self._clock = workflow.now()  # the one instant every cutoff of this round is computed from
        # Read again rather than trusting the round's list: the app's previous round may have ended (and recorded
        # its start) in between, and its settings may have changed or the app been deleted.
        fresh = await workflow.execute_activity(
            list_retention_targets,
            ListRetentionTargetsInput(org=input.target.org, app=input.target.app),
            start_to_close_timeout=DB_ACTIVITY_TIMEOUT,
        )
        if not fresh:
            return AppRetentionResult(NOTHING_SET)
        self._target = target = fresh[0]
        cutoffs = retention_cutoffs(target, now=self._clock, gc_batch_size=input.gc_batch_size)
        if cutoffs is None:
            return AppRetentionResult(NOTHING_SET)
        self._cutoffs = cutoffs
        last = target.last_started_at
        if last is not None and is_recent(last, now=self._clock, interval=input.interval):
            return await self._skip(f"a round started at {last.isoformat()} is recent "
                                    f"(interval {input.interval.total_seconds():g} s)", attempts=0, status="success")
        return await self._dispatch(deadline=self._clock + recent_window(input.interval))

    async def _dispatch(self, *, deadline: datetime) -> AppRetentionResult:
        t = self._target
        failed: list[str] = []
        attempt = 0
        backoff = BACKOFF_INITIAL
        latest = await self._latest_version() if workflow.patched(LATEST_FROM_SDK_PATCH) else None
        while True:
            candidate = await workflow.execute_activity(
                select_retention_executor,
                SelectRetentionExecutorInput(t.org, t.app, exclude=list(failed), latest=latest),
                start_to_close_timeout=DB_ACTIVITY_TIMEOUT,
            )
            if candidate is None and not failed:
                reason = "no HEALTHY executor" + (f" left after {attempt} failed attempts" if attempt else "")
                return await self._skip(reason, attempts=attempt)
            if candidate is None:
                failed.clear()  # every executor failed once: try them all again after the backoff
            else:
                attempt += 1
                request_id = str(workflow.uuid4())
                details = {"attempt": attempt, "request_id": request_id}
                await self._audit("retention.dispatched", "success", candidate.executor_id, details)
                error = await self._attempt(candidate, request_id, attempt)
                if error is None:
                    await self._audit("retention.succeeded", "success", candidate.executor_id, details,
                                      started=True)
                    return AppRetentionResult(SUCCEEDED, candidate.executor_id, attempt)
                await self._audit("retention.failed", "failure", candidate.executor_id, {**details, "reason": error})
                failed.append(candidate.executor_id)
            if workflow.now() + backoff * (1 + timing.MAX_JITTER) > deadline:  # the next try must land in time
                return await self._skip(f"no executor started the round in {attempt} attempts; the next round "
                                        "tries again", attempts=attempt)
            backoff = await timing.backoff(backoff)

    async def _latest_version(self) -> str | None:
        """The app's latest application version as its SDK defines it, asked of one HEALTHY executor; None when
        none answers (the round then ranks versions by registration order, as before)."""
        t = self._target
        candidate = await workflow.execute_activity(
            select_retention_executor, SelectRetentionExecutorInput(t.org, t.app),
            start_to_close_timeout=DB_ACTIVITY_TIMEOUT,
        )
        if candidate is None:
            return None
        request_id = str(workflow.uuid4())
        frame = json.dumps({"type": "list_application_versions", "request_id": request_id})
        timeout = self._input.reply_timeout
        try:
            reply = await workflow.execute_activity(
                executor_request,
                ExecutorRequestInput(t.org, t.app, candidate.executor_id, request_id, frame, timeout),
                task_queue=candidate.gateway_queue,
                schedule_to_start_timeout=SOCKET_SCHEDULE_TO_START,
                start_to_close_timeout=timeout + timedelta(seconds=5),
                retry_policy=RetryPolicy(maximum_attempts=1),
                summary=f"latest application version via {candidate.executor_id}",
            )
        except ActivityError:
            return None
        return None if reply.failure is not None else latest_version(unpack(reply.reply_z))

    async def _attempt(self, candidate: Candidate, request_id: str, attempt: int) -> str | None:
        """One ``retention`` request through the candidate's gateway. Returns the failure reason, or None."""
        timeout = self._input.reply_timeout
        try:
            reply = await workflow.execute_activity(
                dispatch_retention,
                DispatchRetentionInput(candidate.executor_id, request_id, self._cutoffs, timeout,
                                       org=self._target.org, app=self._target.app),
                task_queue=candidate.gateway_queue,
                schedule_to_start_timeout=SOCKET_SCHEDULE_TO_START,
                start_to_close_timeout=timeout + timedelta(seconds=5),
                # This loop retries, on another executor; the activity itself runs once.
                retry_policy=RetryPolicy(maximum_attempts=1),
                summary=f"retention via {candidate.executor_id} attempt {attempt}",
            )
        except ActivityError as err:
            return str(err.cause or err)
        if not reply.success:
            return f"retention answered success=false: {reply.error_message}"
        return None

    async def _skip(self, reason: str, *, attempts: int, status: str = "failure") -> AppRetentionResult:
        await self._audit("retention.skipped", status, None, {"reason": reason})
        return AppRetentionResult(SKIPPED, attempts=attempts, reason=reason)

    async def _audit(self, operation: str, status: str, executor_id: str | None, details: dict[str, object], *,
                     started: bool = False) -> None:
        t = self._target
        await _audit(WriteRetentionAuditInput(
            t.org, t.app, operation, _event_key(operation), self._clock, status=status, executor_id=executor_id,
            target=t, cutoffs=self._cutoffs, started_at=self._clock if started else None, details=dict(details),
        ))


async def _audit(input: WriteRetentionAuditInput) -> None:
    await workflow.execute_activity(write_retention_audit, input, start_to_close_timeout=DB_ACTIVITY_TIMEOUT)


def _event_key(operation: str) -> str:
    # workflow.uuid4() is replay-safe and seeded per run, so a retried activity carries the same key and lands
    # once, while the next round of the same app (same workflow id, new run) gets new keys.
    return f"{workflow.info().workflow_id}/{operation}/{workflow.uuid4()}"
