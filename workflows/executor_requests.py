"""A request to one HEALTHY executor of an app, made from a workflow (the alerts round, the orphan sweep): the
executor is chosen as a retention round's is (``select_retention_executor``, newest version first), the request
is carried by its gateway (``executor_request`` on that gateway's own queue), and after a failure another executor
is asked, with backoff. Deterministic: only activities and timers."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

from workflows import timing
from workflows.timing import BACKOFF_INITIAL, DB_ACTIVITY_TIMEOUT, SOCKET_SCHEDULE_TO_START

with workflow.unsafe.imports_passed_through():
    from workflows.contracts.common import Candidate
    from workflows.contracts.management import ExecutorRequestInput, executor_request, unpack
    from workflows.contracts.retention import SelectRetentionExecutorInput, select_retention_executor


async def ask_executor(org: str, app: str, kind: str, fields: dict[str, Any], *, reply_timeout: timedelta,
                       attempts: int, tried: list[str] | None = None) -> dict[str, Any] | str:
    """Send ``{"type": kind, "request_id": <new>, **fields}`` to one HEALTHY executor of the app, and to another
    after a failure, at most ``attempts`` executors; the reply's body, or why there is none. An answer with an
    ``error_message`` is an answer: another executor of the same app would say the same.

    Args:
        tried: the executors asked so far; each one asked is appended.
    """
    tried = [] if tried is None else tried
    backoff = BACKOFF_INITIAL
    failure = f"no HEALTHY executor of app {app!r}"
    for attempt in range(attempts):
        candidate = await workflow.execute_activity(
            select_retention_executor, SelectRetentionExecutorInput(org, app, exclude=list(tried)),
            start_to_close_timeout=DB_ACTIVITY_TIMEOUT)
        if candidate is None:
            return failure if not tried else f"{failure} (tried {', '.join(tried)})"
        tried.append(candidate.executor_id)
        reply = await _request(org, app, candidate, kind, fields, reply_timeout)
        if isinstance(reply, dict):
            return reply
        failure = reply
        if attempt + 1 < attempts:
            backoff = await timing.backoff(backoff, "before the next executor")
    return failure


async def _request(org: str, app: str, candidate: Candidate, kind: str, fields: dict[str, Any],
                   timeout: timedelta) -> dict[str, Any] | str:
    request_id = str(workflow.uuid4())
    frame = json.dumps({"type": kind, "request_id": request_id, **fields})
    try:
        reply = await workflow.execute_activity(
            executor_request, ExecutorRequestInput(org, app, candidate.executor_id, request_id, frame, timeout),
            task_queue=candidate.gateway_queue, schedule_to_start_timeout=SOCKET_SCHEDULE_TO_START,
            start_to_close_timeout=timeout + timedelta(seconds=5), retry_policy=RetryPolicy(maximum_attempts=1),
            summary=f"{kind} via {candidate.executor_id}")
    except ActivityError as err:
        return f"{candidate.executor_id}: {err.cause or err}"
    if reply.failure is not None:
        return f"{candidate.executor_id}: {reply.failure.value} {reply.detail}".strip()
    return unpack(reply.reply_z)
