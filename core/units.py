"""Every conversion between ``timedelta``/``datetime`` and seconds or milliseconds lives here.

Seconds and milliseconds exist only at the REST schema and the wire message; a mix-up is a 1000x error
(60 ms instead of 60 s declares executors dead during a fast restart), so nothing else multiplies by 1000.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any


def utcnow() -> datetime:
    """Now, in UTC."""
    return datetime.now(UTC)


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


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def datetime_to_epoch_ms(value: datetime) -> int:
    """Epoch milliseconds for the wire (retention cutoffs). ``value`` must be timezone-aware."""
    if value.tzinfo is None:
        raise ValueError("naive datetime")
    return timedelta_to_ms(value - EPOCH)


def epoch_ms_to_datetime(ms: int) -> datetime:
    return EPOCH + timedelta(milliseconds=ms)


def rest_duration(name: str, value: timedelta | None) -> int | None:
    """A duration as the REST field ``name`` carries it: whole seconds for a name ending in ``Secs``
    (``executorTimeoutSecs``), milliseconds for one ending in ``Ms`` (``gcTimeThresholdMs``)."""
    if name.endswith("Secs"):
        return None if value is None else timedelta_to_seconds(value)
    if name.endswith("Ms"):
        return optional_timedelta_to_ms(value)
    raise ValueError(f"{name!r} states no unit: a REST duration's name ends in Secs or Ms")


def rest_durations(durations: Mapping[str, timedelta | None]) -> dict[str, int | None]:
    """Durations keyed by their REST names, each in the unit its name states: what an audit row's details carry."""
    return {name: rest_duration(name, value) for name, value in durations.items()}


# A retention or timeout threshold under a second is a unit slip, never a setting: ``gcTimeThresholdMs: 7`` meant as
# 7 s or 7 days deletes every finished workflow at the next retention round (``globalTimeoutMs`` cancels every
# running one). The REST API refuses it, reading the value back in the other units.
MIN_THRESHOLD = timedelta(seconds=1)


def threshold_ms_problem(name: str, ms: int) -> str | None:
    """Why ``ms`` milliseconds is refused for the threshold ``name`` (a REST field in ms), or None when it is at
    least ``MIN_THRESHOLD``: ``7 ms — did you mean 7 s (7000) or 7 days (604800000)? ...``."""
    if ms >= timedelta_to_ms(MIN_THRESHOLD):  # compared as integers: any int64 a client sends fits no timedelta
        return None
    floor = f"{name} is in milliseconds, at least {timedelta_to_ms(MIN_THRESHOLD)} (1 s); null clears it"
    if ms <= 0:
        return f"{ms} ms: {floor}"
    return (f"{ms} ms — did you mean {ms} s ({timedelta_to_ms(timedelta(seconds=ms))}) or {ms} days "
            f"({timedelta_to_ms(timedelta(days=ms))})? {floor}")


# An application's settings: storage field -> REST field. The durations among them are converted by the unit
# their REST name states.
APP_SETTING_REST_NAMES = {
    "executor_timeout": "executorTimeoutSecs",
    "gc_time_threshold": "gcTimeThresholdMs",
    "gc_rows_threshold": "gcRowsThreshold",
    "global_timeout": "globalTimeoutMs",
    "private_mode": "privateMode",
    "cross_version_recovery": "crossVersionRecovery",
}


def app_settings_to_rest(settings: Mapping[str, Any]) -> dict[str, Any]:
    """App settings under their storage names (durations as ``timedelta``) -> their REST names and units, as the
    audit log records them. A setting with no REST name is a ``KeyError``: name it above first."""
    out: dict[str, Any] = {}
    for field, value in settings.items():
        name = APP_SETTING_REST_NAMES[field]
        out[name] = rest_duration(name, value) if isinstance(value, timedelta) else value
    return out


# -- workflow management: the SDKs' conductor replies and requests --------------------------------------------


def epoch_ms_text_to_datetime(value: str | int) -> datetime:
    """An instant as the SDKs' conductor replies carry it: epoch milliseconds, as a decimal string
    (``WorkflowsOutput.CreatedAt`` is ``str(created_at)`` in Python, ``String(createdAt)`` in TypeScript) or as an
    integer (``ApplicationVersionOutput.version_timestamp``). Raises ``ValueError`` for anything else, and for an
    instant a ``datetime`` cannot hold."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValueError(f"not epoch milliseconds: {value!r}")
    text = value.strip() if isinstance(value, str) else str(value)
    if not text.lstrip("-").isdigit():
        raise ValueError(f"not epoch milliseconds: {value!r}")
    try:
        return epoch_ms_to_datetime(int(text))
    except OverflowError:
        raise ValueError(f"epoch milliseconds out of range: {value!r}") from None


def datetime_to_epoch_ms_text(value: datetime) -> str:
    """The inverse of ``epoch_ms_text_to_datetime`` (to the millisecond), as the Python SDK writes it."""
    return str(datetime_to_epoch_ms(value))


def datetime_to_wire_iso(value: datetime) -> str:
    """An instant for an SDK request field that the SDK parses with ``datetime.fromisoformat`` (list filters,
    ``get_metrics``, ``backfill_schedule``): UTC with an explicit ``+00:00`` offset, which Python before 3.11
    (no ``Z``), JavaScript's ``Date`` and Go's RFC 3339 parser all read. ``value`` must be timezone-aware."""
    if value.tzinfo is None:
        raise ValueError("naive datetime")
    return value.astimezone(UTC).isoformat()


def seconds_between(start: datetime, end: datetime) -> int:
    """Whole seconds from ``start`` to ``end``, rounded down (a metric's ``granularity``)."""
    return timedelta_to_seconds(end - start)


def iso_to_utc(value: object) -> datetime | None:
    """An ISO 8601 instant as an aware UTC datetime (one without a zone is taken as UTC); None for anything that
    is not one (a value shown to a person, or passed on, rather than failing a whole list)."""
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
