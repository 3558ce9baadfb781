"""The one module that converts between timedelta/datetime and seconds/milliseconds, and every path through it:
the REST models (``api.schemas``), storage, and the admin CLI's flags and human durations.

A mix-up is a 1000x error, so the properties below pin each path to exactly one multiplication or division.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from api import schemas
from cli import admin as admin_cli
from cli import common
from cli.tables import DURATION_UNITS, format_duration
from core import models, units
from core.store import Store

MAX_MS = units.timedelta_to_ms(timedelta.max)
MAX_SECONDS = units.timedelta_to_seconds(timedelta.max)
INT64_MAX = 2**63 - 1  # the upstream contract's `format: int64`: what a client may send
# The bounds Relay accepts (each one a 422 beyond), written out here so a change to them is a decision.
MAX_EXECUTOR_TIMEOUT_SECS = 7 * 86_400
MAX_RETENTION_MS = 36_525 * 86_400_000  # 100 years
MIN_THRESHOLD_MS = 1000  # a retention threshold or global timeout under a second is a unit slip: refused
MAX_ROWS = 2**53 - 1

ms_values = st.integers(min_value=0, max_value=MAX_MS)
seconds_values = st.integers(min_value=0, max_value=MAX_SECONDS)


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


# -- properties of core.units -------------------------------------------------------------------------------


@given(ms_values)
@example(MAX_MS)
def test_ms_to_timedelta_and_back_is_identity(ms: int) -> None:
    value = units.ms_to_timedelta(ms)
    assert value == timedelta(milliseconds=ms)
    assert units.timedelta_to_ms(value) == ms
    assert units.optional_timedelta_to_ms(units.optional_ms_to_timedelta(ms)) == ms


@given(seconds_values)
@example(MAX_SECONDS)
def test_seconds_to_ms_multiplies_exactly_once(secs: int) -> None:
    value = units.seconds_to_timedelta(secs)
    assert value == timedelta(seconds=secs)
    assert units.timedelta_to_seconds(value) == secs
    assert units.timedelta_to_ms(value) == secs * 1000


@given(ms_values)
@example(86_400_000 * 999_999_999 - 1)  # where float seconds round up to the next whole second
@example(9_007_199_254_740_993)  # 2**53 + 1: not a float
def test_ms_to_seconds_divides_exactly_once(ms: int) -> None:
    assert units.timedelta_to_seconds(units.ms_to_timedelta(ms)) == ms // 1000


@given(st.timedeltas())
@example(timedelta(milliseconds=-1500))
def test_timedelta_to_units_floors_like_integer_division(value: timedelta) -> None:
    # Any timedelta, negative and sub-millisecond ones included: whole units, rounded down, never via a float.
    assert units.timedelta_to_ms(value) == value // timedelta(milliseconds=1)
    assert units.timedelta_to_seconds(value) == value // timedelta(seconds=1)


# Aware datetimes in any fixed offset, far enough from the calendar's ends that UTC stays in range.
aware_datetimes = st.datetimes(
    min_value=datetime(2, 1, 1), max_value=datetime(9998, 12, 31),  # noqa: DTZ001 — hypothesis bounds are naive
    timezones=st.integers(min_value=-23 * 60, max_value=23 * 60).map(lambda m: timezone(timedelta(minutes=m))),
)


@given(aware_datetimes)
def test_datetime_to_epoch_ms_floors_to_the_millisecond(instant: datetime) -> None:
    ms = units.datetime_to_epoch_ms(instant)
    back = units.epoch_ms_to_datetime(ms)
    assert back.tzinfo is not None
    assert back <= instant < back + timedelta(milliseconds=1)
    if instant.microsecond % 1000 == 0:
        assert back == instant


@given(st.integers(min_value=units.datetime_to_epoch_ms(datetime(1, 1, 2, tzinfo=UTC)),
                   max_value=units.datetime_to_epoch_ms(datetime(9999, 12, 30, tzinfo=UTC))))
def test_epoch_ms_to_datetime_and_back_is_identity(ms: int) -> None:
    instant = units.epoch_ms_to_datetime(ms)
    assert instant == datetime(1970, 1, 1, tzinfo=UTC) + timedelta(milliseconds=ms)
    assert units.datetime_to_epoch_ms(instant) == ms


@given(st.datetimes())
def test_naive_datetimes_are_refused(instant: datetime) -> None:
    with pytest.raises(ValueError):
        units.datetime_to_epoch_ms(instant)


# -- the REST models through storage -----------------------------------------------------------------------------

SETTINGS_FIELDS = ("executorTimeoutSecs", "gcTimeThresholdMs", "gcRowsThreshold", "globalTimeoutMs", "privateMode")


def patch_bodies(*, max_ms: int = MAX_RETENTION_MS, max_rows: int = MAX_ROWS) -> st.SearchStrategy[dict[str, Any]]:
    """``PatchAppInputBody`` JSON: any subset of the fields, ``null`` clearing a retention one."""
    ms, rows = st.integers(min_value=MIN_THRESHOLD_MS, max_value=max_ms), st.integers(min_value=1, max_value=max_rows)
    return st.fixed_dictionaries({}, optional={
        "executorTimeoutSecs": st.integers(min_value=1, max_value=MAX_EXECUTOR_TIMEOUT_SECS),
        "gcTimeThresholdMs": st.none() | ms, "gcRowsThreshold": st.none() | rows,
        "globalTimeoutMs": st.none() | ms, "privateMode": st.booleans(),
    })


def rest_view(app: models.Application) -> dict[str, Any]:
    public = schemas.Application.of(app, available=False, language=None).model_dump()
    return {k: public[k] for k in SETTINGS_FIELDS}


@pytest.fixture(scope="module")
def store() -> Store:
    s = Store(models.make_engine("sqlite://"))
    s.ensure_app("local", "units-app")
    return s


@given(patch_bodies())
def test_patch_changes_are_storage_types_in_the_right_unit(body: dict[str, Any]) -> None:
    changes = schemas.PatchAppInputBody.model_validate(body).changes()
    assert set(changes) == {_storage_name(k) for k in body}
    if "executorTimeoutSecs" in body:
        assert changes["executor_timeout"] == timedelta(seconds=body["executorTimeoutSecs"])
    for field, name in (("gcTimeThresholdMs", "gc_time_threshold"), ("globalTimeoutMs", "global_timeout")):
        if body.get(field) is not None:
            assert changes[name] == timedelta(milliseconds=body[field])
        elif field in body:
            assert changes[name] is None  # explicit null: cleared, not left alone


@settings(deadline=None)  # a database write per example
@given(body=patch_bodies())
def test_patch_then_get_round_trips_through_the_database(store: Store, body: dict[str, Any]) -> None:
    before = rest_view(store.get_app("local", "units-app"))
    changes = schemas.PatchAppInputBody.model_validate(body).changes()
    store.update_app("local", "units-app", changes, subject="test")
    assert rest_view(store.get_app("local", "units-app")) == {**before, **body}  # fields left out: unchanged


@given(secs=st.integers(min_value=1, max_value=MAX_EXECUTOR_TIMEOUT_SECS),
       gc=st.none() | st.integers(min_value=MIN_THRESHOLD_MS, max_value=MAX_RETENTION_MS),
       timeout=st.none() | st.integers(min_value=MIN_THRESHOLD_MS, max_value=MAX_RETENTION_MS),
       rows=st.none() | st.integers(min_value=1, max_value=MAX_ROWS), private=st.booleans())
def test_stored_settings_round_trip_through_the_rest_models(secs: int, gc: int | None, timeout: int | None,
                                                            rows: int | None, private: bool) -> None:
    stored = models.Application(org="local", name="a", executor_timeout=timedelta(seconds=secs),
                                gc_time_threshold=None if gc is None else timedelta(milliseconds=gc),
                                global_timeout=None if timeout is None else timedelta(milliseconds=timeout),
                                gc_rows_threshold=rows, private_mode=private)
    changes = schemas.PatchAppInputBody.model_validate(rest_view(stored)).changes()
    assert changes == {"executor_timeout": stored.executor_timeout, "gc_time_threshold": stored.gc_time_threshold,
                       "global_timeout": stored.global_timeout, "gc_rows_threshold": rows, "private_mode": private}


@settings(deadline=None)
@given(body=patch_bodies(max_ms=INT64_MAX, max_rows=INT64_MAX))
@example(body={"gcTimeThresholdMs": INT64_MAX})  # beyond timedelta: OverflowError, a 500, unless refused
@example(body={"globalTimeoutMs": 3_000_000 * 86_400_000})  # beyond SQLite's Interval (1970 + value)
@example(body={"gcTimeThresholdMs": MAX_RETENTION_MS, "globalTimeoutMs": MAX_RETENTION_MS,
               "executorTimeoutSecs": MAX_EXECUTOR_TIMEOUT_SECS, "gcRowsThreshold": MAX_ROWS})
def test_every_accepted_patch_is_stored(store: Store, body: dict[str, Any]) -> None:
    # Over the whole int64 range a client may send: a 422, or stored and read back unchanged; never a crash.
    try:
        changes = schemas.PatchAppInputBody.model_validate(body).changes()
    except ValidationError:
        return  # refused with a 422: fine
    store.update_app("local", "units-app", changes, subject="test")
    assert {k: v for k, v in rest_view(store.get_app("local", "units-app")).items() if k in body} == body


def _storage_name(field: str) -> str:
    return {"executorTimeoutSecs": "executor_timeout", "gcTimeThresholdMs": "gc_time_threshold",
            "gcRowsThreshold": "gc_rows_threshold", "globalTimeoutMs": "global_timeout",
            "privateMode": "private_mode"}[field]


# -- the admin CLI: human durations and dbos-ctl's flags -------------------------------------------------------

unit_names = st.sampled_from(sorted(DURATION_UNITS))


def cli_body(*flags: str) -> dict[str, Any]:
    """The PATCH body ``relay apps update some-app FLAGS`` sends (parsed by the real admin parser)."""
    root = argparse.ArgumentParser()
    sub = root.add_subparsers(dest="command", required=True)
    keys = sub.add_parser("keys").add_subparsers(dest="keys_command", required=True)
    keys.add_parser("create")
    admin_cli.add_commands(sub, keys)
    return admin_cli.settings_body(root.parse_args(["apps", "update", "some-app", *flags]))


@given(st.integers(min_value=0, max_value=999_999_999), unit_names)
def test_parse_duration_one_unit(count: int, unit: str) -> None:
    assert common.parse_duration(f"{count}{unit}") == timedelta(**{DURATION_UNITS[unit]: count})


@given(st.lists(st.tuples(st.integers(min_value=0, max_value=10**6), unit_names), min_size=1, max_size=6))
def test_parse_duration_sums_a_sequence(parts: list[tuple[int, str]]) -> None:
    text = "".join(f"{n}{u}" for n, u in parts)
    assert common.parse_duration(text) == sum((timedelta(**{DURATION_UNITS[u]: n}) for n, u in parts),
                                                 timedelta())


@given(ms_values)
@example(90_000)
@example(0)
def test_format_duration_is_parsed_back_exactly(ms: int) -> None:
    value = units.ms_to_timedelta(ms)
    assert common.parse_duration(format_duration(value)) == value


@pytest.mark.parametrize("text", ["", "90", "s", "1.5h", "-5s", "5 s", "5x", "1h 30m", "h1", "5sec", "9" * 30 + "d"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        common.parse_duration(text)


@pytest.mark.parametrize(("flags", "body"), [
    (["--executor-timeout", "90s"], {"executorTimeoutSecs": 90}),
    (["--executor-timeout", "2m"], {"executorTimeoutSecs": 120}),
    (["--executor-timeout-secs", "90"], {"executorTimeoutSecs": 90}),
    (["--gc-time-threshold", "7d"], {"gcTimeThresholdMs": 604_800_000}),
    (["--gc-time-threshold-ms", "1500"], {"gcTimeThresholdMs": 1500}),
    (["--global-timeout", "12h"], {"globalTimeoutMs": 43_200_000}),
    (["--global-timeout-ms", "250"], {"globalTimeoutMs": 250}),
    (["--gc-rows-threshold", "500"], {"gcRowsThreshold": 500}),
    (["--gc-time-threshold", "none", "--global-timeout-ms", "null", "--gc-rows-threshold", "none"],
     {"gcTimeThresholdMs": None, "globalTimeoutMs": None, "gcRowsThreshold": None}),
    (["--private-mode"], {"privateMode": True}),
    ([], {}),
])
def test_cli_flags_become_the_rest_body(flags: list[str], body: dict[str, Any]) -> None:
    assert cli_body(*flags) == body


@given(st.integers(min_value=0, max_value=MAX_EXECUTOR_TIMEOUT_SECS * 10), st.sampled_from(["s", "m", "h", "d"]))
def test_cli_executor_timeout_is_whole_seconds_once(count: int, unit: str) -> None:
    seconds = {"s": 1, "m": 60, "h": 3600, "d": 86_400}[unit] * count
    assert cli_body("--executor-timeout", f"{count}{unit}") == {"executorTimeoutSecs": seconds}
    assert cli_body("--executor-timeout-secs", str(count)) == {"executorTimeoutSecs": count}


@given(st.integers(min_value=1, max_value=10**9))
def test_cli_executor_timeout_refuses_fractions_of_a_second(ms: int) -> None:
    assume(ms % 1000)
    stderr = io.StringIO()
    with pytest.raises(SystemExit) as refused, contextlib.redirect_stderr(stderr):
        cli_body("--executor-timeout", f"{ms}ms")
    assert refused.value.code == 2 and "whole seconds" in stderr.getvalue()


@given(st.integers(min_value=0, max_value=10**15), st.sampled_from(["--gc-time-threshold", "--global-timeout"]))
def test_cli_millisecond_flags_agree(ms: int, flag: str) -> None:
    field = "gcTimeThresholdMs" if flag == "--gc-time-threshold" else "globalTimeoutMs"
    assert cli_body(f"{flag}-ms", str(ms)) == cli_body(flag, f"{ms}ms") == {field: ms}
    if ms % 1000 == 0:
        assert cli_body(flag, f"{ms // 1000}s") == {field: ms}


@given(patch_bodies())
def test_cli_to_storage_is_the_rest_path(body: dict[str, Any]) -> None:
    # What the CLI sends for a setting is what the REST model stores for it: CLI → REST → storage, in one step each.
    flags = {"executorTimeoutSecs": "--executor-timeout-secs", "gcTimeThresholdMs": "--gc-time-threshold-ms",
             "gcRowsThreshold": "--gc-rows-threshold", "globalTimeoutMs": "--global-timeout-ms"}
    argv = [a for k, v in body.items() if k in flags for a in (flags[k], "none" if v is None else str(v))]
    argv += [f"--{'' if body['privateMode'] else 'no-'}private-mode"] if "privateMode" in body else []
    sent = cli_body(*argv)
    assert sent == body
    assert schemas.PatchAppInputBody.model_validate(sent).changes() == \
        schemas.PatchAppInputBody.model_validate(body).changes()


@pytest.mark.parametrize(("field", "bound"), [
    ("executorTimeoutSecs", MAX_EXECUTOR_TIMEOUT_SECS), ("gcTimeThresholdMs", MAX_RETENTION_MS),
    ("globalTimeoutMs", MAX_RETENTION_MS), ("gcRowsThreshold", MAX_ROWS),
])
def test_patch_bounds(field: str, bound: int) -> None:
    schemas.PatchAppInputBody.model_validate({field: bound})
    for refused in (0, bound + 1):
        with pytest.raises(ValidationError):
            schemas.PatchAppInputBody.model_validate({field: refused})
