"""Activity failures in the worker's log, on the time-skipping server: a deliberate failure (an ``ApplicationError``
with no cause, as ``gateway.activities`` raises for a ``RelayError``) is one line; a bug keeps its traceback."""

from __future__ import annotations

import logging
import uuid
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from core.logs import OneLineActivityFailures, install_redaction
from tests.support import LogRecords


@activity.defn(name="hardening_peer_gone")
async def _peer_gone() -> None:
    try:
        raise KeyError("no socket")
    except KeyError:
        # As gateway.activities does with a RelayError: the reason in the message, no cause attached.
        raise ApplicationError("executor e-1 is not connected to this gateway", type="ExecutorUnavailableError",
                               non_retryable=True) from None


@activity.defn(name="hardening_bug")
async def _bug() -> None:
    raise ZeroDivisionError("a bug")


@workflow.defn(name="HardeningActivityFailures", sandboxed=False)
class _Failing:
    @workflow.run
    async def run(self, name: str) -> str:
        try:
            await workflow.execute_activity(name, start_to_close_timeout=timedelta(seconds=10),
                                            retry_policy=RetryPolicy(maximum_attempts=1))
        except Exception as err:
            return type(err.__cause__).__name__
        return "ok"


async def test_a_deliberate_activity_failure_is_one_line_a_bug_keeps_its_traceback(
        time_skipping_env: WorkflowEnvironment) -> None:
    install_redaction()
    assert any(isinstance(f, OneLineActivityFailures) for f in logging.getLogger("temporalio.activity").filters)
    handler = LogRecords()
    logger = logging.getLogger("temporalio.activity")
    logger.addHandler(handler)
    queue = f"hardening-{uuid.uuid4()}"
    try:
        async with Worker(time_skipping_env.client, task_queue=queue, workflows=[_Failing],
                          activities=[_peer_gone, _bug], workflow_runner=UnsandboxedWorkflowRunner()):
            for name in ("hardening_peer_gone", "hardening_bug"):
                result = await time_skipping_env.client.execute_workflow(
                    _Failing.run, name, id=f"hardening-{uuid.uuid4()}", task_queue=queue)
                assert result == "ApplicationError"
    finally:
        logger.removeHandler(handler)
    failed = [r for r in handler.records if r.getMessage().startswith("Completing activity as failed")]
    deliberate = [r for r in failed if "hardening_peer_gone" in r.getMessage()]
    bug = [r for r in failed if "hardening_bug" in r.getMessage()]
    assert len(deliberate) == 1 and len(bug) == 1
    assert deliberate[0].exc_info is None
    assert deliberate[0].getMessage().endswith(
        ": ExecutorUnavailableError: executor e-1 is not connected to this gateway")
    assert bug[0].exc_info is not None and isinstance(bug[0].exc_info[1], ZeroDivisionError)
