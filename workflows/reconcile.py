"""``ReconcileWorkflow``: one round of making the registry and the lifecycle workflows agree.

A registry row must always have its lifecycle workflow. Rows are left without one when Temporal's state is lost
(a fresh cluster, a restore from an older backup) or a workflow is terminated by hand; their grace timers and
recoveries died with it, so an executor DISCONNECTED then would stay so for ever and its workflows would never be
recovered. The Temporal Schedule ``relay-reconcile`` (created by the worker, which also triggers a round at
start-up; none when ``RELAY_RECONCILE_INTERVAL_SECS`` is 0) starts one every interval.

The round only starts lifecycle workflows (``reconcile_registry``): what happens to each executor is decided by its
own workflow, from the row it reads back, through every safeguard of the lifecycle (the fence's probe, a full
grace, the gate, the fence again before each recovery request).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from workflows.contracts.reconcile import ReconcileInput, ReconcileResult, reconcile_registry

# The round lists the running lifecycle workflows and starts the missing ones, 16 at a time; it heartbeats as it goes.
ROUND_TIMEOUT = timedelta(minutes=10)
ROUND_HEARTBEAT = timedelta(minutes=1)


@workflow.defn
class ReconcileWorkflow:
    @workflow.run
    async def run(self, input: ReconcileInput) -> ReconcileResult:
        return await workflow.execute_activity(reconcile_registry, input, start_to_close_timeout=ROUND_TIMEOUT,
                                               heartbeat_timeout=ROUND_HEARTBEAT)
