"""Retention rounds on demand, for end-to-end tests against `relay dev` (schedules need the dev server).

A test's Relay runs with a 30-day interval and ``pause_schedule`` called, so rounds happen only when the test
triggers one (a schedule fires on interval boundaries counted from the epoch: even a 1 h interval can fire
mid-test). Triggering works while paused, as it does for an operator.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from temporalio.client import Client, ScheduleActionExecutionStartWorkflow, ScheduleOverlapPolicy

from core.temporal import connect
from tests.support import wait_until
from workflows.contracts.retention import (
    RETENTION_SCHEDULE_ID,
    AppRetentionResult,
    RetentionRoundResult,
    app_retention_workflow_id,
)


def run_temporal(temporal: str, call: Callable[[Client], Awaitable[Any]]) -> Any:
    """One Temporal call from a synchronous test: a fresh client on a fresh loop."""

    async def go() -> Any:
        return await call(await connect(temporal, "default"))

    return asyncio.run(go())


async def schedule_exists(client: Client) -> bool:
    """Whether the retention schedule is listed (once; the alerts and orphan sweeps have schedules of their own):
    listing reads the visibility store, which lags creation a little, so callers poll."""
    return [s.id async for s in await client.list_schedules()].count(RETENTION_SCHEDULE_ID) == 1


def pause_schedule(temporal: str) -> None:
    """Once the retention schedule exists: pause it, so that only triggered rounds run."""

    wait_until(lambda: run_temporal(temporal, schedule_exists), timeout=15, what="the retention schedule")
    run_temporal(temporal, lambda client: client.get_schedule_handle(RETENTION_SCHEDULE_ID).pause(
        note="paused by the test: rounds on trigger only"))


def trigger_round(temporal: str) -> RetentionRoundResult:
    """Trigger the schedule once and return that round's result (its per-app rounds may still run)."""

    async def trigger(client: Client) -> RetentionRoundResult:
        handle = client.get_schedule_handle(RETENTION_SCHEDULE_ID)
        before = (await handle.describe()).info.num_actions
        # ALLOW_ALL: a trigger is never dropped for overlapping a round still running (they take milliseconds).
        await handle.trigger(overlap=ScheduleOverlapPolicy.ALLOW_ALL)
        for _ in range(300):  # the action is recorded asynchronously
            info = (await handle.describe()).info
            if info.num_actions > before:
                break
            await asyncio.sleep(0.05)
        else:
            raise AssertionError("the triggered round never started")
        action = info.recent_actions[-1].action
        assert isinstance(action, ScheduleActionExecutionStartWorkflow)
        async with asyncio.timeout(30):
            result: RetentionRoundResult = await client.get_workflow_handle(
                action.workflow_id, result_type=RetentionRoundResult).result()
        return result

    result: RetentionRoundResult = run_temporal(temporal, trigger)
    return result


def app_result(temporal: str, app: str, *, org: str = "local") -> AppRetentionResult:
    """The result of the app's latest retention round, once it has finished."""

    async def wait(client: Client) -> AppRetentionResult:
        handle = client.get_workflow_handle(app_retention_workflow_id(org, app), result_type=AppRetentionResult)
        async with asyncio.timeout(30):
            result: AppRetentionResult = await handle.result()
        return result

    result: AppRetentionResult = run_temporal(temporal, wait)
    return result
