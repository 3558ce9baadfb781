"""SQLite's one thread (``core.store._SerialThread``): calls run one at a time, in order, except that a call
submitted ``first`` (a status write or read, ``Store.call_first``) goes ahead of the others still waiting."""

from __future__ import annotations

import functools
import threading

import pytest

from core.store import _SerialThread


def test_first_calls_overtake_the_waiting_ones_and_each_kind_keeps_its_order() -> None:
    serial = _SerialThread("test-serial")
    release = threading.Event()
    ran: list[str] = []
    blocker = serial.submit(lambda: release.wait(5))  # the thread is busy while the others are queued
    futures = [serial.submit(functools.partial(ran.append, f"later-{n}")) for n in range(3)]
    futures += [serial.submit(functools.partial(ran.append, f"first-{n}"), first=True) for n in range(2)]
    release.set()
    blocker.result(timeout=5)
    for f in futures:
        f.result(timeout=5)
    assert ran == ["first-0", "first-1", "later-0", "later-1", "later-2"]


def test_a_failing_call_hands_its_error_over_and_the_thread_goes_on() -> None:
    serial = _SerialThread("test-serial")

    def fail() -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        serial.submit(fail).result(timeout=5)
    assert serial.submit(lambda: 42).result(timeout=5) == 42


def test_a_call_cancelled_before_it_ran_does_not_run() -> None:
    serial = _SerialThread("test-serial")
    release = threading.Event()
    ran: list[str] = []
    blocker = serial.submit(lambda: release.wait(5))
    cancelled = serial.submit(lambda: ran.append("cancelled"))
    assert cancelled.cancel()
    release.set()
    blocker.result(timeout=5)
    serial.submit(lambda: ran.append("after")).result(timeout=5)
    assert ran == ["after"]
