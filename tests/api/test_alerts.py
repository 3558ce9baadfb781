"""Alerting rules through the REST API in-process (``conftest.Api``), on SQLite and on PostgreSQL: the three
upstream operations, their bodies against the upstream schema facts, the problems (metadata bounded in depth and
size), a stored rule that cannot be shown, the audit trail, and the own-alert rate on each database."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from core.own_alerts import Claim, OwnAlertRates
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
    errors = conformance_errors(body, ALERTING_RULE, extra={"receivingAppName"})  # Relay's extension
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


async def test_a_whole_threshold_reads_back_whole_and_the_receiver_by_name(api: Api) -> None:
    """``thresholdSecs: 120`` is stored and shown as 120, not 120.0 (the JSON text, not a Python comparison, where
    120 == 120.0); a fraction stays one. The receiving app comes back by name too (Relay extension)."""
    async with api.client() as client:
        await _app_id(client, "whole-app")
        receiver_id = await _app_id(client, "whole-receiver")
        created = await client.post(_rules("whole-app"), json={
            "ruleType": "SlowQueue", "ruleMetadata": {"queueName": "payments", "thresholdSecs": 120},
            "receivingAppName": "whole-receiver"})
        fraction = await client.post(_rules("whole-app"), json={
            "ruleType": "UnresponsiveApplication", "ruleMetadata": {"thresholdSecs": 1.5}})
        listed = await client.get(_rules("whole-app"))
    assert created.status_code == 201, created.text
    assert '"thresholdSecs":120}' in created.text and '"thresholdSecs":1.5}' in fraction.text
    assert '"thresholdSecs":120}' in listed.text and "120.0" not in listed.text
    rule = created.json()
    assert (rule["receivingAppId"], rule["receivingAppName"]) == (receiver_id, "whole-receiver")
    assert fraction.json()["receivingAppName"] == "whole-app"  # left out: the rule's own app
    [stored] = [r for r in api.store.list_alert_rules("local", "whole-app") if r.id == rule["id"]]
    assert type(stored.rule_metadata["thresholdSecs"]) is int


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


def _nested(depth: int) -> Any:
    value: Any = {"thresholdSecs": 5}
    for _ in range(depth - 1):
        value = {"x": value}
    return value


@pytest.mark.parametrize(("metadata", "says"), [
    (_nested(300), "ruleMetadata is nested deeper than 32 levels"),  # the incident's rule
    (_nested(600), "ruleMetadata is nested deeper than 32 levels"),
    (_nested(900), "ruleMetadata is nested deeper than 32 levels"),
    (_nested(33), "ruleMetadata is nested deeper than 32 levels"),
    ({"thresholdSecs": 5, "note": "x" * 9000}, "bytes as JSON, more than 8192"),
], ids=["300-deep", "600-deep", "900-deep", "33-deep", "9-kB"])
async def test_metadata_too_deep_or_too_large_is_422_saying_so(api: Api, metadata: Any, says: str) -> None:
    app = f"alerts-bounded-{uuid.uuid4().hex[:8]}"
    async with api.client() as client:
        await _app_id(client, app)
        problem = assert_problem(await client.post(_rules(app), json={
            "ruleType": "UnresponsiveApplication", "ruleMetadata": metadata}), 422)
        [error] = problem["errors"]
        assert error["location"] == "body.ruleMetadata" and says in error["message"], error
        assert (await client.get(_rules(app))).json() == []
        assert (await client.post(_rules(app), json={  # the bounds themselves are fine
            "ruleType": "UnresponsiveApplication", "ruleMetadata": _nested(32)})).status_code == 201


async def test_a_stored_rule_that_cannot_be_shown_is_left_out_and_can_be_deleted(api: Api) -> None:
    """A rule stored 300 deep before the bound (a row the API can no longer create): listAlertingRules answered
    500 on it; it is left out, the app's other rules are listed, and it is deleted by its id."""
    async with api.client() as client:
        await _app_id(client, "alerts-stored-bad")
        good = (await client.post(_rules("alerts-stored-bad"), json={"ruleType": "WorkflowFailure",
                                                                      "ruleMetadata": {}})).json()
    bad = api.store.create_alert_rule(org="local", app="alerts-stored-bad", receiving_app="alerts-stored-bad",
                                      rule_type="UnresponsiveApplication", metadata=_nested(300), min_interval=None,
                                      subject="system", source_ip="")
    async with api.client() as client:
        listed = await client.get(_rules("alerts-stored-bad"))
        assert listed.status_code == 200, listed.text
        assert [r["id"] for r in listed.json()] == [good["id"]]
        assert (await client.delete(f"{_rules('alerts-stored-bad')}/{bad.id}")).status_code == 204
        assert [r.id for r in api.store.list_alert_rules("local", "alerts-stored-bad")] == [good["id"]]


async def test_own_alert_rate_on_this_database(api: Api) -> None:
    """The own-alert rate's compare-and-set on each database the store runs on: one per interval, the first held
    back told when to go, a retried claim kept, and a late one counting the others."""
    rates = OwnAlertRates(api.store.engine)
    now, minute = datetime.now(UTC), timedelta(minutes=1)

    def claim(alert_id: str, at: datetime, held_behind: datetime | None = None) -> Claim:
        return rates.claim(org="local", app="alerts-rate", kind="RecoveryBlocked", alert_id=alert_id, now=at,
                           min_interval=minute, held_behind=held_behind)

    assert claim("a", now).send and claim("a", now + timedelta(seconds=1)).send
    assert claim("b", now + timedelta(seconds=2)) == Claim(send=False, flush_at=now + minute, held_behind=now)
    assert claim("c", now + timedelta(seconds=3)) == Claim(send=False, held_behind=now)
    assert claim("b", now + minute, held_behind=now) == Claim(send=True, held_back=1)
    assert not claim("c", now + minute + timedelta(seconds=1)).send
