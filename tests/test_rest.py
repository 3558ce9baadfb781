"""The REST admin API against `relay dev` (real Temporal and SQLite behind it): applications, executors, tokens,
audit logs, deletion of apps with executors, revocation, and strictness. Response shapes are checked against
the upstream facts in ``test_compat``."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from core.models import make_engine
from core.store import Store
from tests.postgres import postgres_cluster, relay_on_postgres
from tests.support import Relay, play_executor, wait_until
from tests.test_compat import assert_problem, assert_upstream

pytestmark = pytest.mark.e2e

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


@contextlib.contextmanager
def _executor(relay: Relay, app: str, executor_id: str, key: str) -> Iterator[ClientConnection]:
    """An executor socket authenticated with ``key``, past its handshake."""
    with connect(f"{relay.ws_url}websocket/{app}/{key}") as ws:
        request = json.loads(ws.recv(timeout=10))
        ws.send(json.dumps({"type": "executor_info", "request_id": request["request_id"],
                            "executor_id": executor_id, "application_version": "v1", "hostname": "test",
                            "language": "python", "dbos_version": "3.2.0", "executor_metadata": None,
                            "error_message": None}))
        yield ws


def _closed_with(ws: ClientConnection, *, within: float) -> int:
    """Wait for the server to close the socket; returns its close code."""
    deadline = time.monotonic() + within
    with contextlib.suppress(ConnectionClosed, TimeoutError):
        while time.monotonic() < deadline:
            ws.recv(timeout=max(deadline - time.monotonic(), 0.01))
    assert ws.close_code is not None, f"socket still open after {within}s"
    return ws.close_code


def _audit(client: httpx.Client, **params: Any) -> list[dict[str, Any]]:
    response = client.get(f"{ORG}/audit-logs", params=params)
    assert response.status_code == 200, response.text
    entries: list[dict[str, Any]] = response.json()
    for entry in entries:
        assert_upstream(entry, "AuditLogEntry")
    return entries


def _registry(store: Store, app: str) -> dict[str, str]:
    return {e.executor_id: e.status.value for e in store.list_executors("local", app)}


# -- applications -----------------------------------------------------------------------------------------------


def test_get_app_has_the_upstream_fields_and_defaults(relay: Relay) -> None:
    with relay.api() as client:
        assert client.put(f"{ORG}/apps/shape-app").status_code == 204
        response = client.get(f"{ORG}/apps/shape-app")
    assert response.status_code == 200
    body = response.json()
    assert_upstream(body, "Application")
    assert body["executorTimeoutSecs"] == 60 and body["gcRowsThreshold"] == 1_000_000
    assert body["name"] == "shape-app" and body["orgId"] == "local" and body["status"] == "UNAVAILABLE"


def test_register_is_idempotent_and_audited_with_the_caller(relay: Relay) -> None:
    with relay.api() as client:
        assert client.put(f"{ORG}/apps/reg-app", json={"privateMode": True}).status_code == 204
        assert client.patch(f"{ORG}/apps/reg-app", json={"executorTimeoutSecs": 9}).status_code == 204
        assert client.put(f"{ORG}/apps/reg-app").status_code == 204  # again: settings stay
        body = client.get(f"{ORG}/apps/reg-app").json()
        assert (body["privateMode"], body["executorTimeoutSecs"]) == (True, 9)
        assert client.put(f"{ORG}/apps/reg-app", json={"privateMode": False}).status_code == 204
        assert client.get(f"{ORG}/apps/reg-app").json()["privateMode"] is False
        entries = _audit(client, target="reg-app")
    assert [e["operation"] for e in entries] == ["app.updated", "app.updated", "app.registered"]  # newest first
    for entry in entries:
        assert entry["subject"]["type"] == "api_key" and entry["subject"]["display"] == "dev"
        assert entry["sourceIp"] == "127.0.0.1"
        assert entry["target"] == {"type": "application", "id": "reg-app"}


def test_list_apps_shows_a_restricted_key_only_its_apps(relay: Relay, store: Store) -> None:
    with relay.api() as client:
        for name in ("list-a", "list-b"):
            client.put(f"{ORG}/apps/{name}")
        everything = client.get(f"{ORG}/apps").json()
    assert {"list-a", "list-b"} <= {a["name"] for a in everything}
    for app in everything:
        assert_upstream(app, "Application")
    assert [a["name"] for a in everything] == sorted(a["name"] for a in everything)
    only_a = _new_key(store, apps=["list-a"])
    response = httpx.get(f"{relay.url}{ORG}/apps", headers=_bearer(only_a))
    assert [a["name"] for a in response.json()] == ["list-a"]


@pytest.mark.parametrize(("field", "value"), [
    ("executorTimeoutSecs", 60), ("executorTimeoutSecs", 1), ("executorTimeoutSecs", 604_800),
    ("gcTimeThresholdMs", 3_600_000), ("gcTimeThresholdMs", 1), ("globalTimeoutMs", 86_400_000),
    ("gcRowsThreshold", 5), ("executorTimeoutSecs", 90.0),
])
def test_patch_units_round_trip(relay: Relay, field: str, value: int) -> None:
    with relay.api() as client:
        client.put(f"{ORG}/apps/units-app")
        assert client.patch(f"{ORG}/apps/units-app", json={field: value}).status_code == 204
        assert client.get(f"{ORG}/apps/units-app").json()[field] == value


def test_patch_null_clears_a_retention_setting(relay: Relay) -> None:
    with relay.api() as client:
        client.put(f"{ORG}/apps/clear-app")
        client.patch(f"{ORG}/apps/clear-app", json={"gcTimeThresholdMs": 5000, "executorTimeoutSecs": 7,
                                                    "globalTimeoutMs": 9000, "gcRowsThreshold": 10})
        cleared = {"gcTimeThresholdMs": None, "globalTimeoutMs": None, "gcRowsThreshold": None}
        assert client.patch(f"{ORG}/apps/clear-app", json=cleared).status_code == 204
        body = client.get(f"{ORG}/apps/clear-app").json()
    assert body.items() >= {**cleared, "executorTimeoutSecs": 7}.items()  # untouched fields stay


@pytest.mark.parametrize("payload", [
    {"executorTimeoutSecs": 0}, {"executorTimeoutSecs": 604_801}, {"executorTimeoutSecs": "60"},
    {"executorTimeoutSecs": True}, {"executorTimeoutSecs": None}, {"executorTimeoutSecs": 1.5},
    {"gcRowsThreshold": 0}, {"gcRowsThreshold": -5}, {"gcRowsThreshold": 2**53}, {"gcTimeThresholdMs": -1},
    {"gcTimeThresholdMs": 0}, {"globalTimeoutMs": 0}, {"globalTimeoutMs": 1.5}, {"gcTimeThresholdMs": 10**30},
    {"globalTimeoutMs": "1000"}, {"privateMode": "yes"}, {"privateMode": None}, {"unknownField": 1},
    {"$schema": None}, [], "text", None,
])
def test_patch_rejects_bad_input_with_a_problem(relay: Relay, payload: Any) -> None:
    with relay.api() as client:
        client.put(f"{ORG}/apps/strict-app")
        before = client.get(f"{ORG}/apps/strict-app").json()
        response = client.patch(f"{ORG}/apps/strict-app", content=json.dumps(payload),
                                headers={"Content-Type": "application/json"})
        body = assert_problem(response, 422)
        assert body["errors"], body
        assert client.get(f"{ORG}/apps/strict-app").json() == before  # nothing changed


@pytest.mark.parametrize(("content", "content_type"), [
    (b'{"executorTimeoutSecs": 1e999}', "application/json"),
    (b'{"executorTimeoutSecs": 1' + b"0" * 5000 + b"}", "application/json"),
    (b'{"executorTimeoutSecs": ', "application/json"),
    (b'{"privateMode": "\xff\xfe"}', "application/json"),
    (b"[" * 100_000 + b"]" * 100_000, "application/json"),
    (b"\x00\x01", "application/octet-stream"),
    (b"executorTimeoutSecs=5", "application/x-www-form-urlencoded"),
])
def test_malformed_bodies_are_4xx_problems(relay: Relay, content: bytes, content_type: str) -> None:
    with relay.api() as client:
        client.put(f"{ORG}/apps/malformed-app")
        response = client.patch(f"{ORG}/apps/malformed-app", content=content,
                                headers={"Content-Type": content_type})
    assert response.status_code in (400, 422), response.text
    assert_problem(response, response.status_code)


def test_put_rejects_bad_bodies(relay: Relay) -> None:
    with relay.api() as client:
        for payload in ({"privateMode": "true"}, {"privateMode": None}, {"other": 1}, None, [1]):
            response = client.put(f"{ORG}/apps/put-strict-app", content=json.dumps(payload),
                                  headers={"Content-Type": "application/json"})
            assert_problem(response, 422)
        assert_problem(client.get(f"{ORG}/apps/put-strict-app"), 404)  # none of them registered it


def test_auth_errors(relay: Relay, store: Store) -> None:
    other_org = _new_key(store, org="other")
    only_billing = _new_key(store, apps=["billing"])
    url = f"{relay.url}{ORG}/apps/auth-app"
    with relay.api() as client:
        client.put(f"{ORG}/apps/auth-app")
    assert_problem(httpx.get(url), 401)
    assert_problem(httpx.get(url, headers={"Authorization": "Basic dXNlcjpwYXNz"}), 401)
    assert_problem(httpx.get(url, headers=_bearer("dbos_not-a-real-key")), 401)
    assert_problem(httpx.get(url, headers=_bearer(other_org)), 403)
    assert_problem(httpx.get(url, headers=_bearer(only_billing)), 403)
    assert_problem(httpx.get(f"{relay.url}{ORG}/apps/not-there", headers=_bearer(only_billing)), 403)
    assert_problem(httpx.get(f"{relay.url}/v2/orgs/nobody_here/apps", headers=_bearer(other_org)), 404)
    assert_problem(httpx.get(f"{relay.url}/v2/orgs/local/apps", headers=_bearer(other_org)), 403)
    with relay.api() as client:
        assert_problem(client.get(f"{ORG}/apps/no-such-app"), 404)
        assert_problem(client.get(f"{ORG}/apps/UPPER"), 422)
        assert_problem(client.get(f"{ORG}/apps/ab"), 422)
        assert_problem(client.get(f"{ORG}/apps/{'a' * 31}"), 422)


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


# -- deleting an app with executors -----------------------------------------------------------------------------


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
            assert _closed_with(ws, within=5) == 1008
        assert_problem(client.get(f"{ORG}/apps/{app}"), 404)
        assert_problem(client.get(f"{ORG}/apps/{app}/executors"), 404)
        [deleted] = _audit(client, target=app, operation="app.deleted")
    assert sorted(deleted["details"]["executors"]) == ["dead-1", "gone-1", "live-1"]
    assert deleted["subject"]["display"] == "dev"
    # Each lifecycle ended by removal: records gone, and the dead one's recovery was never dispatched.
    wait_until(lambda: _registry(store, app) == {}, timeout=10, what="executor records deleted")
    operations = [op for op, _ in relay.audit(app)]
    assert "executor.recovery.blocked" in operations and "executor.recovery.dispatched" not in operations


def test_delete_unknown_app_is_404(relay: Relay) -> None:
    with relay.api() as client:
        assert_problem(client.delete(f"{ORG}/apps/never-was"), 404)


# -- tokens ------------------------------------------------------------------------------------------------------


def test_token_lifecycle(relay: Relay) -> None:
    with relay.api() as client:
        created = client.post(f"{ORG}/tokens/ci-deployer", json={"appNames": ["tok-app", "tok-later"]})
        assert created.status_code == 201, created.text
        assert_upstream(created.json(), "TokenCreated")
        key = created.json()["token"]
        assert key.startswith("dbos_") and len(key) >= 5 + 43
        assert_problem(client.post(f"{ORG}/tokens/ci-deployer"), 409)
        client.put(f"{ORG}/apps/tok-app")
        app_id = client.get(f"{ORG}/apps/tok-app").json()["id"]
        [listed] = [t for t in client.get(f"{ORG}/tokens").json() if t["tokenName"] == "ci-deployer"]
        assert_upstream(listed, "Token")
        assert key not in json.dumps(client.get(f"{ORG}/tokens").json())
        assert (listed["appIds"], listed["appNames"], listed["permissions"]) == (
            [app_id], ["tok-app", "tok-later"], [])
        # The new key works, for its apps only.
        assert httpx.get(f"{relay.url}{ORG}/apps/tok-app", headers=_bearer(key)).status_code == 200
        assert_problem(httpx.get(f"{relay.url}{ORG}/apps/shape-app", headers=_bearer(key)), 403)
        assert client.delete(f"{ORG}/tokens/ci-deployer").status_code == 204
        assert_problem(httpx.get(f"{relay.url}{ORG}/apps/tok-app", headers=_bearer(key)), 401)
        assert_problem(client.delete(f"{ORG}/tokens/ci-deployer"), 404)
        assert "ci-deployer" not in [t["tokenName"] for t in client.get(f"{ORG}/tokens").json()]
        # The name is free again.
        assert client.post(f"{ORG}/tokens/ci-deployer").status_code == 201
        assert client.delete(f"{ORG}/tokens/ci-deployer").status_code == 204
        entries = _audit(client, target="ci-deployer")
    assert [e["operation"] for e in entries] == ["token.deleted", "token.created", "token.deleted", "token.created"]
    assert all(e["target"] == {"type": "token", "id": "ci-deployer"} for e in entries)
    assert all(e["subject"]["display"] == "dev" and e["sourceIp"] == "127.0.0.1" for e in entries)


@pytest.mark.parametrize("payload", [
    {"appNames": ["ok-app", "ok-app"]}, {"appNames": ["UPPER"]}, {"appNames": ["ab"]}, {"appNames": "ok-app"},
    {"permissions": ["admin"]}, {"scopes": []}, {"appNames": [1]}, None,
])
def test_create_token_rejects_bad_bodies(relay: Relay, payload: Any) -> None:
    with relay.api() as client:
        response = client.post(f"{ORG}/tokens/bad-body", content=json.dumps(payload),
                               headers={"Content-Type": "application/json"})
        assert_problem(response, 422)
        assert "bad-body" not in [t["tokenName"] for t in client.get(f"{ORG}/tokens").json()]


def test_token_names_with_control_characters_are_refused(relay: Relay) -> None:
    with relay.api() as client:
        assert_problem(client.post(f"{ORG}/tokens/bad%00name"), 422)
        assert_problem(client.post(f"{ORG}/tokens/{'n' * 101}"), 422)
        assert client.post(f"{ORG}/tokens/ünï cödé").status_code == 201
        assert client.delete(f"{ORG}/tokens/ünï cödé").status_code == 204


def test_app_restricted_keys_cannot_manage_tokens_or_read_the_audit_log(relay: Relay, store: Store) -> None:
    restricted = _bearer(_new_key(store, apps=["some-app"]))
    assert_problem(httpx.post(f"{relay.url}{ORG}/tokens/escalate", headers=restricted), 403)
    assert_problem(httpx.get(f"{relay.url}{ORG}/tokens", headers=restricted), 403)
    assert_problem(httpx.delete(f"{relay.url}{ORG}/tokens/dev", headers=restricted), 403)
    assert_problem(httpx.get(f"{relay.url}{ORG}/audit-logs", headers=restricted), 403)


# -- revocation ------------------------------------------------------------------------------------------------


def test_deleting_a_token_closes_its_executor_sockets_within_a_second(relay: Relay, store: Store) -> None:
    app = "revoke-app"
    with relay.api() as client:
        key = client.post(f"{ORG}/tokens/revoke-me", json={"appNames": [app]}).json()["token"]
        with _executor(relay, app, "rev-1", key) as revoked, play_executor(relay, app, "keep-1") as kept:
            wait_until(lambda: _registry(store, app) == {"rev-1": "HEALTHY", "keep-1": "HEALTHY"}, timeout=10,
                       what="both HEALTHY")
            start = time.monotonic()
            assert client.delete(f"{ORG}/tokens/revoke-me").status_code == 204
            assert _closed_with(revoked, within=1) == 1008
            assert time.monotonic() - start < 1
            # It counts as a disconnect; the socket of another key stays up.
            wait_until(lambda: _registry(store, app).get("rev-1") == "DISCONNECTED", timeout=10,
                       what="DISCONNECTED")
            kept.ping().wait(5)
            assert kept.close_code is None
    with pytest.raises(InvalidStatus) as refused, connect(f"{relay.ws_url}websocket/{app}/{key}"):
        pass
    assert refused.value.response.status_code == 401


def test_a_revocation_made_elsewhere_closes_sockets_here_within_a_second(relay: Relay, store: Store) -> None:
    """As if another gateway process revoked the key: only the database changes, and this gateway's watcher
    closes the socket."""
    app = "revoke-far-app"
    key = store.create_key(org="local", name="revoke-far", apps=[app])
    with _executor(relay, app, "far-1", key) as ws:
        wait_until(lambda: _registry(store, app).get("far-1") == "HEALTHY", timeout=10, what="HEALTHY")
        store.revoke_token("local", "revoke-far", subject="system", source_ip="")
        assert _closed_with(ws, within=1) == 1008
    wait_until(lambda: _registry(store, app).get("far-1") == "DISCONNECTED", timeout=10, what="DISCONNECTED")


def test_an_app_deleted_elsewhere_closes_its_sockets_here_within_a_second(relay: Relay, store: Store) -> None:
    """As if another gateway process deleted the app: only the database changes, and this gateway's watcher
    closes the socket."""
    app = "deleted-far-app"
    with play_executor(relay, app, "del-far-1") as ws:
        wait_until(lambda: _registry(store, app).get("del-far-1") == "HEALTHY", timeout=10, what="HEALTHY")
        store.delete_app("local", app, subject="system", source_ip="", orphans=[], details={})
        assert _closed_with(ws, within=1) == 1008


# -- audit log ---------------------------------------------------------------------------------------------------


def test_audit_log_filters_and_pages_newest_first(relay: Relay) -> None:
    app = "audit-app"
    with relay.api() as client:
        before = datetime.now(UTC) - timedelta(milliseconds=1)
        client.put(f"{ORG}/apps/{app}")
        for secs in (11, 12, 13):
            client.patch(f"{ORG}/apps/{app}", json={"executorTimeoutSecs": secs})
        updates = _audit(client, target=app, operation="app.updated")
        assert [e["details"]["executor_timeout"] for e in updates] == [13, 12, 11]
        times = [datetime.fromisoformat(e["emitTime"]) for e in updates]
        assert times == sorted(times, reverse=True) and times[-1] >= before
        assert _audit(client, target=app, operation="app.updated", limit=1, offset=1) == updates[1:2]
        assert _audit(client, target=app, startTime=updates[1]["emitTime"]) == updates[:2]  # inclusive
        assert _audit(client, target=app, endTime=updates[1]["emitTime"]) == _audit(client, target=app)[2:]
        assert _audit(client, target=app, startTime=before.isoformat(), operation="app.registered")
        dev = updates[0]["subject"]
        assert _audit(client, target=app, subject="dev") == _audit(client, target=app, subject=dev["id"])
        assert len(_audit(client, target=app, subject="dev")) == 4
        assert _audit(client, target=app, subject="system") == []
        assert _audit(client, target=app, operation="no.such.operation") == []


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


@pytest.mark.parametrize("query", [
    "limit=0", "limit=1001", "limit=-1", "limit=abc", "limit=1.5", "offset=-1", f"offset={2**64}",
    "startTime=yesterday", "startTime=0.5", "startTime=2025-01-01T00:00:00", "endTime=2025-13-01T00:00:00Z",
    "startTime=0001-01-01T00:00:00%2B01:00", "endTime=9999-12-31T23:59:59-01:00", "operation=a%00b",
    f"target={'t' * 201}", "subject=",
])
def test_audit_log_rejects_bad_queries(relay: Relay, query: str) -> None:
    with relay.api() as client:
        assert_problem(client.get(f"{ORG}/audit-logs?{query}"), 422)


def test_openapi_json_is_served_and_is_the_committed_spec(relay: Relay) -> None:
    from tests.test_openapi import SPEC

    assert httpx.get(f"{relay.url}/openapi.json").json() == json.loads(SPEC.read_text())


def test_healthz(relay: Relay) -> None:
    assert httpx.get(f"{relay.url}/healthz").json() == {"status": "ok"}


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
