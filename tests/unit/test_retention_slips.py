"""A retention threshold under a second that an older Relay stored (before the REST API refused it) does
not drive retention: ``list_retention_targets`` reads it as unset and says so, once per app, with the fix."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlmodel import Session, update
from temporalio.testing import ActivityEnvironment

from activities.retention import RetentionActivities
from core.models import Application, make_engine
from core.store import Store
from workflows.contracts.retention import ListRetentionTargetsInput, RetentionTarget
from workflows.retention import retention_cutoffs

NOW = datetime(2026, 12, 1, tzinfo=UTC)


def _store_as_an_older_relay_did(store: Store, org: str, app: str, **settings: object) -> None:
    """The row as written before the 422: straight to the table, past the API's validation."""
    store.ensure_app(org, app)
    with Session(store.engine) as s:
        s.exec(update(Application).where(Application.org == org, Application.name == app)  # type: ignore[arg-type]
               .values(**settings))
        s.commit()


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(make_engine(f"sqlite:///{tmp_path / 'relay.db'}"))
    _store_as_an_older_relay_did(store, "local", "slipped", gc_time_threshold=timedelta(milliseconds=7),
                                 global_timeout=timedelta(milliseconds=500), gc_rows_threshold=None)
    _store_as_an_older_relay_did(store, "acme", "rows-too", gc_time_threshold=timedelta(milliseconds=999))
    _store_as_an_older_relay_did(store, "local", "meant", gc_time_threshold=timedelta(seconds=1),
                                 global_timeout=timedelta(days=7), gc_rows_threshold=None)
    return store


async def _targets(activities: RetentionActivities) -> dict[str, RetentionTarget]:
    targets = await ActivityEnvironment().run(activities.list_retention_targets, ListRetentionTargetsInput())
    return {t.app: t for t in targets}


async def test_a_threshold_under_a_second_is_unset_and_said_once_per_app(store: Store,
                                                                         caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "relay.worker")
    activities = RetentionActivities(store)
    targets = await _targets(activities)

    slipped, rows_too, meant = targets["slipped"], targets["rows-too"], targets["meant"]
    assert (slipped.gc_time_threshold, slipped.global_timeout) == (None, None)
    assert retention_cutoffs(slipped, now=NOW, gc_batch_size=1000) is None  # no round for it at all
    assert (rows_too.gc_time_threshold, rows_too.gc_rows_threshold) == (None, 1_000_000)
    cutoffs = retention_cutoffs(rows_too, now=NOW, gc_batch_size=1000)
    assert cutoffs is not None and cutoffs.gc_cutoff is None and cutoffs.gc_rows_threshold == 1_000_000
    assert (meant.gc_time_threshold, meant.global_timeout) == (timedelta(seconds=1), timedelta(days=7))

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        "retention ignores gcTimeThresholdMs 999 ms of app 'rows-too' (org 'acme'): under 1 s, a unit slip an older "
        "Relay stored. Set what was meant with relay apps update rows-too --org acme --gc-time-threshold DURATION "
        "(e.g. 7d), or clear it with relay apps update rows-too --org acme --gc-time-threshold none",
        "retention ignores gcTimeThresholdMs 7 ms and globalTimeoutMs 500 ms of app 'slipped' (org 'local'): under "
        "1 s, a unit slip an older Relay stored. Set what was meant with relay apps update slipped "
        "--gc-time-threshold DURATION --global-timeout DURATION (e.g. 7d), or clear it with relay apps update "
        "slipped --gc-time-threshold none --global-timeout none",
    ]

    caplog.clear()  # the next round (and each app's own listing) reads them as unset again, without a new line
    assert (await _targets(activities))["slipped"].gc_time_threshold is None
    assert await ActivityEnvironment().run(activities.list_retention_targets,
                                           ListRetentionTargetsInput(org="local", app="slipped"))
    assert [r for r in caplog.records if r.levelno == logging.WARNING] == []
