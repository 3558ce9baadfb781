"""The alerts workflows' contract: the schedule's round (``AlertsWorkflow``) and the delivery of one of Relay's own
alerts as it happens (``OwnAlertWorkflow``), what they read and write, and their activities (stubs; implemented in
``activities.alerts``). Requests to executors reuse retention's executor choice (``select_retention_executor``)
and the gateways' ``executor_request``.

The logic (what a rule's metadata means, when it fires, what the webhook carries) is ``core.alerts``; the workflow
only carries its results, so it imports nothing of ``core``."""

# No ``from __future__ import annotations``: a contract's annotations are types, not names (the package's docstring).
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from temporalio import activity

from core.types import Alert as Alert
from core.types import OwnAlertEvent as OwnAlertEvent
from core.types import OwnEvents as OwnEvents
from core.types import RuleState as RuleState
from core.types import RuleType as RuleType
from workflows.contracts.common import STUB, Activity

# The Temporal Schedule that starts an AlertsWorkflow every RELAY_ALERT_INTERVAL_SECS (its runs are named
# ``relay-alerts-<timestamp>`` by the schedule).
ALERTS_SCHEDULE_ID = "relay-alerts"
# The workflow that delivers one of Relay's own alerts, by name (activities start it, and may not import workflows
# code); its id is ``own_alert_workflow_id`` of the alert's id, so a second start of one alert is refused.
OWN_ALERT_WORKFLOW = "OwnAlertWorkflow"


def own_alert_workflow_id(alert_id: str) -> str:
    return f"relay-alert/{alert_id}"


class Channel:
    WEBHOOK = "webhook"
    EXECUTOR = "executor"


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
    own: list[OwnEvents] = field(default_factory=list)  # grouped: what a round before ``OWN_AT_ONCE_PATCH`` sends
    # Audit rows up to this instant were read for Relay's own alerts; None: there was nothing to read.
    audit_until: datetime | None = None
    # The same rows one by one: a round since ``OWN_AT_ONCE_PATCH`` starts the delivery of any not started yet.
    own_events: list[OwnAlertEvent] = field(default_factory=list)


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
    fired: list[str] = field(default_factory=list)  # rule ids, and "own:<kind>:<org>/<app>" (before the patch)
    suppressed: list[str] = field(default_factory=list)  # rule ids held back by minIntervalSecs
    unchecked: list[str] = field(default_factory=list)  # rule ids nothing could be found out about
    failed: list[str] = field(default_factory=list)  # rule ids whose evaluation failed (the others went on)
    # The event keys of own-alert rows whose delivery this round started: nobody had (their writer's start failed).
    own_started: list[str] = field(default_factory=list)


# -- one of Relay's own alerts, as it happens ---------------------------------------------------------------------


@dataclass
class DeliveryOptions:
    """How an alert is delivered: as ``AlertsInput`` says for a round's alerts, as the worker's settings say for
    Relay's own (``claim_own_alert`` returns them)."""

    reply_timeout: timedelta = timedelta(seconds=30)
    webhook_attempts: int = 5
    executor_attempts: int = 3


@dataclass
class OwnAlertInput:
    """``OwnAlertWorkflow``'s argument: the alert (its id derived from its audit row's key) and that row's
    operation."""

    alert: Alert
    operation: str = ""


@dataclass
class ClaimOwnAlertInput:
    """Claim the right to send ``alert`` at ``now``, at most one alert per (org, app, kind) per the minimum
    interval. ``held_behind`` set: the alert was held back behind the one sent then, waited, and asks again."""

    alert: Alert
    now: datetime
    held_behind: datetime | None = None


@dataclass
class OwnAlertClaim:
    """``send``: deliver ``message`` (the alert's, with what was held back since the last one). Otherwise it is held
    back; ``flush_at`` set (the first held back since the last one was sent): ask again then, with
    ``held_behind``, to send it unless another alert of the kind went out meanwhile and counted it."""

    send: bool
    message: str = ""
    flush_at: datetime | None = None
    held_behind: datetime | None = None
    options: DeliveryOptions = field(default_factory=DeliveryOptions)


@dataclass
class OwnAlertResult:
    sent: bool
    held_back: bool = False  # audited ``alert.suppressed``; counted by the next alert of its kind


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


@activity.defn(name=Activity.START_OWN_ALERT)
async def start_own_alert(input: OwnAlertEvent) -> bool:
    """Start the ``OwnAlertWorkflow`` of the row's alert; False when it was started already (it is delivered)."""
    raise NotImplementedError(STUB)


@activity.defn(name=Activity.CLAIM_OWN_ALERT)
async def claim_own_alert(input: ClaimOwnAlertInput) -> OwnAlertClaim:
    """The rate of Relay's own alerts per (org, app, kind), by compare-and-set in the database."""
    raise NotImplementedError(STUB)
