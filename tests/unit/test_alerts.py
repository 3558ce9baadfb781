"""Alerts as pure logic (``core.alerts``): ruleMetadata, which rule fires given what was observed, the minimum
interval, Relay's own alert messages, and the webhook body and its HMAC-SHA256 signature; and the store's
firing claim (compare-and-set on ``lastFiredAt``) and audit watermark on SQLite."""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from temporalio.exceptions import ApplicationError

from activities.alerts import AlertActivities
from cli.alerts import rules_table
from core import alerts
from core.alerts import Observation, decide, may_fire, parse_metadata
from core.models import make_engine
from core.settings import Settings
from core.store import Store
from tests.cli_kit import parser
from workflows.contracts.alerts import Alert, OwnEvents, RuleState, RuleType, SendAlertWebhookInput, WebhookResult

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
CREATED = NOW - timedelta(minutes=10)


def _rule(rule_type: RuleType, metadata: Any = None, **state: Any) -> RuleState:
    return RuleState("r1", "acme", "shop", "shop", rule_type, metadata, CREATED, **state)


# -- ruleMetadata ------------------------------------------------------------------------------------------------


def test_metadata_defaults_and_units() -> None:
    assert parse_metadata(RuleType.WORKFLOW_FAILURE, None) == alerts.RuleParams()
    assert parse_metadata(RuleType.SLOW_QUEUE, {"queueName": "q", "thresholdSecs": 1.5}).threshold \
        == timedelta(milliseconds=1500)
    assert parse_metadata(RuleType.UNRESPONSIVE_APPLICATION, {"thresholdSecs": 90, "other": [1]}).threshold \
        == timedelta(seconds=90)
    assert parse_metadata(RuleType.WORKFLOW_FAILURE, {"minFailures": 3.0}).min_failures == 3


@pytest.mark.parametrize(("rule_type", "metadata"), [
    (RuleType.WORKFLOW_FAILURE, "x"),
    (RuleType.WORKFLOW_FAILURE, {"minFailures": 0}),
    (RuleType.WORKFLOW_FAILURE, {"minFailures": True}),
    (RuleType.WORKFLOW_FAILURE, {"workflowName": ""}),
    (RuleType.SLOW_QUEUE, {"queueName": "a\x00b"}),
    (RuleType.SLOW_QUEUE, {"thresholdSecs": 0}),
    (RuleType.UNRESPONSIVE_APPLICATION, {"thresholdSecs": "60"}),
])
def test_metadata_refused(rule_type: RuleType, metadata: Any) -> None:
    with pytest.raises(ValueError, match="ruleMetadata"):
        parse_metadata(rule_type, metadata)


# -- decisions ---------------------------------------------------------------------------------------------------


def test_workflow_failure_fires_on_enough_failures_in_the_window() -> None:
    rule = _rule(RuleType.WORKFLOW_FAILURE, {"minFailures": 2})
    quiet = decide(rule, Observation(failures=1), NOW)
    assert (quiet.message, quiet.fire, quiet.checked_until) == (None, False, NOW - alerts.WINDOW_LAG)
    loud = decide(rule, Observation(failures=2, failed_names=["pay", "pay"]), NOW)
    assert loud.fire and loud.message is not None
    assert "2 workflow(s) (pay) failed" in loud.message
    assert (CREATED - alerts.WINDOW_LAG).isoformat()[:19] in loud.message


def test_the_window_starts_where_the_last_one_ended() -> None:
    lag = alerts.WINDOW_LAG
    rule = _rule(RuleType.WORKFLOW_FAILURE, checked_until=NOW - timedelta(seconds=60))
    assert alerts.window(rule, NOW) == (NOW - timedelta(seconds=60), NOW - lag)
    assert alerts.window(_rule(RuleType.WORKFLOW_FAILURE), NOW) == (CREATED - lag, NOW - lag)
    # One window ends where the next begins.
    first = decide(_rule(RuleType.WORKFLOW_FAILURE), Observation(), NOW)
    assert alerts.window(_rule(RuleType.WORKFLOW_FAILURE, checked_until=first.checked_until),
                         NOW + timedelta(seconds=60))[0] == first.checked_until


def test_nothing_learned_changes_nothing() -> None:
    rule = _rule(RuleType.WORKFLOW_FAILURE, checked_until=CREATED)
    d = decide(rule, Observation(failures=5, failed="no HEALTHY executor"), NOW)
    assert (d.fire, d.message, d.checked_until) == (False, None, CREATED)


def test_slow_queue_compares_the_oldest_wait_with_the_threshold() -> None:
    rule = _rule(RuleType.SLOW_QUEUE, {"queueName": "orders", "thresholdSecs": 30})
    assert not decide(rule, Observation(oldest_enqueued_at=NOW - timedelta(seconds=29)), NOW).fire
    assert not decide(rule, Observation(), NOW).fire
    d = decide(rule, Observation(oldest_enqueued_at=NOW - timedelta(seconds=31)), NOW)
    assert d.fire and d.message is not None and "queue 'orders'" in d.message and "31 s" in d.message


def test_unresponsive_fires_once_per_outage_after_the_threshold() -> None:
    meta = {"thresholdSecs": 60}
    healthy = decide(_rule(RuleType.UNRESPONSIVE_APPLICATION, meta, healthy_executors=1,
                           condition_since=NOW - timedelta(hours=1)), Observation(), NOW)
    assert (healthy.fire, healthy.condition_since) == (False, None)
    first_seen = decide(_rule(RuleType.UNRESPONSIVE_APPLICATION, meta), Observation(), NOW)
    assert (first_seen.fire, first_seen.condition_since) == (False, NOW)  # no hint: counted from now
    gone = NOW - timedelta(seconds=61)
    hinted = decide(_rule(RuleType.UNRESPONSIVE_APPLICATION, meta, unhealthy_since=gone), Observation(), NOW)
    assert hinted.fire and hinted.condition_since == gone
    # Fired for this outage already: no repeat without a minimum interval to pace reminders.
    again = _rule(RuleType.UNRESPONSIVE_APPLICATION, meta, condition_since=gone, last_fired_at=NOW - timedelta(days=1))
    assert decide(again, Observation(), NOW + timedelta(hours=1)).message is not None  # fired before this outage
    fired = _rule(RuleType.UNRESPONSIVE_APPLICATION, meta, condition_since=gone, last_fired_at=NOW)
    assert decide(fired, Observation(), NOW + timedelta(hours=1)).message is None
    reminded = _rule(RuleType.UNRESPONSIVE_APPLICATION, meta, condition_since=gone, last_fired_at=NOW,
                     min_interval=timedelta(minutes=30))
    assert decide(reminded, Observation(), NOW + timedelta(minutes=31)).fire


def test_min_interval_holds_back_and_the_next_alert_counts() -> None:
    assert may_fire(None, timedelta(seconds=60), NOW)
    assert may_fire(NOW - timedelta(seconds=60), timedelta(seconds=60), NOW)
    assert not may_fire(NOW - timedelta(seconds=59), timedelta(seconds=60), NOW)
    assert may_fire(NOW, None, NOW)
    rule = _rule(RuleType.WORKFLOW_FAILURE, min_interval=timedelta(seconds=60),
                 last_fired_at=NOW - timedelta(seconds=30))
    held = decide(rule, Observation(failures=1), NOW)
    assert held.message is not None and not held.fire
    later = _rule(RuleType.WORKFLOW_FAILURE, min_interval=timedelta(seconds=60),
                  last_fired_at=NOW - timedelta(seconds=61), suppressed=3)
    fired = decide(later, Observation(failures=1), NOW)
    assert fired.fire and fired.message is not None and "3 earlier firing(s) held back" in fired.message


def test_own_message_names_the_kind_and_the_executors() -> None:
    events = OwnEvents("acme", "shop", "executor.recovery.blocked", 2, ["e2", "e1", "e2"], {"reason": "no peer"})
    assert alerts.OWN_OPERATIONS[events.operation] is alerts.OwnKind.RECOVERY_BLOCKED
    assert alerts.own_message(events) == ("RecoveryBlocked in app 'shop': 2 × executor.recovery.blocked "
                                          "(executors: e1, e2): no peer")


# -- the webhook -------------------------------------------------------------------------------------------------


def test_webhook_body_has_the_fields() -> None:
    body = alerts.webhook_body(alert_id="a1", org="acme", app="shop", kind="WorkflowFailure", message="m é",
                               time=datetime(2026, 12, 1, 13, 0, 0, 5000, tzinfo=UTC), rule_id="r1")
    assert json.loads(body) == {"id": "a1", "org": "acme", "app": "shop", "kind": "WorkflowFailure",
                                "message": "m é", "time": "2026-12-01T13:00:00.005000Z", "ruleId": "r1"}
    assert datetime.fromisoformat(json.loads(body)["time"]).tzinfo is not None  # RFC 3339, with its zone


def test_signature_is_hmac_sha256_of_the_exact_body() -> None:
    body = alerts.webhook_body(alert_id="a1", org="acme", app="shop", kind="SlowQueue", message="m", time=NOW)
    signature = alerts.sign(body, "s3cret")
    expected = "sha256=" + hmac.new(b"s3cret", body, hashlib.sha256).hexdigest()
    assert hmac.compare_digest(signature, expected)
    assert alerts.verify(body, "s3cret", signature)
    assert not alerts.verify(body + b" ", "s3cret", signature)
    assert not alerts.verify(body, "other", signature)


# -- the store ---------------------------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(make_engine(f"sqlite:///{tmp_path / 'relay.db'}"))
    store.ensure_app("acme", "shop")
    return store


def test_a_firing_is_claimed_once(store: Store) -> None:
    rule = store.create_alert_rule(org="acme", app="shop", receiving_app="shop", rule_type="WorkflowFailure",
                                   metadata={}, min_interval=None, subject="system", source_ip="")

    def claim(now: datetime, expected: datetime | None) -> bool:
        return store.record_rule_evaluation(rule.id, now=now, fire=True, suppressed=False,
                                            expected_last_fired_at=expected, checked_until=now,
                                            condition_since=None)

    assert claim(NOW, None)
    assert claim(NOW, None)  # the same activity retried: still this round's claim
    assert not claim(NOW + timedelta(seconds=1), None)  # another round that read the rule before: held back
    [row] = store.list_alert_rules("acme", "shop")
    assert (row.last_fired_at, row.suppressed, row.checked_until) == (NOW, 1, NOW + timedelta(seconds=1))
    assert claim(NOW + timedelta(seconds=2), NOW)
    assert store.list_alert_rules("acme", "shop")[0].suppressed == 0


def test_own_events_after_the_watermark(store: Store) -> None:
    store.write_audit(org="acme", app="shop", operation="executor.recovery.blocked", executor_id="e1")
    store.write_audit(org="acme", app="shop", operation="executor.healthy", executor_id="e1")
    until = datetime.now(UTC) + timedelta(seconds=1)
    rows, start = store.own_alert_events(list(alerts.OWN_OPERATIONS), until=until, lookback=timedelta(minutes=1))
    assert [r.operation for r in rows] == ["executor.recovery.blocked"] and start == until - timedelta(minutes=1)
    store.advance_alert_watermark(until)
    store.advance_alert_watermark(until - timedelta(seconds=5))  # never back
    rows, start = store.own_alert_events(list(alerts.OWN_OPERATIONS), until=until + timedelta(seconds=1),
                                         lookback=timedelta(minutes=1))
    assert (rows, start) == ([], until)


# -- the webhook activity, against an in-process receiver ------------------------------------------------------


def _alert() -> Alert:
    return Alert("a1", "acme", "shop", "shop", "WorkflowFailure", "2 workflow(s) failed", NOW, "r1")


def _activities(store: Store, handler: Callable[[httpx.Request], httpx.Response], *, secret: str | None,
                url: str | None = "https://hooks.example/relay?token=t0ps3cret") -> AlertActivities:
    return AlertActivities(store, webhook_url=url, webhook_secret=SecretStr(secret) if secret else None,
                           transport=httpx.MockTransport(handler))


async def test_webhook_posts_the_signed_body(store: Store) -> None:
    seen: list[httpx.Request] = []

    def receive(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(202)

    result = await _activities(store, receive, secret="s3cret").send_alert_webhook(SendAlertWebhookInput(_alert()))
    assert result == WebhookResult(configured=True, status=202)
    [request] = seen
    assert request.method == "POST" and request.headers["content-type"] == "application/json"
    assert hmac.compare_digest(request.headers[alerts.SIGNATURE_HEADER],
                               "sha256=" + hmac.new(b"s3cret", request.content, hashlib.sha256).hexdigest())
    assert json.loads(request.content)["kind"] == "WorkflowFailure"
    assert request.headers[alerts.ALERT_ID_HEADER] == "a1"


async def test_webhook_without_a_secret_is_unsigned_and_without_a_url_is_skipped(store: Store) -> None:
    seen: list[httpx.Request] = []

    def receive(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200)

    await _activities(store, receive, secret=None).send_alert_webhook(SendAlertWebhookInput(_alert()))
    assert alerts.SIGNATURE_HEADER not in seen[0].headers
    skipped = await _activities(store, receive, secret="s", url=None).send_alert_webhook(
        SendAlertWebhookInput(_alert()))
    assert skipped == WebhookResult(configured=False) and len(seen) == 1


@pytest.mark.parametrize("answer", [httpx.Response(500), httpx.Response(404), httpx.ConnectError("refused")])
async def test_webhook_failures_are_retryable_and_leak_nothing(store: Store, answer: Any) -> None:
    def receive(request: httpx.Request) -> httpx.Response:
        if isinstance(answer, Exception):
            raise answer
        response: httpx.Response = answer
        return response

    with pytest.raises(ApplicationError) as failed:
        await _activities(store, receive, secret="s3cret").send_alert_webhook(SendAlertWebhookInput(_alert()))
    assert not failed.value.non_retryable
    assert "hooks.example" in str(failed.value)
    assert "s3cret" not in str(failed.value) and "t0ps3cret" not in str(failed.value)


def test_the_secret_is_not_in_the_settings_repr(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, alert_webhook_secret=SecretStr("s3cret"))
    assert "s3cret" not in repr(settings) and "s3cret" not in str(settings.model_dump())


# -- relay alerts ------------------------------------------------------------------------------------------------


def test_cli_create_takes_durations_and_json() -> None:
    args = parser().parse_args(["alerts", "create", "--app", "shop", "--type", "SlowQueue", "--metadata",
                                '{"queueName": "orders"}', "--min-interval", "15m"])
    assert (args.type, args.metadata, args.min_interval) == ("SlowQueue", {"queueName": "orders"}, 900)
    for bad in (["--min-interval", "1500ms"], ["--metadata", "{oops"], ["--type", "Nope"]):
        with pytest.raises(SystemExit) as exited:
            parser().parse_args(["alerts", "create", "--app", "shop", "--type", "WorkflowFailure", *bad])
        assert exited.value.code == 2


def test_cli_rules_table() -> None:
    text = rules_table([{"id": "r1", "ruleType": "WorkflowFailure", "ruleMetadata": {"minFailures": 2},
                         "minIntervalSecs": None, "receivingAppId": "a1", "lastFiredAt": None}])
    assert "r1" in text and '{"minFailures": 2}' in text and "never" in text


def test_cli_rules_table_names_the_receiving_app_and_shows_times_as_every_table() -> None:
    text = rules_table([{"id": "r2", "ruleType": "SlowQueue", "ruleMetadata": {"thresholdSecs": 120},
                         "minIntervalSecs": 900, "receivingAppId": "app-id-7", "receivingAppName": "ops",
                         "lastFiredAt": "2026-11-30T12:00:00.5+02:00"}])
    header, row = text.splitlines()
    assert "RECEIVING APP" in header and "RECEIVING APP ID" not in header
    assert row.split()[-4:] == ["15m", "ops", "2026-11-30", "10:00:00.500Z"], row
    assert "app-id-7" not in row


# -- what is asked of an executor, and what its answer means -----------------------------------------------------


def test_the_failure_query_is_the_window_in_wire_time() -> None:
    rule = _rule(RuleType.WORKFLOW_FAILURE, {"workflowName": "pay"}, checked_until=NOW - timedelta(seconds=60))
    query = alerts.aggregates_query(rule, NOW)
    assert query is not None
    end = NOW - alerts.WINDOW_LAG - timedelta(milliseconds=1)  # the SDK's bounds are inclusive: [start, end)
    assert (query["status"], query["name"]) == (["ERROR"], ["pay"])
    assert (query["completed_after"], query["completed_before"]) \
        == ((NOW - timedelta(seconds=60)).isoformat(), end.isoformat())
    assert alerts.aggregates_query(_rule(RuleType.UNRESPONSIVE_APPLICATION), NOW) is None
    slow = alerts.aggregates_query(_rule(RuleType.SLOW_QUEUE, {"queueName": "q"}), NOW)
    assert slow is not None and (slow["status"], slow["queue_name"]) == (["ENQUEUED"], ["q"])


def test_an_answer_as_an_observation() -> None:
    failures = alerts.observe(RuleType.WORKFLOW_FAILURE, {"output": [
        {"group": {"name": "a"}, "count": 2}, {"group": {"name": "b"}, "count": 1}, {"count": "x"}, "junk"]})
    assert (failures.failures, failures.failed_names) == (3, ["a", "b"])
    oldest = alerts.observe(RuleType.SLOW_QUEUE, {"output": [{"group": {"queue_name": "q"},
                                                              "min_created_at": 1_796_040_000_123}]})
    assert oldest.oldest_enqueued_at == datetime(2026, 11, 30, 12, 0, 0, 123_000, tzinfo=UTC)
    refused = alerts.observe(RuleType.SLOW_QUEUE, {"output": [], "error_message": "Unknown message type"})
    assert refused.failed is not None and "Unknown message type" in refused.failed
    assert alerts.observe(RuleType.WORKFLOW_FAILURE, None, "no HEALTHY executor").failed == "no HEALTHY executor"


# -- the contract --------------------------------------------------------------------------------------------------
