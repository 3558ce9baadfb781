"""Durations in audit rows: under their REST names and in the unit each name states, whoever writes the row.

A REST call, then the row it wrote read back through ``listAuditLogs``; the lifecycle's audit rows through the
activities that write them. In process: the real app factory with its store on a fresh SQLite file, and no
Temporal (these routes do not use it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.testing import ActivityEnvironment

from activities.registry import RegistryActivities
from api import schemas
from api.app import create_app
from api.deps import get_store
from core import models, units
from core.settings import Settings
from core.store import Store
from workflows.contracts.common import ExecutorStatus
from workflows.contracts.lifecycle import RecordStatusInput, WriteAuditInput

ORG, APP = "local", "units-app"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store(models.make_engine(f"sqlite:///{tmp_path / 'relay.db'}"))
    yield opened
    opened.engine.dispose()


@pytest.fixture
async def client(store: Store, tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(Settings(data_dir=tmp_path))
    app.dependency_overrides[get_store] = lambda: store
    key = store.create_key(org=ORG, name="units")
    # httpx's ASGI transport runs no lifespan: no Temporal, no gateway worker.
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://relay.test",
                                 headers={"Authorization": f"Bearer {key}"}) as opened:
        yield opened


async def _audit(client: httpx.AsyncClient, operation: str) -> list[dict[str, Any]]:
    response = await client.get(f"/v2/orgs/{ORG}/audit-logs", params={"operation": operation, "target": APP})
    assert response.status_code == 200, response.text
    entries: list[dict[str, Any]] = response.json()
    return entries


async def test_app_updated_rows_carry_the_settings_as_the_request_did(client: httpx.AsyncClient) -> None:
    path = f"/v2/orgs/{ORG}/apps/{APP}"
    assert (await client.put(path)).status_code == 204
    body = {"executorTimeoutSecs": 90, "gcTimeThresholdMs": 604_800_000, "globalTimeoutMs": 86_400_000,
            "gcRowsThreshold": 5, "privateMode": True, "crossVersionRecovery": True}
    assert (await client.patch(path, json=body)).status_code == 204
    assert (await client.patch(path, json={"gcTimeThresholdMs": None})).status_code == 204
    # Registering again changes privateMode alone (registerApp), audited the same way.
    assert (await client.put(path, json={"privateMode": False})).status_code == 204

    [registered, cleared, updated] = await _audit(client, "app.updated")  # newest first
    assert updated["details"] == body
    assert cleared["details"] == {"gcTimeThresholdMs": None}
    assert registered["details"] == {"privateMode": False}
    stored = (await client.get(path)).json()
    assert stored["executorTimeoutSecs"] == 90 and stored["globalTimeoutMs"] == 86_400_000


async def test_app_updated_rows_name_the_setting_as_retention_rows_do(client: httpx.AsyncClient) -> None:
    """One setting, one name and one unit in the whole log: the retention rows' ``settings`` say
    ``gcTimeThresholdMs`` in milliseconds too."""
    path = f"/v2/orgs/{ORG}/apps/{APP}"
    assert (await client.put(path)).status_code == 204
    assert (await client.patch(path, json={"gcTimeThresholdMs": 1500})).status_code == 204
    [updated] = await _audit(client, "app.updated")
    assert updated["details"] == {"gcTimeThresholdMs": 1500}  # not 1.5 (seconds) under gc_time_threshold


async def test_lifecycle_rows_carry_the_grace_in_seconds(store: Store) -> None:
    store.ensure_app(ORG, APP)
    activities = RegistryActivities(store)
    env = ActivityEnvironment()
    await env.run(activities.record_status, RecordStatusInput(
        ORG, APP, "ex-1", ExecutorStatus.DISCONNECTED, "executor.disconnected", event_key="ex-1/1",
        details={"connection_id": "c1"}, durations={"executorTimeoutSecs": timedelta(seconds=90)}))
    await env.run(activities.write_audit, WriteAuditInput(
        ORG, APP, "ex-1", "executor.grace.extended", "ex-1/2", details={"gateway_queue": "gw"},
        durations={"executorTimeoutSecs": timedelta(minutes=2)}))
    rows = {row.operation: row.details for row in store.list_audit(ORG, app=APP)}
    assert rows["executor.disconnected"] == {"connection_id": "c1", "executorTimeoutSecs": 90}
    assert rows["executor.grace.extended"] == {"gateway_queue": "gw", "executorTimeoutSecs": 120}


async def test_details_keys_are_camel_case_as_the_rest_api_whoever_wrote_them(store: Store,
                                                                               client: httpx.AsyncClient) -> None:
    """The workflows write some detail keys in snake_case (``request_id``); listAuditLogs shows every top-level key
    in the REST style (``requestId``, as the request bodies' ``executorTimeoutSecs``); a wire message carried whole
    (``body``) keeps its wire names."""
    store.ensure_app(ORG, APP)
    await ActivityEnvironment().run(RegistryActivities(store).write_audit, WriteAuditInput(
        ORG, APP, "ex-1", "executor.recovery.dispatched", "ex-1/keys",
        details={"candidate": "ex-2", "attempt": 2, "request_id": "r-1", "connection_id": "c-1",
                 "body": {"gc_cutoff_epoch_ms": 1}}))
    [entry] = await _audit(client, "executor.recovery.dispatched")
    assert entry["details"] == {"candidate": "ex-2", "attempt": 2, "requestId": "r-1", "connectionId": "c-1",
                                "body": {"gc_cutoff_epoch_ms": 1}, "executorId": "ex-1"}


# -- the conversion itself -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "value", "expected"), [
    ("executorTimeoutSecs", timedelta(seconds=90), 90),
    ("executorTimeoutSecs", timedelta(milliseconds=1500), 1),  # whole seconds, as the REST field holds
    ("gcTimeThresholdMs", timedelta(days=7), 604_800_000),
    ("globalTimeoutMs", timedelta(milliseconds=1), 1),
    ("globalTimeoutMs", None, None),
])
def test_rest_duration_takes_the_unit_from_the_name(name: str, value: timedelta | None, expected: int | None) -> None:
    assert units.rest_duration(name, value) == expected


def test_a_duration_name_without_a_unit_is_refused() -> None:
    with pytest.raises(ValueError, match="Secs or Ms"):
        units.rest_duration("grace", timedelta(seconds=1))


def test_every_app_setting_has_its_rest_name() -> None:
    """Each storage field of the settings maps to a field of the REST body; a PATCH's changes, put back under
    those names, are the PATCH body itself."""
    rest_fields = set(schemas.PatchAppInputBody.model_fields) - {"schema_url"}
    assert set(units.APP_SETTING_REST_NAMES.values()) == rest_fields
    assert set(units.APP_SETTING_REST_NAMES) <= set(models.Application.model_fields)
    body = {"executorTimeoutSecs": 61, "gcTimeThresholdMs": 1001, "globalTimeoutMs": None, "gcRowsThreshold": 7,
            "privateMode": True, "crossVersionRecovery": False}
    assert units.app_settings_to_rest(schemas.PatchAppInputBody.model_validate(body).changes()) == body
    with pytest.raises(KeyError):
        units.app_settings_to_rest({"new_setting": 1})
