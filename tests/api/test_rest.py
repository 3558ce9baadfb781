"""The REST admin API in-process (``conftest.Api``: the app on a real store, a fake Temporal client, fake sockets
in the hub): applications, executors, tokens, audit logs, deletion of apps, revocation, and strictness, on SQLite
and on PostgreSQL. Response shapes are checked against the upstream facts in ``test_compat``. What needs real
executors, workflows or sockets is in ``tests/e2e/test_rest.py``."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlmodel import Session

from api.routes import apps as app_routes
from core import metrics
from core.gateways import GatewayRegistry
from core.models import GatewayProcess
from core.store import Store
from gateway.revocation import APP_DELETED_REASON, REVOKED_REASON
from tests.api.conftest import Api
from tests.api.test_compat import assert_problem, assert_upstream
from tests.api.test_openapi import SPEC
from workflows.contracts.common import ExecutorStatus, lifecycle_workflow_id
from workflows.contracts.lifecycle import RemovedSignal

ORG = "/v2/orgs/local"


async def _audit(client: httpx.AsyncClient, **params: Any) -> list[dict[str, Any]]:
    response = await client.get(f"{ORG}/audit-logs", params=params)
    assert response.status_code == 200, response.text
    entries: list[dict[str, Any]] = response.json()
    for entry in entries:
        assert_upstream(entry, "AuditLogEntry")
    return entries


def _registry(store: Store, app: str) -> dict[str, str]:
    return {e.executor_id: e.status.value for e in store.list_executors("local", app)}


# -- applications -----------------------------------------------------------------------------------------------


async def test_get_app_has_the_upstream_fields_and_defaults(api: Api) -> None:
    async with api.client() as client:
        assert (await client.put(f"{ORG}/apps/shape-app")).status_code == 204
        response = await client.get(f"{ORG}/apps/shape-app")
    assert response.status_code == 200
    body = response.json()
    assert_upstream(body, "Application")
    assert body["executorTimeoutSecs"] == 60 and body["gcRowsThreshold"] == 1_000_000
    assert body["name"] == "shape-app" and body["orgId"] == "local" and body["status"] == "UNAVAILABLE"


async def test_register_is_idempotent_and_audited_with_the_caller(api: Api) -> None:
    async with api.client() as client:
        assert (await client.put(f"{ORG}/apps/reg-app", json={"privateMode": True})).status_code == 204
        assert (await client.patch(f"{ORG}/apps/reg-app", json={"executorTimeoutSecs": 9})).status_code == 204
        assert (await client.put(f"{ORG}/apps/reg-app")).status_code == 204  # again: settings stay
        body = (await client.get(f"{ORG}/apps/reg-app")).json()
        assert (body["privateMode"], body["executorTimeoutSecs"]) == (True, 9)
        assert (await client.put(f"{ORG}/apps/reg-app", json={"privateMode": False})).status_code == 204
        assert (await client.get(f"{ORG}/apps/reg-app")).json()["privateMode"] is False
        entries = await _audit(client, target="reg-app")
    assert [e["operation"] for e in entries] == ["app.updated", "app.updated", "app.registered"]  # newest first
    for entry in entries:
        assert entry["subject"]["type"] == "api_key" and entry["subject"]["display"] == "dev"
        assert entry["sourceIp"] == "127.0.0.1"
        assert entry["target"] == {"type": "application", "id": "reg-app"}


async def test_list_apps_shows_a_restricted_key_only_its_apps(api: Api) -> None:
    async with api.client() as client:
        for name in ("list-a", "list-b"):
            await client.put(f"{ORG}/apps/{name}")
        everything = (await client.get(f"{ORG}/apps")).json()
    assert {"list-a", "list-b"} <= {a["name"] for a in everything}
    for app in everything:
        assert_upstream(app, "Application")
    assert [a["name"] for a in everything] == sorted(a["name"] for a in everything)
    async with api.client(api.new_key(apps=["list-a"])) as only_a:
        response = await only_a.get(f"{ORG}/apps")
    assert [a["name"] for a in response.json()] == ["list-a"]


@pytest.mark.parametrize(("field", "value"), [
    ("executorTimeoutSecs", 60), ("executorTimeoutSecs", 1), ("executorTimeoutSecs", 604_800),
    ("gcTimeThresholdMs", 3_600_000), ("gcTimeThresholdMs", 1000), ("globalTimeoutMs", 86_400_000),
    ("gcRowsThreshold", 5), ("executorTimeoutSecs", 90.0),
])
async def test_patch_units_round_trip(api: Api, field: str, value: int) -> None:
    async with api.client() as client:
        await client.put(f"{ORG}/apps/units-app")
        assert (await client.patch(f"{ORG}/apps/units-app", json={field: value})).status_code == 204
        assert (await client.get(f"{ORG}/apps/units-app")).json()[field] == value


async def test_patch_null_clears_a_retention_setting(api: Api) -> None:
    async with api.client() as client:
        await client.put(f"{ORG}/apps/clear-app")
        await client.patch(f"{ORG}/apps/clear-app", json={"gcTimeThresholdMs": 5000, "executorTimeoutSecs": 7,
                                                          "globalTimeoutMs": 9000, "gcRowsThreshold": 10})
        cleared = {"gcTimeThresholdMs": None, "globalTimeoutMs": None, "gcRowsThreshold": None}
        assert (await client.patch(f"{ORG}/apps/clear-app", json=cleared)).status_code == 204
        body = (await client.get(f"{ORG}/apps/clear-app")).json()
    assert body.items() >= {**cleared, "executorTimeoutSecs": 7}.items()  # untouched fields stay


@pytest.mark.parametrize(("field", "value", "detail"), [
    ("gcTimeThresholdMs", 7, "body.gcTimeThresholdMs: 7 ms — did you mean 7 s (7000) or 7 days (604800000)? "
                             "gcTimeThresholdMs is in milliseconds, at least 1000 (1 s); null clears it"),
    ("globalTimeoutMs", 999, "body.globalTimeoutMs: 999 ms — did you mean 999 s (999000) or 999 days "
                             "(86313600000)? globalTimeoutMs is in milliseconds, at least 1000 (1 s); null clears it"),
    ("gcTimeThresholdMs", 0, "body.gcTimeThresholdMs: 0 ms: gcTimeThresholdMs is in milliseconds, at least 1000 "
                             "(1 s); null clears it"),
])
async def test_a_threshold_under_a_second_is_refused_naming_the_unit(api: Api, field: str, value: int,
                                                                     detail: str) -> None:
    """``{"gcTimeThresholdMs": 7}`` was once taken, and the next retention round deleted every finished
    workflow. The 422's detail reads the value back in the units it was likely meant in."""
    async with api.client() as client:
        await client.put(f"{ORG}/apps/slip-app")
        await client.patch(f"{ORG}/apps/slip-app", json={field: 604_800_000})
        body = assert_problem(await client.patch(f"{ORG}/apps/slip-app", json={field: value}), 422)
        assert body["detail"] == detail
        assert body["errors"][0]["location"] == f"body.{field}" and body["errors"][0]["value"] == value
        assert (await client.get(f"{ORG}/apps/slip-app")).json()[field] == 604_800_000  # nothing changed


def _deep(depth: int) -> str:
    """JSON text nested ``depth`` deep: objects and arrays in turn."""
    return '{"k": [' * (depth // 2) + "1" + "]}" * (depth // 2)


DEEP_BODIES = [  # (method, path under the org, body with a free-form or typed spot nested deep)
    ("PATCH", "/apps/deep-app", '{"gcTimeThresholdMs": %s}'),
    ("PUT", "/apps/deep-app", '{"privateMode": %s}'),
    ("POST", "/tokens/deep-token", '{"appNames": %s}'),
    ("POST", "/apps/deep-app/alerting-rules", '{"ruleType": "SlowQueue", "ruleMetadata": {"x": %s}}'),
    ("POST", "/apps/deep-app/workflows/search", '{"attributes": {"x": %s}}'),
    ("POST", "/apps/deep-app/workflows/aggregates", '{"groupByStatus": true, "selectCount": true, "attributes": %s}'),
    ("POST", "/apps/deep-app/workflows/w-1/cancel", '{"cancelChildren": %s}'),
    ("POST", "/apps/deep-app/workflows/bulk-cancel", '{"workflowIds": %s}'),
    ("PUT", "/apps/deep-app/recovery-pause", '{"expiresInSecs": 60, "reason": %s}'),
]


@pytest.mark.parametrize("depth", [300, 600, 900])
@pytest.mark.parametrize(("method", "path", "body"), DEEP_BODIES, ids=[f"{m} {p}" for m, p, _ in DEEP_BODIES])
async def test_a_body_nested_hundreds_deep_is_a_422_never_a_500(api: Api, method: str, path: str, body: str,
                                                                depth: int) -> None:
    """Bodies 300, 600 and 900 levels deep once answered 500 (a RecursionError) where a free-form value was kept or
    forwarded; every body is bounded in depth as in size (``core.nesting``), and nothing reaches an executor."""
    async with api.client() as client:
        await client.put(f"{ORG}/apps/deep-app")
        response = await client.request(method, f"{ORG}{path}", content=body % _deep(depth),
                                        headers={"Content-Type": "application/json"})
    problem = assert_problem(response, 422)
    assert problem["errors"] and len(response.content) < 4096, problem


@pytest.mark.parametrize("payload", [
    {"executorTimeoutSecs": 0}, {"executorTimeoutSecs": 604_801}, {"executorTimeoutSecs": "60"},
    {"executorTimeoutSecs": True}, {"executorTimeoutSecs": None}, {"executorTimeoutSecs": 1.5},
    {"gcRowsThreshold": 0}, {"gcRowsThreshold": -5}, {"gcRowsThreshold": 2**53}, {"gcTimeThresholdMs": -1},
    {"gcTimeThresholdMs": 0}, {"globalTimeoutMs": 0}, {"globalTimeoutMs": 1.5}, {"gcTimeThresholdMs": 10**30},
    {"gcTimeThresholdMs": 1}, {"globalTimeoutMs": 999}, {"gcTimeThresholdMs": -10**30},
    {"globalTimeoutMs": "1000"}, {"privateMode": "yes"}, {"privateMode": None}, {"unknownField": 1},
    {"$schema": None}, [], "text", None,
])
async def test_patch_rejects_bad_input_with_a_problem(api: Api, payload: Any) -> None:
    async with api.client() as client:
        await client.put(f"{ORG}/apps/strict-app")
        before = (await client.get(f"{ORG}/apps/strict-app")).json()
        response = await client.patch(f"{ORG}/apps/strict-app", content=json.dumps(payload),
                                      headers={"Content-Type": "application/json"})
        body = assert_problem(response, 422)
        assert body["errors"], body
        assert (await client.get(f"{ORG}/apps/strict-app")).json() == before  # nothing changed


@pytest.mark.parametrize(("content", "content_type"), [
    (b'{"executorTimeoutSecs": 1e999}', "application/json"),
    (b'{"executorTimeoutSecs": 1' + b"0" * 5000 + b"}", "application/json"),
    (b'{"executorTimeoutSecs": ', "application/json"),
    (b'{"privateMode": "\xff\xfe"}', "application/json"),
    (b"[" * 100_000 + b"]" * 100_000, "application/json"),
])
async def test_malformed_bodies_are_4xx_problems(api: Api, content: bytes, content_type: str) -> None:
    async with api.client() as client:
        await client.put(f"{ORG}/apps/malformed-app")
        response = await client.patch(f"{ORG}/apps/malformed-app", content=content,
                                      headers={"Content-Type": content_type})
    assert response.status_code in (400, 422), response.text
    assert_problem(response, response.status_code)


# Every operation that takes a body, from the spec, with its path parameters filled in.
JSON_BODY_OPERATIONS = [(method.upper(), path) for path, item in json.loads(SPEC.read_text())["paths"].items()
                        for method, operation in item.items() if "requestBody" in operation]
PATH_VALUES = {"orgName": "local", "appName": "media-app", "executorId": "ex-1", "scheduleName": "nightly",
               "workflowId": "wf-1", "tokenName": "media-token"}


@pytest.mark.parametrize(("method", "path"), JSON_BODY_OPERATIONS)
@pytest.mark.parametrize(("content", "content_type"), [
    (b'{"ruleType": "SlowQueue"}', "application/x-www-form-urlencoded"),  # what `curl -d` sends
    (b"executorTimeoutSecs=5", "application/x-www-form-urlencoded"),
    (b"\x00\x01", "application/octet-stream"),
    (b'{"expiresInSecs": 60}', "text/plain"),
    (b'{"expiresInSecs": 60}', None),
])
async def test_a_body_that_is_not_sent_as_json_is_415(api: Api, method: str, path: str, content: bytes,
                                                      content_type: str | None) -> None:
    async with api.client() as client:
        await client.put(f"{ORG}/apps/media-app")
        headers = {} if content_type is None else {"Content-Type": content_type}
        response = await client.request(method, path.format(**PATH_VALUES), content=content, headers=headers)
    body = assert_problem(response, 415)
    assert "Content-Type: application/json" in body["detail"], body
    assert (f"{content_type!r} was sent" if content_type else "no Content-Type was sent") in body["detail"], body


async def test_json_with_parameters_or_a_json_suffix_is_json(api: Api) -> None:
    async with api.client() as client:
        await client.put(f"{ORG}/apps/media-suffix-app")
        for content_type in ("application/json; charset=utf-8", "application/merge-patch+json"):
            response = await client.patch(f"{ORG}/apps/media-suffix-app", content=b'{"executorTimeoutSecs": 7}',
                                          headers={"Content-Type": content_type})
            assert response.status_code == 204, (content_type, response.text)
        # No body at all is no body, whatever the header says: registerApp's body is optional.
        empty = await client.put(f"{ORG}/apps/media-suffix-app", headers={"Content-Type": "text/plain"})
        assert empty.status_code == 204, empty.text


async def test_put_rejects_bad_bodies(api: Api) -> None:
    async with api.client() as client:
        for payload in ({"privateMode": "true"}, {"privateMode": None}, {"other": 1}, None, [1]):
            response = await client.put(f"{ORG}/apps/put-strict-app", content=json.dumps(payload),
                                        headers={"Content-Type": "application/json"})
            assert_problem(response, 422)
        assert_problem(await client.get(f"{ORG}/apps/put-strict-app"), 404)  # none of them registered it


async def test_auth_errors(api: Api) -> None:
    other_org = api.new_key(org="other")
    only_billing = api.new_key(apps=["billing"])
    url = f"{ORG}/apps/auth-app"
    async with api.client() as client:
        await client.put(url)
    async with api.anonymous() as anonymous:
        assert_problem(await anonymous.get(url), 401)
        assert_problem(await anonymous.get(url, headers={"Authorization": "Basic dXNlcjpwYXNz"}), 401)
    async with api.client("dbos_not-a-real-key") as unknown:
        assert_problem(await unknown.get(url), 401)
    async with api.client(other_org) as other:
        assert_problem(await other.get(url), 403)
        assert_problem(await other.get("/v2/orgs/nobody_here/apps"), 404)
        assert_problem(await other.get("/v2/orgs/local/apps"), 403)
    async with api.client(only_billing) as billing:
        assert_problem(await billing.get(url), 403)
        assert_problem(await billing.get(f"{ORG}/apps/not-there"), 403)
    async with api.client() as client:
        assert_problem(await client.get(f"{ORG}/apps/no-such-app"), 404)
        assert_problem(await client.get(f"{ORG}/apps/UPPER"), 422)
        assert_problem(await client.get(f"{ORG}/apps/ab"), 422)
        assert_problem(await client.get(f"{ORG}/apps/{'a' * 31}"), 422)


# -- executors ---------------------------------------------------------------------------------------------------


async def test_executors_have_the_upstream_fields(api: Api) -> None:
    async with api.client() as client:
        await client.put(f"{ORG}/apps/fields-app")
        api.record("fields-app", "ex-1", version="v7", metadata={"zone": "a"})
        [executor] = (await client.get(f"{ORG}/apps/fields-app/executors")).json()
        app = (await client.get(f"{ORG}/apps/fields-app")).json()
    assert_upstream(executor, "Executor")
    assert executor["appId"] == app["id"] and executor["appVersion"] == "v7"
    assert executor["executorMetadata"] == {"zone": "a"} and executor["dbosVersion"] == "3.2.0"
    assert datetime.fromisoformat(executor["createdAt"]).tzinfo is not None
    assert app["status"] == "AVAILABLE" and app["language"] == "python"


async def test_executors_name_the_gateway_that_holds_them(api: Api) -> None:
    """A Relay extension: the gateway process's identity, once that process is on record."""
    async with api.client() as client:
        await client.put(f"{ORG}/apps/gateway-app")
        api.record("gateway-app", "ex-1")
        with Session(api.store.engine) as s:
            on_record = s.get(GatewayProcess, api.gateway.task_queue)
        [executor] = (await client.get(f"{ORG}/apps/gateway-app/executors")).json()
        assert executor["gateway"] == (None if on_record is None else on_record.identity)
        if on_record is None:
            GatewayRegistry(api.store.engine).register(api.gateway.task_queue, "gateway-7")
            [executor] = (await client.get(f"{ORG}/apps/gateway-app/executors")).json()
            assert executor["gateway"] == "gateway-7"
    assert_upstream(executor, "Executor")


# -- deleting an app with executors -----------------------------------------------------------------------------


async def test_delete_app_signals_every_lifecycle_then_closes_its_sockets(api: Api) -> None:
    """Every executor on record, and one connected here but not recorded yet, is told ``removed`` (one whose
    workflow has already ended counts as an orphan); the sockets close with 1008; the audit row names them all."""
    app = "doomed-app"
    async with api.client() as client:
        await client.put(f"{ORG}/apps/{app}")
        api.record(app, "dead-1", ExecutorStatus.DEAD)
        api.record(app, "gone-1", ExecutorStatus.DISCONNECTED)
        api.record(app, "live-1")
        api.connect(app, "live-1")
        api.connect(app, "new-1")  # its `connected` is not recorded yet
        ids = ["dead-1", "live-1", "new-1"]  # gone-1's workflow has ended: not running, NOT_FOUND
        api.temporal.running |= {lifecycle_workflow_id("local", app, i) for i in ids}
        assert (await client.delete(f"{ORG}/apps/{app}")).status_code == 204
        assert_problem(await client.get(f"{ORG}/apps/{app}"), 404)
        assert_problem(await client.get(f"{ORG}/apps/{app}/executors"), 404)
        [deleted] = await _audit(client, target=app, operation="app.deleted")
    signalled = {workflow_id: (name, arg) for workflow_id, name, arg in api.temporal.signals}
    for executor_id in ids:
        name, arg = signalled[lifecycle_workflow_id("local", app, executor_id)]
        assert name == "removed" and isinstance(arg, RemovedSignal) and arg.reason == "app deleted"
    assert lifecycle_workflow_id("local", app, "gone-1") not in signalled
    assert api.closed["live-1"] == api.closed["new-1"] == (1008, APP_DELETED_REASON)
    assert sorted(deleted["details"]["executors"]) == ["dead-1", "gone-1", "live-1", "new-1"]
    assert deleted["subject"]["display"] == "dev"


async def test_delete_app_is_503_and_keeps_the_app_while_temporal_is_unreachable(
        api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    app = "kept-app"
    monkeypatch.setattr(app_routes, "SIGNAL_BACKOFF", timedelta(0))
    monkeypatch.setattr(api.temporal, "unreachable", True)
    async with api.client() as client:
        await client.put(f"{ORG}/apps/{app}")
        api.record(app, "kept-1")
        api.connect(app, "kept-1")
        assert_problem(await client.delete(f"{ORG}/apps/{app}"), 503)
        assert (await client.get(f"{ORG}/apps/{app}")).status_code == 200
    assert _registry(api.store, app) == {"kept-1": "HEALTHY"}
    assert "kept-1" not in api.closed


async def test_delete_unknown_app_is_404(api: Api) -> None:
    async with api.client() as client:
        assert_problem(await client.delete(f"{ORG}/apps/never-was"), 404)


# -- tokens ------------------------------------------------------------------------------------------------------


async def test_token_lifecycle(api: Api) -> None:
    async with api.client() as client:
        created = await client.post(f"{ORG}/tokens/ci-deployer", json={"appNames": ["tok-app", "tok-later"]})
        assert created.status_code == 201, created.text
        assert_upstream(created.json(), "TokenCreated")
        key = created.json()["token"]
        assert key.startswith("dbos_") and len(key) >= 5 + 43
        assert_problem(await client.post(f"{ORG}/tokens/ci-deployer"), 409)
        await client.put(f"{ORG}/apps/tok-app")
        app_id = (await client.get(f"{ORG}/apps/tok-app")).json()["id"]
        tokens = (await client.get(f"{ORG}/tokens")).json()
        [listed] = [t for t in tokens if t["tokenName"] == "ci-deployer"]
        assert_upstream(listed, "Token")
        assert key not in json.dumps(tokens)
        assert (listed["appIds"], listed["appNames"], listed["permissions"]) == (
            [app_id], ["tok-app", "tok-later"], [])
        async with api.client(key) as new:
            # The new key works, for its apps only.
            assert (await new.get(f"{ORG}/apps/tok-app")).status_code == 200
            assert_problem(await new.get(f"{ORG}/apps/shape-app"), 403)
            assert (await client.delete(f"{ORG}/tokens/ci-deployer")).status_code == 204
            assert_problem(await new.get(f"{ORG}/apps/tok-app"), 401)
        assert_problem(await client.delete(f"{ORG}/tokens/ci-deployer"), 404)
        assert "ci-deployer" not in [t["tokenName"] for t in (await client.get(f"{ORG}/tokens")).json()]
        # The name is free again.
        assert (await client.post(f"{ORG}/tokens/ci-deployer")).status_code == 201
        assert (await client.delete(f"{ORG}/tokens/ci-deployer")).status_code == 204
        entries = await _audit(client, target="ci-deployer")
    assert [e["operation"] for e in entries] == ["token.deleted", "token.created", "token.deleted", "token.created"]
    assert all(e["target"] == {"type": "token", "id": "ci-deployer"} for e in entries)
    assert all(e["subject"]["display"] == "dev" and e["sourceIp"] == "127.0.0.1" for e in entries)


@pytest.mark.parametrize("payload", [
    {"appNames": ["ok-app", "ok-app"]}, {"appNames": ["UPPER"]}, {"appNames": ["ab"]}, {"appNames": "ok-app"},
    {"permissions": ["admin"]}, {"scopes": []}, {"appNames": [1]}, None,
])
async def test_create_token_rejects_bad_bodies(api: Api, payload: Any) -> None:
    async with api.client() as client:
        response = await client.post(f"{ORG}/tokens/bad-body", content=json.dumps(payload),
                                     headers={"Content-Type": "application/json"})
        assert_problem(response, 422)
        assert "bad-body" not in [t["tokenName"] for t in (await client.get(f"{ORG}/tokens")).json()]


async def test_token_names_with_control_characters_are_refused(api: Api) -> None:
    async with api.client() as client:
        assert_problem(await client.post(f"{ORG}/tokens/bad%00name"), 422)
        assert_problem(await client.post(f"{ORG}/tokens/{'n' * 101}"), 422)
        assert (await client.post(f"{ORG}/tokens/ünï cödé")).status_code == 201
        assert (await client.delete(f"{ORG}/tokens/ünï cödé")).status_code == 204


async def test_app_restricted_keys_cannot_manage_tokens_or_read_the_audit_log(api: Api) -> None:
    async with api.client(api.new_key(apps=["some-app"])) as restricted:
        assert_problem(await restricted.post(f"{ORG}/tokens/escalate"), 403)
        assert_problem(await restricted.get(f"{ORG}/tokens"), 403)
        assert_problem(await restricted.delete(f"{ORG}/tokens/dev"), 403)
        assert_problem(await restricted.get(f"{ORG}/audit-logs"), 403)


async def test_deleting_a_token_closes_its_executor_sockets_at_once(api: Api) -> None:
    app = "revoke-app"
    async with api.client() as client:
        await client.put(f"{ORG}/apps/{app}")
        key = (await client.post(f"{ORG}/tokens/revoke-me", json={"appNames": [app]})).json()["token"]
        api.connect(app, "rev-1", key=key)
        api.connect(app, "keep-1")
        assert (await client.delete(f"{ORG}/tokens/revoke-me")).status_code == 204
    assert api.closed["rev-1"] == (1008, REVOKED_REASON)
    assert "keep-1" not in api.closed  # a socket of another key stays up


# -- audit log ---------------------------------------------------------------------------------------------------


async def test_audit_log_filters_and_pages_newest_first(api: Api) -> None:
    app = "audit-app"
    async with api.client() as client:
        before = datetime.now(UTC) - timedelta(milliseconds=1)
        await client.put(f"{ORG}/apps/{app}")
        for secs in (11, 12, 13):
            await client.patch(f"{ORG}/apps/{app}", json={"executorTimeoutSecs": secs})
        updates = await _audit(client, target=app, operation="app.updated")
        assert [e["details"]["executorTimeoutSecs"] for e in updates] == [13, 12, 11]
        times = [datetime.fromisoformat(e["emitTime"]) for e in updates]
        assert times == sorted(times, reverse=True) and times[-1] >= before
        assert await _audit(client, target=app, operation="app.updated", limit=1, offset=1) == updates[1:2]
        assert await _audit(client, target=app, startTime=updates[1]["emitTime"]) == updates[:2]  # inclusive
        assert (await _audit(client, target=app, endTime=updates[1]["emitTime"])
                == (await _audit(client, target=app))[2:])
        assert await _audit(client, target=app, startTime=before.isoformat(), operation="app.registered")
        dev = updates[0]["subject"]
        assert await _audit(client, target=app, subject="dev") == await _audit(client, target=app, subject=dev["id"])
        assert len(await _audit(client, target=app, subject="dev")) == 4
        assert await _audit(client, target=app, subject="system") == []
        assert await _audit(client, target=app, operation="no.such.operation") == []


async def test_system_actions_have_the_system_subject(api: Api) -> None:
    async with api.client() as client:
        await client.put(f"{ORG}/apps/system-app")
        api.record("system-app", "sys-1")
        [healthy] = await _audit(client, target="system-app", operation="executor.healthy")
        assert await _audit(client, target="sys-1", operation="executor.healthy") == [healthy]
        assert healthy in await _audit(client, target="system-app", subject="system")
    assert healthy["subject"] == {"type": "system", "id": "system", "display": "Relay"}
    assert healthy["target"] == {"type": "application", "id": "system-app"}
    assert healthy["details"]["executorId"] == "sys-1"


@pytest.mark.parametrize("query", [
    "limit=0", "limit=1001", "limit=-1", "limit=abc", "limit=1.5", "offset=-1", f"offset={2**64}",
    "startTime=yesterday", "startTime=0.5", "startTime=2025-01-01T00:00:00", "endTime=2025-13-01T00:00:00Z",
    "startTime=0001-01-01T00:00:00%2B01:00", "endTime=9999-12-31T23:59:59-01:00", "operation=a%00b",
    f"target={'t' * 201}", "subject=",
])
async def test_audit_log_rejects_bad_queries(api: Api, query: str) -> None:
    async with api.client() as client:
        assert_problem(await client.get(f"{ORG}/audit-logs?{query}"), 422)


# -- health, metrics and the spec --------------------------------------------------------------------------------


async def test_openapi_json_is_served_and_is_the_committed_spec(api: Api) -> None:
    async with api.anonymous() as client:
        assert (await client.get("/openapi.json")).json() == json.loads(SPEC.read_text())


async def test_healthz(api: Api) -> None:
    async with api.anonymous() as client:
        assert (await client.get("/healthz")).json() == {"status": "ok"}


async def test_readyz_is_503_with_the_reason_while_temporal_is_out_of_contact(api: Api) -> None:
    contact = api.gateway.contact_state
    async with api.anonymous() as client:
        assert (await client.get("/readyz")).json() == {"status": "ok"}
        contact.observe(False, "connection refused")
        try:
            body = assert_problem(await client.get("/readyz"), 503)
        finally:
            contact.observe(True)
    assert "Temporal unreachable" in body["detail"] and "connection refused" in body["detail"]


def _samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_metrics_count_executors_of_the_callers_org_and_this_gateways_sockets(api: Api) -> None:
    app = "metered-app"
    async with api.client() as client:
        await client.put(f"{ORG}/apps/{app}")
        api.record(app, "metered-1")
        api.connect(app, "metered-1")
        text = (await client.get("/metrics")).text
    samples = _samples(text)
    assert samples[("relay_executors", frozenset({"org": "local", "app": app, "status": "HEALTHY"}.items()))] == 1
    assert samples[("relay_gateway_connections", frozenset())] == len(api.gateway.hub)
    async with api.anonymous() as anonymous:
        assert (await anonymous.get("/metrics")).status_code == 401
    async with api.client(api.new_key(org="elsewhere")) as other:
        assert 'org="local"' not in (await other.get("/metrics")).text


async def test_metrics_of_an_app_restricted_key_are_of_its_apps_only(api: Api) -> None:
    async with api.client() as client:
        for app in ("scoped-mine", "scoped-other"):
            await client.put(f"{ORG}/apps/{app}")
    metrics.RECOVERIES.labels("local", "scoped-mine", "succeeded").inc()
    metrics.RECOVERIES.labels("local", "scoped-other", "succeeded").inc()
    async with api.client(api.new_key(apps=["scoped-mine"])) as restricted:
        text = (await restricted.get("/metrics")).text
    apps = {dict(labels).get("app") for _, labels in _samples(text)} - {None}
    assert apps == {"scoped-mine"}, text
    assert ("relay_recoveries_total", frozenset({"org": "local", "app": "scoped-mine", "outcome": "succeeded"}
                                                .items())) in _samples(text)
    async with api.client() as client:  # an org-wide key sees both
        assert {"scoped-mine", "scoped-other"} <= {dict(labels).get("app")
                                                   for _, labels in _samples((await client.get("/metrics")).text)}


async def test_metrics_have_the_listeners_names_and_no_created_series(api: Api) -> None:
    async with api.client() as client:
        response = await client.get("/metrics")
    assert response.headers["content-type"].startswith("text/plain")
    served = {family.name for family in text_string_to_metric_families(response.text)}
    listener = {family.name for family in metrics.registry_with(api.store.engine).collect()}
    assert served == listener, served ^ listener
    assert {"relay_executors", "relay_gateway_connections", "relay_recoveries", "process_cpu_seconds"} <= served
    assert "_created" not in response.text
