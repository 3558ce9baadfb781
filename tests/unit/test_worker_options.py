"""The worker's Temporal options that come from settings."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from temporalio.client import Client
from temporalio.converter import DataConverter

import worker
from core.models import make_engine
from core.settings import Settings
from core.store import Store


@pytest.mark.parametrize(("env", "expected"), [(None, timedelta(seconds=10)), ("1", timedelta(seconds=1)),
                                               ("2.5", timedelta(seconds=2.5))])
def test_the_sticky_queue_timeout_is_relay_worker_sticky_timeout_secs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, env: str | None, expected: timedelta) -> None:
    if env is not None:
        monkeypatch.setenv("RELAY_WORKER_STICKY_TIMEOUT_SECS", env)
    options: dict[str, Any] = {}
    monkeypatch.setattr(worker, "Worker", lambda client, **kwargs: options.update(kwargs))
    store = Store(make_engine(f"sqlite:///{tmp_path / 'relay.db'}"))
    client = cast(Client, SimpleNamespace(data_converter=DataConverter.default))
    try:
        worker.build_worker(client, store, settings=Settings(data_dir=tmp_path))
    finally:
        store.engine.dispose()
    assert options["sticky_queue_schedule_to_start_timeout"] == expected
