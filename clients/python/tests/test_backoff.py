"""``Backoff``: 1 s doubling to 30 s, each delay in the upper fifth of its step, back to 1 s on ``reset``."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest

from relay_dbos.connection import Backoff


def _seconds(backoff: Backoff, count: int) -> list[float]:
    return [backoff.next().total_seconds() for _ in range(count)]


@pytest.mark.parametrize("seed", range(20))
def test_delays_double_from_one_second_to_thirty_jittered_downwards(seed: int) -> None:
    delays = _seconds(Backoff(rng=random.Random(seed)), 40)
    steps = [min(30.0, 2.0 ** n) for n in range(40)]
    assert 0.8 <= delays[0] <= 1.0
    for delay, step in zip(delays, steps, strict=True):
        assert 0.8 * step <= delay <= step
        assert delay <= 30.0
    # Each delay is drawn from its own step: the steps double, so five in a row cannot all fall below 0.8 of it.
    assert delays[5] > delays[4] > delays[3] > delays[2] > delays[1] > delays[0]
    assert all(delay >= 24.0 for delay in delays[5:])


def test_the_jitter_spreads_a_fleet() -> None:
    firsts = {Backoff(rng=random.Random(seed)).next() for seed in range(50)}
    assert len(firsts) == 50
    assert min(firsts) < timedelta(seconds=0.85) and max(firsts) > timedelta(seconds=0.95)


def test_reset_returns_to_one_second() -> None:
    backoff = Backoff(rng=random.Random(7))
    assert _seconds(backoff, 10)[-1] >= 24.0
    backoff.reset()
    assert 0.8 <= backoff.next().total_seconds() <= 1.0
    assert 1.6 <= backoff.next().total_seconds() <= 2.0


def test_an_attempt_count_far_past_the_cap_stays_at_the_cap() -> None:
    backoff = Backoff(rng=random.Random(3), attempts=10_000)
    assert 24.0 <= backoff.next().total_seconds() <= 30.0


def test_a_shorter_schedule_as_the_tests_use_it() -> None:
    backoff = Backoff(initial=timedelta(milliseconds=10), cap=timedelta(milliseconds=40), jitter=0.0,
                      rng=random.Random(1))
    assert _seconds(backoff, 5) == [0.01, 0.02, 0.04, 0.04, 0.04]
