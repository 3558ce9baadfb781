"""Candidate selection as a pure function (``core.candidates``): which HEALTHY executor carries a recovery or a
retention round. The store's queries around it are tested against real databases in ``test_store_recovery``."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from core.candidates import select_candidate, select_retention_executor

T0 = datetime(2025, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Row:
    executor_id: str
    app_version: str = "v1"
    created_at: datetime = T0


def _ids(rows: list[Row]) -> list[str]:
    return [r.executor_id for r in rows]


# -- recovery ----------------------------------------------------------------------------------------------------


def test_same_version_only_by_default() -> None:
    rows = [Row("a", "v1"), Row("b", "v2")]
    assert select_candidate(rows, app_version="v1") == (rows[0], False)
    assert select_candidate(rows, app_version="v3") is None


def test_excluded_executors_are_never_chosen() -> None:
    rows = [Row("dead"), Row("failed"), Row("ok")]
    assert select_candidate(rows, app_version="v1", exclude={"dead", "failed"}) == (rows[2], False)
    assert select_candidate(rows, app_version="v1", exclude=_ids(rows)) is None


def test_cross_version_only_when_allowed_and_none_of_the_version_is_left() -> None:
    rows = [Row("old", "v1"), Row("new", "v2")]
    assert select_candidate(rows, app_version="v1", exclude={"old"}) is None
    assert select_candidate(rows, app_version="v1", exclude={"old"}, cross_version_allowed=True) == (rows[1], True)
    # A peer of the dead executor's own version still goes first.
    assert select_candidate(rows, app_version="v1", cross_version_allowed=True) == (rows[0], False)
    assert select_candidate([], app_version="v1", cross_version_allowed=True) is None


def test_least_loaded_peer_is_chosen() -> None:
    rows = [Row("a"), Row("b"), Row("c")]
    claims = {"dead-1": "a", "dead-2": "a", "dead-3": "b"}
    for seed in range(20):
        found = select_candidate(rows, app_version="v1", claims=claims, dead_executor_id="dead-4",
                                 rng=random.Random(seed))
        assert found == (rows[2], False)


def test_the_dead_executors_own_claim_does_not_count() -> None:
    """Recovery moving on to another peer: the claim being replaced must not weigh against its own peer."""
    rows = [Row("a"), Row("b")]
    claims = {"dead-1": "a", "dead-2": "b"}
    assert select_candidate(rows, app_version="v1", claims=claims, dead_executor_id="dead-1") == (rows[0], False)


def test_ties_are_broken_at_random_so_a_crowd_spreads() -> None:
    rows = [Row("a"), Row("b"), Row("c")]
    rng = random.Random(7)
    picks = Counter(_select_id(rows, rng) for _ in range(300))
    assert set(picks) == {"a", "b", "c"}
    assert min(picks.values()) > 60


def test_a_crowd_of_dead_executors_spreads_evenly_when_claims_accumulate() -> None:
    rows = [Row("a"), Row("b"), Row("c")]
    claims: dict[str, str] = {}
    rng = random.Random(1)
    for n in range(9):
        found = select_candidate(rows, app_version="v1", claims=claims, dead_executor_id=f"dead-{n}", rng=rng)
        assert found is not None
        claims[f"dead-{n}"] = found[0].executor_id
    assert Counter(claims.values()) == {"a": 3, "b": 3, "c": 3}


def _select_id(rows: list[Row], rng: random.Random) -> str:
    found = select_candidate(rows, app_version="v1", rng=rng)
    assert found is not None
    return found[0].executor_id


# -- retention ---------------------------------------------------------------------------------------------------


def _at(minutes: int) -> datetime:
    return T0 + timedelta(minutes=minutes)


def test_retention_prefers_the_newest_version_then_the_newest_executor() -> None:
    rows = [Row("old-1", "v1", _at(0)), Row("new-1", "v2", _at(5)), Row("new-2", "v2", _at(6)),
            Row("old-2", "v1", _at(3))]
    assert select_retention_executor(rows) == rows[2]
    assert select_retention_executor(rows, exclude={"new-2"}) == rows[1]
    assert select_retention_executor(rows, exclude={"new-1", "new-2"}) == rows[3]
    assert select_retention_executor(rows, exclude=_ids(rows)) is None
    assert select_retention_executor([]) is None


def test_excluding_an_executor_does_not_demote_its_version() -> None:
    """v2's newest executor failed: v2 is still the newest version, so its other executor goes next."""
    rows = [Row("v2-early", "v2", _at(1)), Row("v1-late", "v1", _at(5)), Row("v2-latest", "v2", _at(9))]
    assert select_retention_executor(rows, exclude={"v2-latest"}) == rows[0]


def test_retention_ties_break_by_executor_id() -> None:
    rows = [Row("a", "v1", _at(0)), Row("b", "v1", _at(0))]
    assert select_retention_executor(rows) == rows[1]


def test_the_version_the_sdk_calls_latest_comes_first_then_registration_order() -> None:
    """v1's executors registered last, but the SDK says v2 is latest (an operator set it back)."""
    rows = [Row("v2-a", "v2", _at(1)), Row("v1-a", "v1", _at(5)), Row("v2-b", "v2", _at(2)), Row("v1-b", "v1", _at(9))]
    assert select_retention_executor(rows, latest="v2") == rows[2]
    assert select_retention_executor(rows, latest="v2", exclude={"v2-b"}) == rows[0]
    assert select_retention_executor(rows, latest="v2", exclude={"v2-a", "v2-b"}) == rows[3]
    assert select_retention_executor(rows, latest="v9") == rows[3]  # a version nobody runs: registration order
    assert select_retention_executor(rows) == rows[3]
