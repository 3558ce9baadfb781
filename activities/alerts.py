"""Activities of the alerts round (``workflows.alerts``), run by the worker on the shared task queue: the
database ones (rules and their state, Relay's own alert events, the audit trail) and the webhook POST.

The webhook: ``POST RELAY_ALERT_WEBHOOK_URL`` with the JSON body of ``core.alerts.webhook_body``, and, when
``RELAY_ALERT_WEBHOOK_SECRET`` is set, ``X-Relay-Signature: sha256=<hex HMAC-SHA256 of the exact body>``. A
transport error or a non-2xx answer raises a retryable error: Temporal retries with backoff, up to the round's
``webhook_attempts``. The secret is never logged nor put in an error or an audit row; the URL is not either (it
may carry a token of its own), only its host.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import httpx
from pydantic import SecretStr
from temporalio import activity
from temporalio.exceptions import ApplicationError

from core import alerts
from core.models import AlertingRule, AuditLog
from core.store import Store
from workflows.contracts.alerts import (
    AdvanceAlertWatermarkInput,
    AlertRound,
    EvaluateAlertRuleInput,
    LoadAlertRoundInput,
    OwnEvents,
    RuleOutcome,
    RuleState,
    RuleType,
    SendAlertWebhookInput,
    WebhookResult,
    WriteAlertAuditInput,
)
from workflows.contracts.common import Activity

# Audit rows committed a little after their emit time (the row's time is taken before its transaction commits)
# must not fall behind the watermark: the round reads only up to this long ago.
AUDIT_SETTLE = timedelta(seconds=2)
WEBHOOK_TIMEOUT = timedelta(seconds=10)
USER_AGENT = "relay-alerts/1"


class AlertActivities:
    """Bound to one ``Store`` and the webhook settings; registered with the worker as bound methods."""

    def __init__(self, store: Store, *, webhook_url: str | None = None, webhook_secret: SecretStr | None = None,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._store = store
        self._url = webhook_url or None
        self._secret = webhook_secret
        self._transport = transport  # tests: an in-process receiver

    @activity.defn(name=Activity.LOAD_ALERT_ROUND)
    async def load_alert_round(self, input: LoadAlertRoundInput) -> AlertRound:
        rows = await self._store.call(self._store.alert_rules_to_evaluate)
        until = input.now - AUDIT_SETTLE
        events, _start = await self._store.call(self._store.own_alert_events, list(alerts.OWN_OPERATIONS),
                                                 until=until, lookback=input.lookback)
        states = [rule_state(rule, healthy, since) for rule, healthy, since in rows]
        rules = [r for r in states if readable(r)]
        for r in rules:
            r.query = alerts.aggregates_query(r, input.now)  # at the round's clock: the window the round decides
        return AlertRound(rules=rules, own=group_own_events(events), audit_until=until)

    @activity.defn(name=Activity.EVALUATE_ALERT_RULE)
    async def evaluate_alert_rule(self, input: EvaluateAlertRuleInput) -> RuleOutcome:
        rule = input.rule
        seen = alerts.observe(rule.rule_type, input.reply, input.failure)
        decision = alerts.decide(rule, seen, input.now)
        claimed = await self._store.call(
            self._store.record_rule_evaluation, rule.rule_id, now=input.now, fire=decision.fire,
            suppressed=decision.message is not None and not decision.fire,
            expected_last_fired_at=rule.last_fired_at, checked_until=decision.checked_until,
            condition_since=decision.condition_since)
        return RuleOutcome(decision.message, fire=claimed, suppressed=decision.message is not None and not claimed,
                           checked=seen.failed is None)

    @activity.defn(name=Activity.WRITE_ALERT_AUDIT)
    async def write_alert_audit(self, input: WriteAlertAuditInput) -> None:
        a = input.alert
        details: dict[str, Any] = {"kind": a.kind, "ruleId": a.rule_id, "channel": input.channel,
                                   "outcome": input.outcome, "alertId": a.alert_id, "message": a.message,
                                   "receivingApp": a.receiving_app, "time": a.time.isoformat()}
        await self._store.call(self._store.write_audit, org=a.org, app=a.app, operation=input.operation,
                                executor_id=input.executor_id, status=input.status, details=details,
                                event_key=input.event_key)

    @activity.defn(name=Activity.ADVANCE_ALERT_WATERMARK)
    async def advance_alert_watermark(self, input: AdvanceAlertWatermarkInput) -> None:
        await self._store.call(self._store.advance_alert_watermark, input.until)

    @activity.defn(name=Activity.SEND_ALERT_WEBHOOK)
    async def send_alert_webhook(self, input: SendAlertWebhookInput) -> WebhookResult:
        if self._url is None:
            return WebhookResult(configured=False)
        a = input.alert
        body = alerts.webhook_body(alert_id=a.alert_id, org=a.org, app=a.app, kind=a.kind, message=a.message,
                                   time=a.time, rule_id=a.rule_id)
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT, alerts.ALERT_ID_HEADER: a.alert_id}
        if self._secret is not None and self._secret.get_secret_value():
            headers[alerts.SIGNATURE_HEADER] = alerts.sign(body, self._secret.get_secret_value())
        host = urlsplit(self._url).hostname or "?"
        try:
            async with httpx.AsyncClient(transport=self._transport,
                                         timeout=WEBHOOK_TIMEOUT.total_seconds()) as client:
                response = await client.post(self._url, content=body, headers=headers)
        except httpx.HTTPError as err:
            # Retryable: Temporal tries again with backoff. The error names the host, not the whole URL.
            raise ApplicationError(f"webhook to {host} failed: {type(err).__name__}",
                                   type="WebhookUnreachable") from None
        if not 200 <= response.status_code < 300:
            raise ApplicationError(f"webhook to {host} answered HTTP {response.status_code}", type="WebhookRefused")
        return WebhookResult(configured=True, status=response.status_code)

    def all(self) -> list[Callable[..., Any]]:
        return [self.load_alert_round, self.evaluate_alert_rule, self.write_alert_audit,
                self.advance_alert_watermark, self.send_alert_webhook]


def rule_state(rule: AlertingRule, healthy: int, unhealthy_since: datetime | None) -> RuleState:
    return RuleState(
        rule_id=rule.id, org=rule.org, app=rule.app, receiving_app=rule.receiving_app,
        rule_type=RuleType(rule.rule_type), metadata=rule.rule_metadata, created_at=rule.created_at,
        min_interval=rule.min_interval, last_fired_at=rule.last_fired_at, checked_until=rule.checked_until,
        condition_since=rule.condition_since, suppressed=rule.suppressed, healthy_executors=healthy,
        unhealthy_since=unhealthy_since)


def readable(rule: RuleState) -> bool:
    """Whether the rule's metadata can be read (the REST API refuses any other; a row edited by hand is skipped,
    not allowed to fail the whole round)."""
    try:
        alerts.parse_metadata(rule.rule_type, rule.metadata)
    except ValueError:
        return False
    return True


def group_own_events(rows: list[AuditLog]) -> list[OwnEvents]:
    """One group per (org, app, operation), oldest first, with its alert's kind and text; rows about no app are
    skipped (no receiver)."""
    groups: dict[tuple[str, str, str], OwnEvents] = {}
    executors: defaultdict[tuple[str, str, str], list[str]] = defaultdict(list)
    for row in rows:
        if row.app is None:
            continue
        key = (row.org, row.app, row.operation)
        group = groups.setdefault(key, OwnEvents(row.org, row.app, row.operation, 0))
        group.count += 1
        group.latest_details = dict(row.details or {})
        if row.executor_id:
            executors[key].append(row.executor_id)
    for key, group in groups.items():
        group.executor_ids = executors[key]
        group.kind = alerts.OWN_OPERATIONS[group.operation].value
        group.message = alerts.own_message(group)
    return list(groups.values())
