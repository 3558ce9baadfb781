"""The one module that converts between timedelta/datetime and seconds/milliseconds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gateway import units


@pytest.mark.parametrize("ms", [0, 1, 999, 1000, 60_000, 3_600_000, 86_400_000 * 400, 2**53])
def test_ms_round_trip(ms: int) -> None:
    assert units.timedelta_to_ms(units.ms_to_timedelta(ms)) == ms


@pytest.mark.parametrize("secs", [1, 3, 60, 604_800])
def test_seconds_round_trip(secs: int) -> None:
    value = units.seconds_to_timedelta(secs)
    assert value == timedelta(seconds=secs)
    assert units.timedelta_to_seconds(value) == secs
    assert units.timedelta_to_ms(value) == secs * 1000  # never divided or multiplied twice


def test_optional_none_passes_through() -> None:
    assert units.optional_ms_to_timedelta(None) is None
    assert units.optional_timedelta_to_ms(None) is None


def test_epoch_ms() -> None:
    instant = datetime(2026, 11, 30, 12, 0, 0, 123_000, tzinfo=UTC)
    ms = units.datetime_to_epoch_ms(instant)
    assert ms == 1_796_040_000_123
    assert units.epoch_ms_to_datetime(ms) == instant
    with pytest.raises(ValueError):
        units.datetime_to_epoch_ms(datetime(2026, 1, 1))  # noqa: DTZ001 — the naive input under test
