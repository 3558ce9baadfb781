"""The worker's Temporal options that come from settings."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from temporalio.client import Client
from temporalio.converter import DataConverter
from temporalio.worker import PollerBehaviorSimpleMaximum

import worker
from core.models import make_engine
from core.settings import Settings
from core.store import Store


@pytest.mark.parametrize(("env", "expected"), [(None, timedelta(seconds=30)), ("1", timedelta(seconds=1)),
                                               ("2.5", timedelta(seconds=2.5))])
def test_the_sticky_queue_timeout_is_relay_worker_sticky_timeout_secs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: str | None, expected: timedelta) -> None:
    if env is not None:
        monkeypatch.setenv("RELAY_WORKER_STICKY_TIMEOUT_SECS", env)
    assert _options(tmp_path, monkeypatch)["sticky_queue_schedule_to_start_timeout"] == expected


def _options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The keywords ``worker.build_worker`` gives the SDK's ``Worker``, on the environment's settings."""
    options: dict[str, Any] = {}
    monkeypatch.setattr(worker, "Worker", lambda client, **kwargs: options.update(kwargs))
    store = Store(make_engine(f"sqlite:///{tmp_path / 'relay.db'}"))
    client = cast(Client, SimpleNamespace(data_converter=DataConverter.default))
    try:
        worker.build_worker(client, store, settings=Settings(data_dir=tmp_path))
    finally:
        store.engine.dispose()
    return options


def test_workflow_task_polls_leave_most_slots_to_the_tasks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each poll holds a workflow-task slot while it waits: the shared queue's polls and the sticky queue's together
    (a fixed number, which the SDK splits between them) hold at most two fifths of them, so a burst on one queue
    always finds slots (worker.WORKFLOW_TASK_POLLERS)."""
    options = _options(tmp_path, monkeypatch)
    polls = options["workflow_task_poller_behavior"]
    assert isinstance(polls, PollerBehaviorSimpleMaximum)
    assert 5 <= polls.maximum <= 0.4 * options["max_concurrent_workflow_tasks"], (polls, options)
