"""Alerting rules through the REST API in-process (``conftest.Api``), on SQLite and on PostgreSQL: the three
upstream operations, their bodies against the upstream schema facts, the problems, and the audit trail."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from tests.api.conftest import Api
from tests.api.test_compat import (
    INTEGER_OR_NULL,
    OBJ,
    STRING,
    STRING_OR_NULL,
    Shape,
    _types,
    assert_problem,
    conformance_errors,
)

ORG = "/v2/orgs/local"

# Upstream ``AlertingRule``, read off conductor-openapi.json: every property required; ruleMetadata is any JSON.
ALERTING_RULE = Shape("AlertingRule", {
    "id": STRING, "appId": STRING, "receivingAppId": STRING, "ruleType": STRING,
    "ruleMetadata": _types("string", "integer", "boolean", OBJ, "array", "null", "number"),
    "minIntervalSecs": INTEGER_OR_NULL, "lastFiredAt": STRING_OR_NULL,
}, frozenset({"id", "appId", "receivingAppId", "ruleType", "ruleMetadata", "minIntervalSecs", "lastFiredAt"}),
    enums={"ruleType": frozenset({"WorkflowFailure", "SlowQueue", "UnresponsiveApplication"})})


def _rules(app: str) -> str:
    return f"{ORG}/apps/{app}/alerting-rules"


def assert_rule(body: Any) -> None:
    errors = conformance_errors(body, ALERTING_RULE)
    assert not errors, errors


async def _app_id(client: httpx.AsyncClient, app: str) -> str:
    assert (await client.put(f"{ORG}/apps/{app}")).status_code == 204
    body: dict[str, Any] = (await client.get(f"{ORG}/apps/{app}")).json()
    return str(body["id"])


async def _audit(client: httpx.AsyncClient, app: str, operation: str) -> list[dict[str, Any]]:
    response = await client.get(f"{ORG}/audit-logs", params={"target": app, "operation": operation})
    assert response.status_code == 200, response.text
    entries: list[dict[str, Any]] = response.json()
    return entries


async def test_create_list_delete_as_upstream_says(api: Api) -> None:
    async with api.client() as client:
        app_id = await _app_id(client, "alerts-app")
        receiver_id = await _app_id(client, "alerts-receiver")
        created = await client.post(_rules("alerts-app"), json={
            "ruleType": "SlowQueue", "ruleMetadata": {"queueName": "orders", "thresholdSecs": 30},
            "minIntervalSecs": 300, "receivingAppName": "alerts-receiver"})
        assert created.status_code == 201, created.text
        assert created.headers["content-type"] == "application/json"
        rule = created.json()
        assert_rule(rule)
        assert (rule["appId"], rule["receivingAppId"], rule["ruleType"]) == (app_id, receiver_id, "SlowQueue")
        assert (rule["minIntervalSecs"], rule["lastFiredAt"]) == (300, None)
        assert rule["ruleMetadata"] == {"queueName": "orders", "thresholdSecs": 30}

        default = (await client.post(_rules("alerts-app"), json={"ruleType": "WorkflowFailure",
                                                                  "ruleMetadata": {}})).json()
        assert_rule(default)
        assert (default["receivingAppId"], default["minIntervalSecs"]) == (app_id, None)  # its own app

        listed = await client.get(_rules("alerts-app"))
        assert listed.status_code == 200
        for item in listed.json():
            assert_rule(item)
        assert [r["id"] for r in listed.json()] == [rule["id"], default["id"]]

        deleted = await client.delete(f"{_rules('alerts-app')}/{rule['id']}")
        assert deleted.status_code == 204 and deleted.content == b""
        assert [r["id"] for r in (await client.get(_rules("alerts-app"))).json()] == [default["id"]]
        assert_problem(await client.delete(f"{_rules('alerts-app')}/{rule['id']}"), 404)

        [created_row] = [e for e in await _audit(client, "alerts-app", "alert_rule.created")
                         if e["details"]["ruleId"] == rule["id"]]
        assert created_row["details"]["minIntervalSecs"] == 300
        assert created_row["details"]["receivingAppName"] == "alerts-receiver"
        assert created_row["subject"]["type"] == "api_key"
        [deleted_row] = await _audit(client, "alerts-app", "alert_rule.deleted")
        assert deleted_row["details"]["ruleId"] == rule["id"]


@pytest.mark.parametrize("body", [
    {"ruleMetadata": {}},  # ruleType is required
    {"ruleType": "WorkflowFailure"},  # so is ruleMetadata
    {"ruleType": "Nope", "ruleMetadata": {}},
    {"ruleType": "SlowQueue", "ruleMetadata": {"queueName": ""}},
    {"ruleType": "SlowQueue", "ruleMetadata": {"queueName": 7}},
    {"ruleType": "SlowQueue", "ruleMetadata": {"queueName": "q", "thresholdSecs": "60"}},
    {"ruleType": "UnresponsiveApplication", "ruleMetadata": {"thresholdSecs": -1}},
    {"ruleType": "WorkflowFailure", "ruleMetadata": {"minFailures": 0}},
    {"ruleType": "WorkflowFailure", "ruleMetadata": "every failure"},
    {"ruleType": "WorkflowFailure", "ruleMetadata": {}, "minIntervalSecs": -1},
    {"ruleType": "WorkflowFailure", "ruleMetadata": {}, "minIntervalSecs": "60"},
    {"ruleType": "WorkflowFailure", "ruleMetadata": {}, "surprise": 1},
], ids=lambda b: repr(b)[:60])
async def test_bad_bodies_are_422(api: Api, body: dict[str, Any]) -> None:
    async with api.client() as client:
        await _app_id(client, "alerts-bad")
        assert_problem(await client.post(_rules("alerts-bad"), json=body), 422)
        assert (await client.get(_rules("alerts-bad"))).json() == []


async def test_unknown_apps_and_rules_are_404(api: Api) -> None:
    body = {"ruleType": "UnresponsiveApplication", "ruleMetadata": None}
    async with api.client() as client:
        assert_problem(await client.get(_rules("alerts-none")), 404)
        assert_problem(await client.post(_rules("alerts-none"), json=body), 404)
        await _app_id(client, "alerts-404")
        assert_problem(await client.post(_rules("alerts-404"), json={**body, "receivingAppName": "alerts-none"}), 404)
        assert_problem(await client.delete(f"{_rules('alerts-404')}/no-such-rule"), 404)
        # A rule of another app is not found through this one.
        await _app_id(client, "alerts-other")
        other = (await client.post(_rules("alerts-other"), json=body)).json()
        assert_problem(await client.delete(f"{_rules('alerts-404')}/{other['id']}"), 404)


async def test_rules_of_a_deleted_app_do_not_come_back_with_a_new_one(api: Api) -> None:
    body = {"ruleType": "WorkflowFailure", "ruleMetadata": {"workflowName": "checkout"}}
    async with api.client() as client:
        await _app_id(client, "alerts-reborn")
        assert (await client.post(_rules("alerts-reborn"), json=body)).status_code == 201
        assert (await client.delete(f"{ORG}/apps/alerts-reborn")).status_code == 204
        await _app_id(client, "alerts-reborn")
        assert (await client.get(_rules("alerts-reborn"))).json() == []


async def test_restricted_keys_need_both_apps(api: Api) -> None:
    async with api.client() as client:
        await _app_id(client, "alerts-mine")
        await _app_id(client, "alerts-theirs")
    key = api.new_key(apps=["alerts-mine"])
    async with api.client(key) as restricted:
        assert_problem(await restricted.post(_rules("alerts-mine"), json={
            "ruleType": "WorkflowFailure", "ruleMetadata": {}, "receivingAppName": "alerts-theirs"}), 403)
        assert_problem(await restricted.get(_rules("alerts-theirs")), 403)
        assert (await restricted.post(_rules("alerts-mine"), json={
            "ruleType": "WorkflowFailure", "ruleMetadata": {}})).status_code == 201
    async with api.anonymous() as anonymous:
        assert_problem(await anonymous.get(_rules("alerts-mine")), 401)


async def test_rule_metadata_is_shown_as_sent(api: Api) -> None:
    async with api.client() as client:
        await _app_id(client, "alerts-meta")
        sent = {"thresholdSecs": 5, "note": {"team": "payments"}}
        rule = (await client.post(_rules("alerts-meta"), json={"ruleType": "UnresponsiveApplication",
                                                                "ruleMetadata": sent})).json()
        assert rule["ruleMetadata"] == sent
        bare = (await client.post(_rules("alerts-meta"), json={"ruleType": "WorkflowFailure",
                                                                "ruleMetadata": None})).json()
        assert_rule(bare)
        assert bare["ruleMetadata"] is None


async def test_evaluation_state_on_this_database(api: Api) -> None:
    """What the alerts round reads and writes, on each database the store runs on: rules of registered apps with
    their registry health, the firing claim (compare-and-set on ``lastFiredAt``), and the audit watermark."""
    async with api.client() as client:
        await _app_id(client, "alerts-eval")
        rule_id = (await client.post(_rules("alerts-eval"), json={
            "ruleType": "UnresponsiveApplication", "ruleMetadata": {"thresholdSecs": 5}})).json()["id"]
    api.record("alerts-eval", "eval-1")
    [(rule, healthy, since)] = [row for row in api.store.alert_rules_to_evaluate() if row[0].id == rule_id]
    assert (rule.app, rule.rule_type, healthy, since) == ("alerts-eval", "UnresponsiveApplication", 1, None)

    now = datetime.now(UTC)

    def claim(at: datetime, expected: datetime | None) -> bool:
        return api.store.record_rule_evaluation(rule_id, now=at, fire=True, suppressed=False,
                                                expected_last_fired_at=expected, checked_until=None,
                                                condition_since=at)

    assert claim(now, None) and claim(now, None)  # a retried activity keeps its claim
    assert not claim(now + timedelta(seconds=1), None)
    assert claim(now + timedelta(seconds=2), now)
    async with api.client() as client:
        [shown] = (await client.get(_rules("alerts-eval"))).json()
    assert datetime.fromisoformat(shown["lastFiredAt"]) == now + timedelta(seconds=2)

    api.store.write_audit(org="local", app="alerts-eval", operation="executor.recovery.blocked",
                          executor_id="eval-1", details={"reason": "no peer"})
    until = datetime.now(UTC) + timedelta(seconds=1)
    rows, _ = api.store.own_alert_events(["executor.recovery.blocked"], until=until, lookback=timedelta(hours=1))
    assert any(r.app == "alerts-eval" for r in rows)
    api.store.advance_alert_watermark(until)
    rows, start = api.store.own_alert_events(["executor.recovery.blocked"], until=until + timedelta(seconds=1),
                                             lookback=timedelta(hours=1))
    assert (rows, start) == ([], until)
