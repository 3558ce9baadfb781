"""The fence's probe: asked on a gateway's own task queue before Relay declares anything gone.

A missed heartbeat, a late timer or an undelivered signal means "no news": Temporal itself may have been away.
So before an executor is declared DEAD, before a recovery request goes out, and before a gateway's executors
are disconnected because its heartbeats stopped, the gateway concerned is asked directly. One that picks the
probe up is alive and in contact with Temporal, and says whether it holds the executor's socket; only one that
does not pick it up within the schedule-to-start timeout counts as gone (a gateway cut off from Temporal fences
itself before that: it closes its sockets, so "gone" never hides a live socket).
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, CancelledError, TimeoutType
from temporalio.exceptions import TimeoutError as ActivityTimeoutError

with workflow.unsafe.imports_passed_through():
    from workflows.contracts.gateway_watch import ProbeGatewayInput, ProbeGatewayReply, probe_gateway

GONE = (TimeoutType.SCHEDULE_TO_START, TimeoutType.START_TO_CLOSE)
# Pause between probes when one was picked up but failed (the gateway died mid-probe): the next one tells.
PROBE_RETRY = timedelta(seconds=1)


async def probe(gateway_queue: str, input: ProbeGatewayInput, *, timeout: timedelta,
                hold: timedelta = timedelta(0)) -> ProbeGatewayReply | None:
    """The gateway's answer, or None when it is gone: it did not pick the probe up within ``timeout``, or picked it
    up and did not answer within ``timeout`` more (a gateway cut off by a partition that drops packets: its long
    polls still look open to the server, which hands them the probe). Either way it has lost contact with
    Temporal, and a gateway out of contact fences itself within ``RELAY_GATEWAY_FENCE_SECS``, which is shorter:
    by the time it counts as gone it holds no socket. Any other failure (the task failed) is asked again.
    ``hold``: how long the gateway may hold its answer (``input.answer_at``), on top of ``timeout``."""
    while True:
        try:
            return await workflow.execute_activity(
                probe_gateway, input, task_queue=gateway_queue, retry_policy=RetryPolicy(maximum_attempts=1),
                schedule_to_start_timeout=timeout, start_to_close_timeout=timeout + hold,
                summary=f"probe {gateway_queue}" + (f" for {input.executor_id}" if input.executor_id else ""),
            )
        except ActivityError as err:
            if isinstance(err.cause, CancelledError):
                raise
            if isinstance(err.cause, ActivityTimeoutError) and err.cause.type in GONE:
                return None
        await workflow.sleep(PROBE_RETRY, summary="probe again")
