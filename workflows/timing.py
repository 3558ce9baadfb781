"""Timeouts and backoff shared by Relay's workflows (deterministic: only Temporal's timer and random)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

DB_ACTIVITY_TIMEOUT = timedelta(seconds=30)
# A gateway that vanished never picks the task up, or stops heartbeating mid-request: notice it in seconds
# instead of waiting out the reply timeout.
SOCKET_SCHEDULE_TO_START = timedelta(seconds=10)
SOCKET_HEARTBEAT_TIMEOUT = timedelta(seconds=10)
# The fence before DEAD is asked this long before the grace ends (at most half the grace), so that its probe is with
# the gateway by then even when a burst of deaths queues the workflow tasks.
FENCE_LEAD = timedelta(seconds=2)
BACKOFF_INITIAL = timedelta(seconds=1)
BACKOFF_MAX = timedelta(seconds=30)
MAX_JITTER = 0.2  # a fraction of the delay


async def backoff(current: timedelta, why: str = "") -> timedelta:
    """Sleep ``current`` plus up to 20 % jitter (so peers retried together spread out); return the next delay,
    doubled up to ``BACKOFF_MAX``."""
    jitter = current * workflow.random().uniform(0, MAX_JITTER)
    await workflow.sleep(current + jitter, summary=f"backoff {current.total_seconds():g} s {why}".rstrip())
    return min(current * 2, BACKOFF_MAX)
