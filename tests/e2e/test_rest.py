"""The REST admin API end to end, against `relay dev` (real Temporal and SQLite behind it), then one on
PostgreSQL: what needs executor sockets, lifecycle workflows or the HTTP layer in front of the app — executors'
fields as their handshake gave them, deletion of apps with executors, revocation closing live sockets (here or
from another process), the audit rows the lifecycle writes, refusals before the upgrade. The rest of the REST
contract is tested in-process, in ``tests/api``. Response shapes are checked against the upstream facts in
``tests/api/test_compat.py``."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from core.models import make_engine
from core.store import Store
from tests.api.test_compat import assert_problem, assert_upstream
from tests.postgres import postgres_cluster, relay_on_postgres
from tests.support import Relay, closed_with, play_executor, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.concurrent]

ORG = "/v2/orgs/local"


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def relay(request: pytest.FixtureRequest, relay: Relay, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Relay]:
    """Every test here runs against the session's `relay dev` (SQLite), then against one on PostgreSQL."""
    if request.param == "sqlite":
        yield relay
        return
    with postgres_cluster() as cluster, relay_on_postgres(cluster, tmp_path_factory.mktemp("relay-rest-pg")) as pg:
        yield pg


@pytest.fixture(scope="module")
def store(relay: Relay) -> Iterator[Store]:
    """Relay's database, opened from the test as another gateway process would."""
    s = Store(make_engine(relay.db_url))
    yield s
    s.engine.dispose()


def _new_key(store: Store, *, org: str = "local", apps: list[str] | None = None) -> str:
    return store.create_key(org=org, name=f"test-{uuid.uuid4().hex[:8]}", apps=apps)


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def _audit(client: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    response = client.get(f"{ORG}/audit-logs", params=params)
    assert response.status_code == 200, response.text
    entries: list[dict[str, Any]] = response.json()
    for entry in entries:
        assert_upstream(entry, "AuditLogEntry")
    return entries


def _registry(store: Store, app: str) -> dict[str, str]:
    return {e.executor_id: e.status.value for e in store.list_executors("local", app)}


# -- executors and the audit rows of their lifecycle ---------------------------------------------------------------


def test_executors_have_the_upstream_fields(relay: Relay) -> None:
    with play_executor(relay, "fields-app", "ex-1", version="v7", metadata={"zone": "a"}):
        wait_until(lambda: relay.executors("fields-app").get("ex-1") == "HEALTHY", timeout=10, what="HEALTHY")
        with relay.api() as client:
            [executor] = client.get(f"{ORG}/apps/fields-app/executors").json()
            app = client.get(f"{ORG}/apps/fields-app").json()
    assert_upstream(executor, "Executor")
    assert executor["appId"] == app["id"] and executor["appVersion"] == "v7"
    assert executor["executorMetadata"] == {"zone": "a"} and executor["dbosVersion"] == "3.2.0"
    assert datetime.fromisoformat(executor["createdAt"]).tzinfo is not None
    assert app["status"] == "AVAILABLE" and app["language"] == "python"


def test_system_actions_have_the_system_subject(relay: Relay) -> None:
    with play_executor(relay, "system-app", "sys-1"):
        wait_until(lambda: relay.executors("system-app").get("sys-1") == "HEALTHY", timeout=10, what="HEALTHY")
    with relay.api() as client:
        [healthy] = _audit(client, target="system-app", operation="executor.healthy")
        assert _audit(client, target="sys-1", operation="executor.healthy") == [healthy]
        assert healthy in _audit(client, target="system-app", subject="system")
    assert healthy["subject"] == {"type": "system", "id": "system", "display": "Relay"}
    assert healthy["target"] == {"type": "application", "id": "system-app"}
    assert healthy["details"]["executorId"] == "sys-1"


# -- deleting an app with executors --------------------------------------------------------------------------------


def test_delete_app_ends_every_executor_without_recovery(relay: Relay, store: Store) -> None:
    app = "doomed-app"
    with relay.api() as client:
        client.put(f"{ORG}/apps/{app}")
        client.patch(f"{ORG}/apps/{app}", json={"executorTimeoutSecs": 1})
        # A version no peer has: its recovery waits for one, durably, and is never dispatched.
        with play_executor(relay, app, "dead-1", version="v0"):
            wait_until(lambda: _registry(store, app).get("dead-1") == "HEALTHY", timeout=10, what="HEALTHY")
        wait_until(lambda: _registry(store, app).get("dead-1") == "DEAD", timeout=15, what="DEAD")
        client.patch(f"{ORG}/apps/{app}", json={"executorTimeoutSecs": 600})
        with play_executor(relay, app, "gone-1"):
            wait_until(lambda: _registry(store, app).get("gone-1") == "HEALTHY", timeout=10, what="HEALTHY")
        wait_until(lambda: _registry(store, app).get("gone-1") == "DISCONNECTED", timeout=10, what="DISCONNECTED")
        with play_executor(relay, app, "live-1") as ws:
            wait_until(lambda: _registry(store, app).get("live-1") == "HEALTHY", timeout=10, what="HEALTHY")
            assert client.delete(f"{ORG}/apps/{app}").status_code == 204
            assert closed_with(ws, within=5) == 1008
        assert_problem(client.get(f"{ORG}/apps/{app}"), 404)
        assert_problem(client.get(f"{ORG}/apps/{app}/executors"), 404)
        [deleted] = _audit(client, target=app, operation="app.deleted")
    assert sorted(deleted["details"]["executors"]) == ["dead-1", "gone-1", "live-1"]
    assert deleted["subject"]["display"] == "dev"
    # Each lifecycle ended by removal: records gone, and the dead one's recovery was never dispatched.
    wait_until(lambda: _registry(store, app) == {}, timeout=10, what="executor records deleted")
    operations = [op for op, _ in relay.audit(app)]
    assert "executor.recovery.blocked" in operations and "executor.recovery.dispatched" not in operations


# -- revocation ----------------------------------------------------------------------------------------------------


def test_deleting_a_token_closes_its_executor_sockets(relay: Relay, store: Store) -> None:
    app = "revoke-app"
    with relay.api() as client:
        key = client.post(f"{ORG}/tokens/revoke-me", json={"appNames": [app]}).json()["token"]
        with play_executor(relay, app, "rev-1", key=key) as revoked, play_executor(relay, app, "keep-1") as kept:
            wait_until(lambda: _registry(store, app) == {"rev-1": "HEALTHY", "keep-1": "HEALTHY"}, timeout=10,
                       what="both HEALTHY")
            assert client.delete(f"{ORG}/tokens/revoke-me").status_code == 204
            assert closed_with(revoked, within=5) == 1008  # within a second: tests/e2e/test_revocation.py
            # It counts as a disconnect; the socket of another key stays up.
            wait_until(lambda: _registry(store, app).get("rev-1") == "DISCONNECTED", timeout=10,
                       what="DISCONNECTED")
            kept.ping().wait(5)
            assert kept.close_code is None
    with pytest.raises(InvalidStatus) as refused, connect(f"{relay.ws_url}websocket/{app}/{key}"):
        pass
    assert refused.value.response.status_code == 401


def test_a_revocation_made_elsewhere_closes_sockets_here(relay: Relay, store: Store) -> None:
    """As if another gateway process revoked the key: only the database changes, and this gateway's watcher
    closes the socket."""
    app = "revoke-far-app"
    key = store.create_key(org="local", name="revoke-far", apps=[app])
    with play_executor(relay, app, "far-1", key=key) as ws:
        wait_until(lambda: _registry(store, app).get("far-1") == "HEALTHY", timeout=10, what="HEALTHY")
        store.revoke_token("local", "revoke-far", subject="system", source_ip="")
        assert closed_with(ws, within=5) == 1008
    wait_until(lambda: _registry(store, app).get("far-1") == "DISCONNECTED", timeout=10, what="DISCONNECTED")


def test_an_app_deleted_elsewhere_closes_its_sockets_here(relay: Relay, store: Store) -> None:
    """As if another gateway process deleted the app: only the database changes, and this gateway's watcher
    closes the socket."""
    app = "deleted-far-app"
    with play_executor(relay, app, "del-far-1") as ws:
        wait_until(lambda: _registry(store, app).get("del-far-1") == "HEALTHY", timeout=10, what="HEALTHY")
        store.delete_app("local", app, subject="system", source_ip="", orphans=[], details={})
        assert closed_with(ws, within=5) == 1008


# -- health and refusals before the upgrade ------------------------------------------------------------------------


@pytest.mark.parametrize(("key_kind", "status"), [("unknown", 401), ("other_app", 403)])
def test_websocket_refused_before_upgrade(relay: Relay, store: Store, key_kind: str, status: int) -> None:
    key = "dbos_" + "unknown" * 6 if key_kind == "unknown" else _new_key(
        store, apps=["someone-else"])
    with pytest.raises(InvalidStatus) as refused, connect(f"{relay.ws_url}websocket/refused-app/{key}"):
        pass
    response = refused.value.response
    assert response.status_code == status
    assert response.headers["content-type"] == "application/problem+json"
    assert json.loads(response.body)["status"] == status
    assert key not in relay.process.output()  # keys never reach the logs


def test_readyz_is_ok_while_temporal_and_the_database_answer(relay: Relay) -> None:
    """Readiness with everything up (its 503 during an outage: tests/e2e/test_outages.py, test_db_outage.py)."""
    response = httpx.get(f"{relay.url}/readyz", timeout=5)
    assert response.status_code == 200, response.text
    assert response.json() == {"status": "ok"}
