"""``activities.database``: every activity class meets a database outage the same way, and the worker reports it
once (``OncePerWindow``), whichever activity met it."""

from __future__ import annotations

import logging
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy.exc import IntegrityError, OperationalError
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory
from temporalio.testing import ActivityEnvironment

from activities.database import DATABASE_UNAVAILABLE, database_calls
from activities.gate import GateActivities
from activities.registry import RegistryActivities
from activities.retention import RetentionActivities
from core.logs import OncePerWindow
from core.models import make_engine
from core.store import Store
from workflows.contracts.retention import ListRetentionTargetsInput


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(make_engine(f"sqlite:///{tmp_path / 'relay.db'}"))


def _locked() -> None:
    raise OperationalError("SELECT 1", {}, Exception("database is locked"))


def _duplicate() -> None:
    raise IntegrityError("INSERT", {}, Exception("UNIQUE constraint failed"))


async def test_an_outage_is_a_short_retryable_benign_failure_reported_once(store: Store,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    calls = database_calls(store)
    caplog.set_level(logging.WARNING, "relay.worker")
    for _ in range(5):
        with pytest.raises(ApplicationError) as failed:
            await calls(_locked)
        assert (failed.value.type, failed.value.non_retryable) == (DATABASE_UNAVAILABLE, False)
        assert failed.value.category == ApplicationErrorCategory.BENIGN
        assert "database is locked" in failed.value.message and "SELECT" not in failed.value.message
    down = [r for r in caplog.records if "database unavailable" in r.getMessage()]
    assert len(down) == 1  # five attempts, one line
    assert await calls.first(lambda: 42) == 42
    assert [r.getMessage() for r in caplog.records][-1].startswith("database reachable again after")
    caplog.clear()
    with pytest.raises(ApplicationError):
        await calls(_locked)  # a new outage is reported at once
    assert len([r for r in caplog.records if "database unavailable" in r.getMessage()]) == 1


async def test_a_bug_is_not_an_outage(store: Store) -> None:
    with pytest.raises(IntegrityError):
        await database_calls(store)(_duplicate)


async def test_every_activity_class_shares_the_stores_one(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    shared = database_calls(store)
    assert database_calls(store) is shared
    assert database_calls(Store(make_engine("sqlite://"))) is not shared
    for activities in (RegistryActivities(store), GateActivities(store), RetentionActivities(store)):
        assert activities._db is shared
    # Retention had no outage handling: it raised SQLAlchemy's error (a traceback per attempt, retried forever).
    monkeypatch.setattr(store, "list_retention_targets", lambda org, app: _locked())
    with pytest.raises(ApplicationError) as failed:
        await ActivityEnvironment().run(RetentionActivities(store).list_retention_targets,
                                        ListRetentionTargetsInput(org="local", app="a"))
    assert failed.value.type == DATABASE_UNAVAILABLE


def test_once_per_window_per_key_counts_the_rest() -> None:
    now = [0.0]
    report = OncePerWindow(timedelta(seconds=60), clock=lambda: now[0], keep=2)
    assert report.due("a") and not report.due("a") and report.due("b")
    now[0] = 59.9
    assert not report.due("b") and report.suppressed == 2
    now[0] = 60.0
    assert report.due("a")
    report.forget("a")
    assert report.due("a")
    now[0] = 200.0
    assert report.due("c") and report.due("d")  # the old keys were let go when the memory was full
