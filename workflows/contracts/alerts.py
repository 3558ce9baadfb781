"""The alerts workflow's contract: the schedule's round (``AlertsWorkflow``), what it reads and writes, and its
activities (stubs; implemented in ``activities.alerts``). Requests to executors reuse retention's executor choice
(``select_retention_executor``) and the gateways' ``executor_request``.

The logic (what a rule's metadata means, when it fires, what the webhook carries) is ``core.alerts``; the workflow
only carries its results, so it imports nothing of ``core``."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from temporalio import activity

from workflows.contracts.common import STUB, Activity

# The Temporal Schedule that starts an AlertsWorkflow every RELAY_ALERT_INTERVAL_SECS (its runs are named
# ``relay-alerts-<timestamp>`` by the schedule).
ALERTS_SCHEDULE_ID = "relay-alerts"


class Channel:
    WEBHOOK = "webhook"
    EXECUTOR = "executor"


class RuleType(StrEnum):
    WORKFLOW_FAILURE = "WorkflowFailure"
    SLOW_QUEUE = "SlowQueue"
    UNRESPONSIVE_APPLICATION = "UnresponsiveApplication"


@dataclass
class RuleState:
    """A rule as one round read it from the store, and (``query``) the ``get_workflow_aggregates`` body that
    observes it at the round's clock, None when the registry is enough (UnresponsiveApplication)."""

    rule_id: str
    org: str
    app: str
    receiving_app: str
    rule_type: RuleType
    metadata: Any
    created_at: datetime
    min_interval: timedelta | None = None
    last_fired_at: datetime | None = None
    checked_until: datetime | None = None  # the end of the last window observed (WorkflowFailure)
    condition_since: datetime | None = None  # UnresponsiveApplication: when the app was first seen without one
    suppressed: int = 0  # firings held back by min_interval since the rule last fired
    healthy_executors: int = 0  # the app's HEALTHY executors in the registry, when read
    unhealthy_since: datetime | None = None  # the latest change of a non-HEALTHY executor of the app (a hint)
    query: dict[str, Any] | None = None


@dataclass
class OwnEvents:
    """Audit rows of one of Relay's own alert operations about one app, written since the last evaluation;
    ``kind`` is the alert's (``RecoveryBlocked``, ...) and ``message`` its text."""

    org: str
    app: str
    operation: str
    count: int
    executor_ids: list[str] = field(default_factory=list)
    latest_details: dict[str, Any] = field(default_factory=dict)
    kind: str = ""
    message: str = ""


@dataclass
class AlertsInput:
    """The schedule's argument to every round; the worker rewrites it when the settings change."""

    interval: timedelta = timedelta(seconds=60)
    # How long an executor has to answer a request (an aggregate, an ``alert``).
    reply_timeout: timedelta = timedelta(seconds=30)
    # Webhook tries per alert (Temporal's retry policy, with backoff); then the alert is audited as failed.
    webhook_attempts: int = 5
    # Executors of the receiving app tried per ``alert`` message.
    executor_attempts: int = 3


@dataclass
class LoadAlertRoundInput:
    now: datetime
    lookback: timedelta = timedelta(seconds=60)  # the own-alert window of the very first round


@dataclass
class AlertRound:
    rules: list[RuleState] = field(default_factory=list)
    own: list[OwnEvents] = field(default_factory=list)
    # Audit rows up to this instant were read for Relay's own alerts; None: there was nothing to read.
    audit_until: datetime | None = None


@dataclass
class EvaluateAlertRuleInput:
    """Decide one rule from what the executor answered (``reply``: its ``get_workflow_aggregates`` reply; or
    ``failure``: why there is none) and store the evaluation. A firing is claimed by compare-and-set on the rule's
    ``last_fired_at`` as read (``rule.last_fired_at``), so two rounds never both fire."""

    rule: RuleState
    now: datetime
    reply: dict[str, Any] | None = None
    failure: str | None = None


@dataclass
class RuleOutcome:
    """``message`` set: the condition holds; ``fire``: this round claimed the firing (deliver it); otherwise it
    was held back by ``minIntervalSecs`` (``suppressed``). ``checked``: something could be found out."""

    message: str | None = None
    fire: bool = False
    suppressed: bool = False
    checked: bool = True


@dataclass
class Alert:
    """One alert to deliver. ``alert_id`` is the same on every retry, so a receiver can drop repeats."""

    alert_id: str
    org: str
    app: str
    receiving_app: str
    kind: str
    message: str
    time: datetime
    rule_id: str | None = None


@dataclass
class SendAlertWebhookInput:
    alert: Alert


@dataclass
class WebhookResult:
    """``configured`` false: no RELAY_ALERT_WEBHOOK_URL, nothing sent (and nothing audited for the channel)."""

    configured: bool
    status: int | None = None


@dataclass
class WriteAlertAuditInput:
    """``alert.sent``, ``alert.failed`` or ``alert.suppressed``, at most once per ``event_key``."""

    event_key: str
    operation: str
    alert: Alert
    channel: str | None
    outcome: str
    status: str = "success"
    executor_id: str | None = None


@dataclass
class AdvanceAlertWatermarkInput:
    until: datetime


@dataclass
class AlertsRoundResult:
    fired: list[str] = field(default_factory=list)  # rule ids, and "own:<kind>:<org>/<app>"
    suppressed: list[str] = field(default_factory=list)  # rule ids held back by minIntervalSecs
    unchecked: list[str] = field(default_factory=list)  # rule ids nothing could be found out about


# -- activities (stubs, called by reference; the implementations are registered under the same names) ----------


@activity.defn(name=Activity.LOAD_ALERT_ROUND)
async def load_alert_round(input: LoadAlertRoundInput) -> AlertRound:
    """Every rule of a registered app (with its app's registry health) and Relay's own alert events."""
    raise NotImplementedError(STUB)


@activity.defn(name=Activity.EVALUATE_ALERT_RULE)
async def evaluate_alert_rule(input: EvaluateAlertRuleInput) -> RuleOutcome:
    """Decide (``core.alerts.decide``), store the evaluation, and claim the firing."""
    raise NotImplementedError(STUB)


@activity.defn(name=Activity.WRITE_ALERT_AUDIT)
async def write_alert_audit(input: WriteAlertAuditInput) -> None:
    raise NotImplementedError(STUB)


@activity.defn(name=Activity.ADVANCE_ALERT_WATERMARK)
async def advance_alert_watermark(input: AdvanceAlertWatermarkInput) -> None:
    raise NotImplementedError(STUB)


@activity.defn(name=Activity.SEND_ALERT_WEBHOOK)
async def send_alert_webhook(input: SendAlertWebhookInput) -> WebhookResult:
    """POST the alert to RELAY_ALERT_WEBHOOK_URL, signed; a non-2xx answer raises (retried by Temporal)."""
    raise NotImplementedError(STUB)
