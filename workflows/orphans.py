"""``OrphanSweepWorkflow``: one sweep for PENDING workflows owned by executor ids Relay has no record of.

Such workflows are stranded when an executor died while Relay's registry was lost, or before Relay ran: no
lifecycle workflow knows of them, so nobody would ever recover them. The Temporal Schedule ``relay-orphans``
(created by the worker at start-up; none when ``RELAY_ORPHAN_SWEEP_INTERVAL_SECS`` is 0) starts one every
interval. A sweep, per registered app with a HEALTHY executor, concurrently:

1. asks one HEALTHY executor of the app ``get_workflow_aggregates`` for PENDING workflows created at least
   ``RELAY_ORPHAN_MIN_AGE_SECS`` ago, grouped by executor id and version (another executor if it fails), as the
   alerts round asks;
2. decides which ids are orphans (``find_orphans``: ``core.orphans``; the registry is read after the reply came,
   so an executor that registered meanwhile is left alone) and audits ``orphans.found`` (one row per app per
   sweep that finds any; the alerts round turns it into an ``OrphansFound`` alert);
3. starts each orphan's ``ExecutorLifecycleWorkflow`` under its usual id with ``LifecycleInput.orphan`` set
   (``start_orphan_recovery``), which recovers it through the same confirmed path as any DEAD executor. One
   already running under that id (its executor connected meanwhile, or an earlier sweep's recovery still runs)
   is left alone.

The sweep only ever starts a lifecycle workflow: every safeguard of recovery (the grace, the gate, the fence
before each request, the confirmation) is the lifecycle workflow's.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import workflow

from workflows.executor_requests import ask_executor
from workflows.timing import DB_ACTIVITY_TIMEOUT

with workflow.unsafe.imports_passed_through():
    from workflows.contracts.orphans import (
        FindOrphansInput,
        ListOrphanTargetsInput,
        OrphanSweepInput,
        OrphanSweepResult,
        OrphanTarget,
        StartOrphanRecoveryInput,
        find_orphans,
        list_orphan_targets,
        start_orphan_recovery,
    )

QUERY_ATTEMPTS = 2  # executors asked for one app's aggregates


@workflow.defn
class OrphanSweepWorkflow:
    @workflow.run
    async def run(self, input: OrphanSweepInput) -> OrphanSweepResult:
        self._input = input
        self._now = workflow.now()
        self._result = OrphanSweepResult()
        targets = await workflow.execute_activity(
            list_orphan_targets, ListOrphanTargetsInput(self._now, input.min_age),
            start_to_close_timeout=DB_ACTIVITY_TIMEOUT)
        await asyncio.gather(*(self._app(target) for target in targets))
        return self._result

    async def _app(self, target: OrphanTarget) -> None:
        asked: list[str] = []
        reply = await self._ask(target, asked)
        if isinstance(reply, str):
            self._result.unchecked.append(f"{target.org}/{target.app}: {reply}")
            return
        if reply.get("error_message"):
            self._result.unchecked.append(f"{target.org}/{target.app}: {str(reply['error_message'])[:300]}")
            return
        key = f"{workflow.info().workflow_id}/orphans.found/{target.org}/{target.app}/{workflow.uuid4()}"
        orphans = await workflow.execute_activity(
            find_orphans, FindOrphansInput(target.org, target.app, self._now, reply, key, self._input.min_age,
                                           asked=asked[-1] if asked else ""),
            start_to_close_timeout=DB_ACTIVITY_TIMEOUT)
        for orphan in orphans:
            started = await workflow.execute_activity(
                start_orphan_recovery,
                StartOrphanRecoveryInput(target.org, target.app, orphan.executor_id, orphan.info,
                                         recovery_timeout=self._input.recovery_timeout,
                                         probe_timeout=self._input.probe_timeout),
                start_to_close_timeout=DB_ACTIVITY_TIMEOUT, summary=f"recover orphan {orphan.executor_id}")
            name = f"{target.org}/{target.app}/{orphan.executor_id}"
            (self._result.started if started else self._result.running).append(name)

    async def _ask(self, target: OrphanTarget, tried: list[str]) -> dict[str, Any] | str:
        """The aggregates from one HEALTHY executor of the app, another after a failure: its reply, or why none."""
        return await ask_executor(target.org, target.app, "get_workflow_aggregates", {"body": target.query},
                                  reply_timeout=self._input.reply_timeout, attempts=QUERY_ATTEMPTS, tried=tried)
