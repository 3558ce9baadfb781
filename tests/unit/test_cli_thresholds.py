"""A retention threshold or global timeout set too short deletes (cancels) most of an app's workflows at the next
retention round (``gcTimeThresholdMs: 7`` once deleted every finished workflow). Under a second the REST API
refuses it (``core.units.threshold_ms_problem``; the 422 itself: tests/api/test_rest.py); under an hour
``relay apps update|register`` asks first, and without a terminal refuses unless ``--yes``."""

from __future__ import annotations

import io
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from api.schemas import PatchAppInputBody
from core import units
from tests.unit import test_cli_output
from tests.unit.test_cli_output import FakeApi, Run

cli = test_cli_output.run  # a fixture: the admin CLI against a FakeApi


@given(st.integers(min_value=1, max_value=999))
def test_under_a_second_reads_the_value_back_in_seconds_and_days(ms: int) -> None:
    problem = units.threshold_ms_problem("gcTimeThresholdMs", ms)
    assert problem is not None
    assert problem.startswith(f"{ms} ms — did you mean {ms} s ({ms * 1000}) or {ms} days ({ms * 86_400_000})? ")
    assert "gcTimeThresholdMs is in milliseconds, at least 1000" in problem


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_the_rest_bound_is_one_second(ms: int) -> None:
    """Over the whole int64 range: refused exactly below 1000 ms (and above 100 years), never a crash."""
    for field in ("gcTimeThresholdMs", "globalTimeoutMs"):
        try:
            PatchAppInputBody.model_validate({field: ms})
        except ValueError:
            assert ms < 1000 or ms > 36_525 * 86_400_000
        else:
            assert ms >= 1000
    assert (units.threshold_ms_problem("globalTimeoutMs", ms) is None) == (ms >= 1000)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("flags", [["--gc-time-threshold-ms", "1500"], ["--global-timeout", "59m"],
                                   ["--gc-time-threshold", "30m", "--global-timeout", "1h"]])
def test_under_an_hour_is_refused_without_a_terminal_unless_yes(cli: Callable[[FakeApi], Run], flags: list[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeApi({"orders"})
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    with pytest.raises(SystemExit) as refused:
        cli(fake)("apps", "update", "orders", *flags)
    message = str(refused.value.code)
    assert "is under 1h: at the next retention round" in message and "pass --yes" in message
    assert fake.writes() == []
    cli(fake)("apps", "update", "orders", *flags, "--yes")
    assert [method for method, _, _ in fake.writes()] == ["PATCH"]


def test_under_an_hour_is_asked_on_a_terminal(cli: Callable[[FakeApi], Run], monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeApi(set())
    monkeypatch.setattr("sys.stdin", Terminal("n\n"))
    with pytest.raises(SystemExit) as declined:
        cli(fake)("apps", "register", "orders", "--gc-time-threshold", "10m")
    assert declined.value.code == "relay: nothing was changed" and fake.writes() == []
    monkeypatch.setattr("sys.stdin", Terminal("y\n"))
    out, err = cli(fake)("apps", "register", "orders", "--gc-time-threshold", "10m", "-o", "json")
    assert "--gc-time-threshold 10m is under 1h" in err and err.endswith("Continue? [y/N] ")
    assert fake.writes() == [("PUT", "/apps/orders", None), ("PATCH", "/apps/orders", {"gcTimeThresholdMs": 600_000})]
    assert out.startswith("{")  # the question went to stderr: stdout is still the JSON


@pytest.mark.parametrize("flags", [["--gc-time-threshold", "1h"], ["--global-timeout-ms", "999"],
                                   ["--executor-timeout", "5s"], ["--gc-time-threshold", "none"]])
def test_nothing_to_confirm(cli: Callable[[FakeApi], Run], monkeypatch: pytest.MonkeyPatch, flags: list[str]) -> None:
    """An hour or more, a value the REST API refuses anyway (under a second), a setting that deletes nothing, or a
    cleared one: sent without a question."""
    fake = FakeApi({"orders"})
    monkeypatch.setattr("sys.stdin", io.StringIO(""))
    cli(fake)("apps", "update", "orders", *flags)
    assert [method for method, _, _ in fake.writes()] == ["PATCH"]
