"""Activities of the alerts workflows (``workflows.alerts``), run by the worker on the shared task queue: the
database ones (rules and their state, Relay's own alert events and their rate, the audit trail), the webhook POST,
and starting the delivery of one of Relay's own alerts (``start_own_alert_delivery``: for the lifecycle workflow
and the round, and called by the orphan sweep's activity right after it writes its row).

The webhook: ``POST RELAY_ALERT_WEBHOOK_URL`` with the JSON body of ``core.alerts.webhook_body``, and, when
``RELAY_ALERT_WEBHOOK_SECRET`` is set, ``X-Relay-Signature: sha256=<hex HMAC-SHA256 of the exact body>``. A
transport error or a non-2xx answer raises a retryable error: Temporal retries with backoff, up to the round's
``webhook_attempts``. The secret is never logged nor put in an error or an audit row; the URL is not either (it
may carry a token of its own), only its host.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

import httpx
from pydantic import SecretStr
from temporalio import activity
from temporalio.client import Client
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError

from activities.database import database_calls
from core import alerts, own_alerts
from core.logs import OncePerKey
from core.models import AlertingRule, AuditLog
from core.settings import Settings
from core.store import Store
from core.temporal import data_converter
from workflows.contracts.alerts import (
    OWN_ALERT_WORKFLOW,
    AdvanceAlertWatermarkInput,
    AlertRound,
    ClaimOwnAlertInput,
    DeliveryOptions,
    EvaluateAlertRuleInput,
    LoadAlertRoundInput,
    OwnAlertClaim,
    OwnAlertEvent,
    OwnAlertInput,
    OwnEvents,
    RuleOutcome,
    RuleState,
    RuleType,
    SendAlertWebhookInput,
    WebhookResult,
    WriteAlertAuditInput,
    own_alert_workflow_id,
)
from workflows.contracts.common import SHARED_TASK_QUEUE, Activity

log = logging.getLogger("relay.worker")

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
        self._db = database_calls(store)
        self._url = webhook_url or None
        self._secret = webhook_secret
        self._transport = transport  # tests: an in-process receiver
        self._skipped = OncePerKey(log)

    @activity.defn(name=Activity.LOAD_ALERT_ROUND)
    async def load_alert_round(self, input: LoadAlertRoundInput) -> AlertRound:
        rows = await self._db(self._store.alert_rules_to_evaluate)
        until = input.now - AUDIT_SETTLE
        events, _start = await self._db(self._store.own_alert_events, list(alerts.OWN_OPERATIONS),
                                                 until=until, lookback=input.lookback)
        rules = [r for r in (self._readable(*row) for row in rows) if r is not None]
        for r in rules:
            r.query = alerts.aggregates_query(r, input.now)  # at the round's clock: the window the round decides
        return AlertRound(rules=rules, own=group_own_events(events), audit_until=until,
                          own_events=[own_event(row) for row in events if row.app is not None])

    def _readable(self, rule: AlertingRule, healthy: int, since: datetime | None) -> RuleState | None:
        """The rule as the round carries it, or None (logged once per rule) when it cannot be read or carried."""
        problem = alerts.stored_rule_problem(rule.rule_type, rule.rule_metadata)
        state = rule_state(rule, healthy, since) if problem is None else None
        if state is not None:
            problem = uncarried(state)
        if problem is None:
            return state
        self._skipped.warning(rule.id, "alerting rule %s of %s/%s skipped by every alerts round: %s; delete it "
                              "(DELETE /v2/orgs/%s/apps/%s/alerting-rules/%s)", rule.id, rule.org, rule.app, problem,
                              rule.org, rule.app, rule.id)
        return None

    @activity.defn(name=Activity.EVALUATE_ALERT_RULE)
    async def evaluate_alert_rule(self, input: EvaluateAlertRuleInput) -> RuleOutcome:
        rule = input.rule
        seen = alerts.observe(rule.rule_type, input.reply, input.failure)
        decision = alerts.decide(rule, seen, input.now)
        claimed = await self._db(
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
        await self._db(self._store.write_audit, org=a.org, app=a.app, operation=input.operation,
                                executor_id=input.executor_id, status=input.status, details=details,
                                event_key=input.event_key)

    @activity.defn(name=Activity.ADVANCE_ALERT_WATERMARK)
    async def advance_alert_watermark(self, input: AdvanceAlertWatermarkInput) -> None:
        await self._db(self._store.advance_alert_watermark, input.until)

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


def uncarried(rule: RuleState) -> str | None:
    """Why the rule cannot travel in a round's payload (None: it can). ``core.alerts.stored_rule_problem`` bounds
    its metadata; this asks Temporal's own converter, so whatever else it would refuse is found here, for this
    rule alone, not when the round's whole batch is serialized (which failed every round for every org)."""
    try:
        data_converter.payload_converter.to_payloads([rule])
    except (ValueError, TypeError, RecursionError) as err:  # pydantic's PydanticSerializationError is a ValueError
        return f"not serializable: {err}"
    return None


def own_event(row: AuditLog) -> OwnAlertEvent:
    """An own-alert audit row as its writer handed it to ``start_own_alert``: the same key, so the same alert."""
    return OwnAlertEvent(row.org, row.app or "", row.operation, row.event_key or f"audit/{row.id}", row.emit_time,
                         row.executor_id, dict(row.details or {}))


async def start_own_alert_delivery(client: Client, event: OwnAlertEvent, *,
                                   task_queue: str = SHARED_TASK_QUEUE) -> bool:
    """Start the ``OwnAlertWorkflow`` of an own-alert row's alert; False when it was started already.

    Its id derives from the row's event key and a used id is never reused (``REJECT_DUPLICATE``, closed runs
    included, for as long as the namespace keeps them), so however often and by whom a row's alert is started (its
    writer, a retry, the round), it is delivered once."""
    alert = own_alerts.alert_of(event)
    try:
        await client.start_workflow(
            OWN_ALERT_WORKFLOW, OwnAlertInput(alert, event.operation), id=own_alert_workflow_id(alert.alert_id),
            task_queue=task_queue, id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            static_summary=f"{alert.kind} alert of {event.org}/{event.app}")
    except WorkflowAlreadyStartedError:
        return False
    return True


class OwnAlertActivities:
    """Relay's own alerts as they happen (``workflows.alerts.OwnAlertWorkflow``): starting one's delivery, and its
    rate (``core.own_alerts``). Bound to one ``Store`` and the worker's settings (defaults without them)."""

    def __init__(self, store: Store, settings: Settings | None = None, *,
                 task_queue: str = SHARED_TASK_QUEUE) -> None:
        self._store = store
        self._db = database_calls(store)
        self._rates = own_alerts.OwnAlertRates(store.engine)
        self._task_queue = task_queue
        settings = settings or Settings.model_construct()  # the defaults, not the environment
        self._min_interval = settings.own_alert_min_interval
        self._options = DeliveryOptions(reply_timeout=settings.management_timeout)

    @activity.defn(name=Activity.START_OWN_ALERT)
    async def start_own_alert(self, input: OwnAlertEvent) -> bool:
        return await start_own_alert_delivery(activity.client(), input, task_queue=self._task_queue)

    @activity.defn(name=Activity.CLAIM_OWN_ALERT)
    async def claim_own_alert(self, input: ClaimOwnAlertInput) -> OwnAlertClaim:
        a = input.alert
        outcome = await self._db(self._rates.claim, org=a.org, app=a.app, kind=a.kind, alert_id=a.alert_id,
                                         now=input.now, min_interval=self._min_interval,
                                         held_behind=input.held_behind)
        text = own_alerts.message(a, outcome, flushed=input.held_behind is not None)
        return OwnAlertClaim(outcome.send, text, flush_at=outcome.flush_at, held_behind=outcome.held_behind,
                             options=self._options)

    def all(self) -> list[Callable[..., Any]]:
        return [self.start_own_alert, self.claim_own_alert]


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
