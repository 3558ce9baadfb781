"""Every conversion between ``timedelta``/``datetime`` and seconds or milliseconds lives here.

Seconds and milliseconds exist only at the REST schema and the wire message; a mix-up is a 1000x error
(60 ms instead of 60 s declares executors dead during a fast restart), so nothing else multiplies by 1000.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta


def seconds_to_timedelta(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def timedelta_to_seconds(value: timedelta) -> int:
    """Whole seconds, rounded down, as ``executorTimeoutSecs`` is an integer on the REST edge."""
    # Integer division of timedeltas is exact; ``int(total_seconds())`` goes through a float, which rounds
    # 86_399_999_999_999.999 s up to the next second, and truncates negatives toward zero unlike ``timedelta_to_ms``.
    return value // timedelta(seconds=1)


def ms_to_timedelta(ms: int) -> timedelta:
    return timedelta(milliseconds=ms)


def timedelta_to_ms(value: timedelta) -> int:
    # Integer arithmetic on the timedelta's parts avoids float rounding on large values.
    return (value.days * 86_400 + value.seconds) * 1000 + value.microseconds // 1000


def optional_ms_to_timedelta(ms: int | None) -> timedelta | None:
    return None if ms is None else ms_to_timedelta(ms)


def optional_timedelta_to_ms(value: timedelta | None) -> int | None:
    return None if value is None else timedelta_to_ms(value)


def datetime_to_epoch_ms(value: datetime) -> int:
    """Epoch milliseconds for the wire (retention cutoffs). ``value`` must be timezone-aware."""
    if value.tzinfo is None:
        raise ValueError("naive datetime")
    return timedelta_to_ms(value - datetime(1970, 1, 1, tzinfo=UTC))


def epoch_ms_to_datetime(ms: int) -> datetime:
    return datetime(1970, 1, 1, tzinfo=UTC) + ms_to_timedelta(ms)
