"""Shared test fixtures and helpers."""

from __future__ import annotations

# -- Temporal time-skipping environment and assert_eventually (used by test_lifecycle_workflow.py) -----------
import asyncio
import contextlib
import inspect
import logging
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import settings
from temporalio.runtime import LogForwardingConfig, LoggingConfig, Runtime, TelemetryConfig, TelemetryFilter
from temporalio.testing import WorkflowEnvironment

from core.logs import CORE_LOGGER
from core.temporal import data_converter, venv_binary
from tests.quick import examples

# No per-example deadline: a test is not a benchmark, and on a loaded two-core machine (xdist, e2e processes) an
# example of a property test may take longer than Hypothesis's 200 ms without anything being wrong. Hypothesis's
# 100 examples, a tenth of them in `make check`'s quick run (tests/quick.py).
settings.register_profile("relay", deadline=None, max_examples=examples(100))
settings.load_profile("relay")

# pytest-xdist's workers run with COLUMNS=80 and LINES=24 in their environment, which every process a test starts
# inherits: the CLI would then lay its tables out for an 80-column terminal while its output goes to a pipe. A test
# that wants a width sets COLUMNS itself.
os.environ.pop("COLUMNS", None)
os.environ.pop("LINES", None)
# A test run started in the background by a shell (`make test &`) inherits SIGINT ignored, and so would every
# process it starts: `relay audit --follow` and `relay dev` could then not be stopped with Ctrl-C, as tests stop them.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The time-skipping test server advertises no capabilities, so the SDK's Rust core warns, for every worker that
# connects to it, that a Temporal Server 1.16.0 or newer is required to keep heartbeat details on failure.
# No test here relies on those, and the line says nothing about the code under test.
TEST_SERVER_NOISE = "Temporal Server 1.16.0 or newer is required"


class DropTestServerNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return TEST_SERVER_NOISE not in record.getMessage()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--sdk", action="append", default=[],
                     choices=["python", "python-current", "typescript", "typescript-current", "go", "go-current",
                              "java"],
                     help="tests/e2e/test_sdks.py: run this SDK's executors only (repeatable; default: all)")


def pytest_configure(config: pytest.Config) -> None:
    """Before any Temporal client or worker exists in this process (each keeps the runtime it was made with):
    the SDK core's logs go through Python logging, as in Relay's processes (``core.logs``), instead of straight
    to stderr, so pytest captures them and reports them with a failing test; the test server's noise is dropped.
    """
    core = logging.getLogger(CORE_LOGGER)
    core.addFilter(DropTestServerNoise())
    forwarding = LogForwardingConfig(logger=core, append_target_to_name=False)
    logging_config = LoggingConfig(filter=TelemetryFilter(core_level="WARN", other_level="ERROR"),
                                   forwarding=forwarding)
    Runtime.set_default(Runtime(telemetry=TelemetryConfig(logging=logging_config)), error_if_already_set=False)


@contextlib.asynccontextmanager
async def _time_skipping_server() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(venv_binary("temporal-test-server")),
        data_converter=data_converter,
    )
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture(scope="module")
async def time_skipping_env() -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping test server for the module, from the venv's binary (never downloaded).

    Time only jumps while a test awaits a workflow result or calls ``env.sleep()``; otherwise it runs at wall
    speed, so a test can send signals "before the grace" simply by not skipping. Each awaited result moves the
    server's clock about ten years on (it skips to the finished run's retention): one server for the whole
    session had reached the year 2176 by the gate's tests when they ran after the lifecycle's on one xdist worker,
    and their grace timers then no longer fired. A server per module keeps every module's clock near today's.
    """
    async with _time_skipping_server() as env:
        yield env


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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """Captured output can hold lone surrogates (fuzzers send them, and Relay's logs echo what it refused); a
    report that carries one cannot be sent from an xdist worker (UTF-8), so they are escaped."""
    outcome: Any = yield
    report = outcome.get_result()
    report.sections = [(title, _escape_surrogates(text)) for title, text in report.sections]


def _escape_surrogates(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


# RELAY_TEST_CPU=<dir>: each pytest process appends, per test, the CPU seconds it and the processes it started and
# reaped took (setup, call and teardown, a module's teardown with its last test) and the wall seconds, to
# <dir>/<pid>.tsv: where `make test`'s time goes, for the tiers' layout (tests/tiers.py). Off by default.
CPU_LOG = os.environ.get("RELAY_TEST_CPU")


def _cpu_seconds() -> float:
    import resource

    own, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + reaped.ru_utime + reaped.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    if not CPU_LOG:
        yield
        return
    import time

    cpu, wall = _cpu_seconds(), time.monotonic()
    yield
    cpu, wall = _cpu_seconds() - cpu, time.monotonic() - wall
    with open(os.path.join(CPU_LOG, f"{os.getpid()}.tsv"), "a") as out:
        out.write(f"{item.nodeid}\t{cpu:.2f}\t{wall:.2f}\n")
