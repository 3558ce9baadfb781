"""The Temporal SDK's log throttle (``core.logs.SdkLogThrottle``), fed records: one line per kind per window, the
rest counted in one summary line; Relay's own loggers and other levels untouched. `relay dev` with it, through a
Temporal outage: tests/e2e/test_dev_supervision.py."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

import pytest

from core.logs import CORE_LOGGER, SUMMARY_LOGGER, SdkLogThrottle, report_suppressed


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class _CoreLog:  # the shape of temporalio.bridge.runtime.BufferedLogEntry the throttle reads
    target: str
    fields: dict[str, str]


def _record(name: str, msg: str, level: int = logging.WARNING, core: _CoreLog | None = None) -> logging.LogRecord:
    record = logging.LogRecord(name, level, "(test)", 0, msg, None, None)
    if core is not None:
        record.__dict__["temporal_log"] = core
    return record


def _throttle() -> tuple[SdkLogThrottle, _Clock]:
    clock = _Clock()
    return SdkLogThrottle(window=timedelta(minutes=1), clock=clock, report_on_timer=False), clock


def test_throttle_lets_one_line_per_kind_per_window_and_counts_the_rest() -> None:
    throttle, clock = _throttle()
    unavailable = {"error": 'Status { code: Unavailable, message: "tcp connect error", source: Some(...) }'}
    first = _record(CORE_LOGGER, "gRPC call poll_workflow_task_queue retried 6 times",
                    core=_CoreLog("temporalio_client::retry", unavailable))
    assert throttle.filter(first)
    assert first.getMessage() == "gRPC call poll_workflow_task_queue retried 6 times: Unavailable: tcp connect error"
    for n in range(50):  # other calls, other counts: the same kind (Core's retry module)
        clock.now += 0.1
        call = "poll_activity_task_queue" if n % 2 else "poll_workflow_task_queue"
        assert not throttle.filter(_record(CORE_LOGGER, f"gRPC call {call} retried {n} times",
                                           core=_CoreLog("temporalio_client::retry", unavailable)))
    # Another kind is let through once too; a Python-side template counts its numbers as the same kind.
    assert throttle.filter(_record("temporalio.worker._workflow", "Failed handling activation on run %s"))
    assert not throttle.filter(_record("temporalio.worker._workflow", "Failed handling activation on run %s"))
    clock.now = 1000.1 + 60  # a minute after the first suppressed one
    summary = throttle.take_summary()
    assert summary is not None and summary.startswith("51 Temporal SDK warnings suppressed in the last 60 s"), summary
    assert "retried 0 times: Unavailable: tcp connect error" in summary
    assert throttle.take_summary() is None
    assert throttle.filter(_record(CORE_LOGGER, "gRPC call x retried 9 times",
                                   core=_CoreLog("temporalio_client::retry", unavailable))), "a new window"


def test_throttle_leaves_relay_and_other_levels_alone() -> None:
    throttle, _ = _throttle()
    for _ in range(20):
        assert throttle.filter(_record("relay.contact", "Temporal at 127.0.0.1:7233 is unreachable: %s"))
        assert throttle.filter(_record("relay.dev", "embedded Temporal (pid %s) was killed"))
        assert throttle.filter(_record("temporalio.worker._worker", "Beginning worker shutdown", logging.INFO))
        assert throttle.filter(_record("temporalio.worker._worker", "fatal", logging.CRITICAL))
        assert throttle.filter(_record("temporalitos", "not the SDK"))
    assert throttle.take_summary() is None


def test_throttle_decides_once_per_record_whatever_the_number_of_handlers() -> None:
    throttle, _ = _throttle()
    record = _record("temporalio.activity", "Failed completing activity task")
    assert throttle.filter(record) and throttle.filter(record)  # the root logger's second handler sees it too
    again = _record("temporalio.activity", "Failed completing activity task")
    assert not throttle.filter(again) and not throttle.filter(again)
    assert (throttle.take_summary() or "").startswith("1 Temporal SDK warnings suppressed")


def test_an_exit_past_atexit_still_reports_what_was_suppressed(caplog: pytest.LogCaptureFixture) -> None:
    """``core.temporal.exit_now`` skips the atexit hook that reports the throttle's count: it reports it itself,
    through ``report_suppressed``, from the filter on the root logger's handlers."""
    throttle, _ = _throttle()
    handler = logging.NullHandler()
    handler.addFilter(throttle)
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        for _ in range(4):
            throttle.filter(_record("temporalio.activity", "Failed completing activity task"))
        with caplog.at_level(logging.WARNING, logger=SUMMARY_LOGGER):
            report_suppressed()
    finally:
        root.removeHandler(handler)
    assert [r.getMessage()[:42] for r in caplog.records if r.name == SUMMARY_LOGGER] == [
        "3 Temporal SDK warnings suppressed in the "]
    assert throttle.take_summary() is None
