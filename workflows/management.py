"""``ManagementRequestWorkflow``: one operator's request to an executor held by another gateway process.

Started by the gateway serving the REST call, on the task queue of the gateway holding the socket, so that both
its workflow task and its local activity run in that process; nothing is retried (the caller decides whether to
ask another executor). Its history shows who was asked what, and what came back, in the Temporal UI.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import RetryPolicy

from workflows.contracts.management import ExecutorRequestInput, ExecutorRequestReply, executor_request


@workflow.defn(name="ManagementRequest")
class ManagementRequestWorkflow:
    @workflow.run
    async def run(self, input: ExecutorRequestInput) -> ExecutorRequestReply:
        return await workflow.execute_local_activity(
            executor_request, input, start_to_close_timeout=input.timeout * 1.5,
            retry_policy=RetryPolicy(maximum_attempts=1))
