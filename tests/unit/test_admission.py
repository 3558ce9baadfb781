"""Admission bookkeeping, with a fake clock."""

from __future__ import annotations

import pytest

from core.errors import AuthError, ForbiddenError, RateLimitedError
from gateway.admission import Admission


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_origin_absent_is_fine_present_must_be_listed() -> None:
    a = Admission(clock=Clock(), allowed_origins=frozenset({"https://ops.example"}))
    a.check_origin(None)
    a.check_origin("https://ops.example")
    with pytest.raises(ForbiddenError):
        a.check_origin("https://evil.example")


def test_unknown_key_is_refused_from_memory_then_forgotten() -> None:
    clock = Clock()
    a = Admission(clock=clock)
    a.check_unknown("h")
    a.remember_unknown("h")
    with pytest.raises(AuthError):
        a.check_unknown("h")
    clock.now += 2.5
    a.check_unknown("h")  # looked up again: it may have been created meanwhile


def test_connection_cap_and_release() -> None:
    a = Admission(clock=Clock(), max_connections_per_key=2, handshakes_per_second=100)
    a.admit("k")
    a.admit("k")
    with pytest.raises(RateLimitedError):
        a.admit("k")
    a.release("k")
    a.admit("k")
    assert a.open_connections("k") == 2
    a.admit("other")  # caps are per key


def test_handshake_rate_refills_with_time() -> None:
    clock = Clock()
    a = Admission(clock=clock, handshakes_per_second=3)
    for _ in range(3):
        a.admit("k")
        a.release("k")
    with pytest.raises(RateLimitedError):
        a.admit("k")
    clock.now += 1 / 3
    a.admit("k")


def test_reports_are_rate_limited_per_source_and_reason() -> None:
    clock = Clock()
    a = Admission(clock=clock)
    assert a.should_report("1.2.3.4", "401:app")
    assert not a.should_report("1.2.3.4", "401:app")
    assert a.should_report("1.2.3.5", "401:app")
    assert a.suppressed == 1
    clock.now += 61
    assert a.should_report("1.2.3.4", "401:app")
