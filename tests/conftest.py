"""Shared test fixtures and helpers."""

from __future__ import annotations

# -- Temporal time-skipping environment and assert_eventually (used by test_lifecycle_workflow.py) -----------
import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta

import pytest
from temporalio.testing import WorkflowEnvironment

from core.temporal import data_converter, venv_binary


@pytest.fixture(scope="session")
async def time_skipping_env() -> AsyncIterator[WorkflowEnvironment]:
    """One time-skipping test server for the session, from the venv's binary (never downloaded).

    Time only jumps while a test awaits a workflow result or calls ``env.sleep()``; otherwise it runs at wall
    speed, so a test can send signals "before the grace" simply by not skipping.
    """
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(venv_binary("temporal-test-server")),
        data_converter=data_converter,
    )
    try:
        yield env
    finally:
        await env.shutdown()


async def assert_eventually(
    check: Callable[[], Awaitable[object] | object],
    *,
    timeout: timedelta = timedelta(seconds=10),
    interval: timedelta = timedelta(milliseconds=20),
) -> None:
    """Call ``check`` (sync or async) until it stops raising ``AssertionError``; re-raise the last one on timeout."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout.total_seconds()
    while True:
        try:
            result = check()
            if inspect.isawaitable(result):
                await result
            return
        except AssertionError:
            if loop.time() >= deadline:
                raise
        await asyncio.sleep(interval.total_seconds())


# -- end of the time-skipping section ------------------------------------------------------------------------


from tests.support import relay  # noqa: E402, F401 — `relay dev` on free ports, one per test session
