"""The REST operations of the core, against `relay dev` (real Temporal and SQLite behind it), checked against
facts from the upstream Conductor contract (not vendored: written here as expectations)."""

from __future__ import annotations

import json
import os
import subprocess
from datetime import datetime
from typing import Any

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.support import VENV_BIN, Relay, play_executor, wait_until

pytestmark = pytest.mark.e2e

# Upstream `Application` and `Executor`: every required field, and the JSON types it may take.
APPLICATION_REQUIRED: dict[str, tuple[type, ...]] = {
    "id": (str,), "name": (str,), "orgId": (str,), "status": (str,), "language": (str, type(None)),
    "gcTimeThresholdMs": (int, type(None)), "gcRowsThreshold": (int, type(None)),
    "globalTimeoutMs": (int, type(None)), "executorTimeoutSecs": (int,), "privateMode": (bool,),
    "dbosCloud": (bool,),
}
EXECUTOR_REQUIRED: dict[str, tuple[type, ...]] = {
    "executorId": (str,), "appId": (str,), "appVersion": (str,), "status": (str,), "hostId": (str, type(None)),
    "hostname": (str, type(None)), "createdAt": (str,), "updatedAt": (str,), "language": (str, type(None)),
    "dbosVersion": (str, type(None)), "executorMetadata": (dict, type(None)),
}
ERROR_MODEL_KEYS = {"title", "status", "detail"}


def _check_shape(body: dict[str, Any], required: dict[str, tuple[type, ...]]) -> None:
    assert set(body) == set(required), set(body) ^ set(required)
    for field, types in required.items():
        value = body[field]
        assert isinstance(value, types) and not (isinstance(value, bool) and bool not in types), (field, value)


def _problem(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = response.json()
    assert set(body) >= ERROR_MODEL_KEYS and body["status"] == status
    return body


def _new_key(relay: Relay, *args: str) -> str:
    env = {**os.environ, "RELAY_DATA_DIR": str(relay.data_dir)}
    out = subprocess.run([str(VENV_BIN / "relay"), "keys", "create", *args], env=env, check=True,
                         capture_output=True, text=True, timeout=60)
    key = out.stdout.strip()
    assert key.startswith("dbos_") and len(key) >= 5 + 43, key
    return key


def test_get_app_has_exactly_the_upstream_fields(relay: Relay) -> None:
    with relay.api() as client:
        assert client.put("/v2/orgs/local/apps/shape-app").status_code == 204
        response = client.get("/v2/orgs/local/apps/shape-app")
    assert response.status_code == 200
    body = response.json()
    _check_shape(body, APPLICATION_REQUIRED)
    assert body["executorTimeoutSecs"] == 60 and body["gcRowsThreshold"] == 1_000_000
    assert body["name"] == "shape-app" and body["orgId"] == "local" and body["status"] == "UNAVAILABLE"


@pytest.mark.parametrize(("field", "value"), [
    ("executorTimeoutSecs", 60), ("executorTimeoutSecs", 1), ("executorTimeoutSecs", 604_800),
    ("gcTimeThresholdMs", 3_600_000), ("gcTimeThresholdMs", 1), ("globalTimeoutMs", 86_400_000),
    ("gcRowsThreshold", 5),
])
def test_patch_units_round_trip(relay: Relay, field: str, value: int) -> None:
    with relay.api() as client:
        client.put("/v2/orgs/local/apps/units-app")
        assert client.patch("/v2/orgs/local/apps/units-app", json={field: value}).status_code == 204
        assert client.get("/v2/orgs/local/apps/units-app").json()[field] == value


def test_patch_null_clears_a_retention_setting(relay: Relay) -> None:
    with relay.api() as client:
        client.put("/v2/orgs/local/apps/clear-app")
        client.patch("/v2/orgs/local/apps/clear-app", json={"gcTimeThresholdMs": 5000, "executorTimeoutSecs": 7})
        assert client.patch("/v2/orgs/local/apps/clear-app", json={"gcTimeThresholdMs": None}).status_code == 204
        body = client.get("/v2/orgs/local/apps/clear-app").json()
    assert body["gcTimeThresholdMs"] is None and body["executorTimeoutSecs"] == 7  # untouched fields stay


@pytest.mark.parametrize("payload", [
    {"executorTimeoutSecs": 0}, {"executorTimeoutSecs": 604_801}, {"executorTimeoutSecs": "60"},
    {"executorTimeoutSecs": True}, {"executorTimeoutSecs": None}, {"gcRowsThreshold": 0},
    {"gcTimeThresholdMs": -1}, {"unknownField": 1}, {"globalTimeoutMs": 1.5},
])
def test_patch_rejects_bad_input_with_a_problem(relay: Relay, payload: dict[str, Any]) -> None:
    with relay.api() as client:
        client.put("/v2/orgs/local/apps/strict-app")
        before = client.get("/v2/orgs/local/apps/strict-app").json()
        body = _problem(client.patch("/v2/orgs/local/apps/strict-app", json=payload), 422)
        assert body["errors"], body
        assert client.get("/v2/orgs/local/apps/strict-app").json() == before  # nothing changed


def test_auth_errors(relay: Relay) -> None:
    other_org = _new_key(relay, "--org", "other")
    only_billing = _new_key(relay, "--app", "billing")
    url = f"{relay.url}/v2/orgs/local/apps/auth-app"
    with relay.api() as client:
        client.put("/v2/orgs/local/apps/auth-app")
    _problem(httpx.get(url), 401)
    _problem(httpx.get(url, headers={"Authorization": "Bearer dbos_not-a-real-key"}), 401)
    _problem(httpx.get(url, headers={"Authorization": f"Bearer {other_org}"}), 403)
    _problem(httpx.get(url, headers={"Authorization": f"Bearer {only_billing}"}), 403)
    with relay.api() as client:
        _problem(client.get("/v2/orgs/local/apps/no-such-app"), 404)
        _problem(client.get("/v2/orgs/local/apps/UPPER"), 422)


def test_executors_have_exactly_the_upstream_fields(relay: Relay) -> None:
    with play_executor(relay, "fields-app", "ex-1", version="v7", metadata={"zone": "a"}):
        wait_until(lambda: relay.executors("fields-app").get("ex-1") == "HEALTHY", timeout=10, what="HEALTHY")
        with relay.api() as client:
            [executor] = client.get("/v2/orgs/local/apps/fields-app/executors").json()
            app = client.get("/v2/orgs/local/apps/fields-app").json()
    _check_shape(executor, EXECUTOR_REQUIRED)
    assert executor["appId"] == app["id"] and executor["appVersion"] == "v7"
    assert executor["executorMetadata"] == {"zone": "a"} and executor["dbosVersion"] == "3.2.0"
    assert datetime.fromisoformat(executor["createdAt"]).tzinfo is not None
    assert app["status"] == "AVAILABLE" and app["language"] == "python"


@pytest.mark.parametrize(("key_kind", "status"), [("unknown", 401), ("other_app", 403)])
def test_websocket_refused_before_upgrade(relay: Relay, key_kind: str, status: int) -> None:
    key = "dbos_unknown_key_0123456789abcdef0123456789" if key_kind == "unknown" else _new_key(
        relay, "--app", "someone-else")
    with pytest.raises(InvalidStatus) as refused, connect(f"{relay.ws_url}websocket/refused-app/{key}"):
        pass
    response = refused.value.response
    assert response.status_code == status
    assert response.headers["content-type"] == "application/problem+json"
    assert json.loads(response.body)["status"] == status
    assert key not in relay.process.output()  # keys never reach the logs


def test_healthz(relay: Relay) -> None:
    assert httpx.get(f"{relay.url}/healthz").json() == {"status": "ok"}
