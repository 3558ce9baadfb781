"""``AlertsWorkflow``: one evaluation round of every alerting rule, and delivery of what fires.

The Temporal Schedule ``relay-alerts`` (created by the worker at start-up) starts one every
``RELAY_ALERT_INTERVAL_SECS``. A round reads the rules with their state and Relay's own alert events
(``load_alert_round``), then per rule, concurrently:

1. observes its condition: ``WorkflowFailure`` and ``SlowQueue`` ask one HEALTHY executor of the app for
   ``get_workflow_aggregates`` with the body the round's read prepared (another executor if it fails);
   ``UnresponsiveApplication`` uses the registry, read with the rules;
2. decides and records it in one activity (``evaluate_alert_rule``: ``core.alerts.decide``, the window
   observed, and when firing ``lastFiredAt`` by compare-and-set, so a firing is claimed once even if two rounds
   overlap). The logic lives in ``core.alerts``, which this module may not import (workflows import no layer
   below them), so the workflow only orchestrates;
3. delivers a claimed alert on each channel independently: the webhook (one activity, retried by Temporal with
   backoff up to ``webhook_attempts``), and the ``alert`` message to one HEALTHY executor of the receiving app
   through its gateway (another executor after a failure). Each outcome is audited: ``alert.sent`` /
   ``alert.failed``; a firing held back by the rate, ``alert.suppressed``.

Relay's own alerts (audit rows such as ``executor.recovery.blocked``) go out as they happen: the code that writes
the row starts an ``OwnAlertWorkflow`` (below) for it, whose id derives from the row, so a second start of it is
refused. The round does not send them (``OWN_AT_ONCE_PATCH``; rounds before it grouped them per app and operation
and sent them to the app itself): it starts the delivery of any row it reads whose delivery nobody
started (the writer's start failed, or the row predates this code), and moves the audit watermark to where it read
up to. The watermarks (per rule and for the audit log) live in the database, as schedules start a fresh run each
time.

A round goes on past a rule it cannot evaluate: a rule whose metadata cannot be read or carried is left out when
the round reads the rules (``activities.alerts.readable``), and one whose evaluation fails is counted in
``failed`` while the others go on.

``OwnAlertWorkflow`` delivers one of Relay's own alerts: it claims the right to send it (``claim_own_alert``: at
most one per app and kind per ``RELAY_OWN_ALERT_MIN_INTERVAL_SECS``, ``core.own_alerts``), and sends it as the
round sends a rule's (``Delivery``); held back, it is audited ``alert.suppressed``, and the first one held back
after a send waits (a durable timer) until the interval is over and asks again.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

from workflows.executor_requests import ask_executor
from workflows.timing import BACKOFF_INITIAL, DB_ACTIVITY_TIMEOUT

with workflow.unsafe.imports_passed_through():
    from workflows.contracts.alerts import (
        OWN_ALERT_WORKFLOW,
        AdvanceAlertWatermarkInput,
        Alert,
        AlertsInput,
        AlertsRoundResult,
        Channel,
        ClaimOwnAlertInput,
        DeliveryOptions,
        EvaluateAlertRuleInput,
        LoadAlertRoundInput,
        OwnAlertClaim,
        OwnAlertEvent,
        OwnAlertInput,
        OwnAlertResult,
        RuleState,
        SendAlertWebhookInput,
        WriteAlertAuditInput,
        advance_alert_watermark,
        claim_own_alert,
        evaluate_alert_rule,
        load_alert_round,
        send_alert_webhook,
        start_own_alert,
        write_alert_audit,
    )

WEBHOOK_TIMEOUT = timedelta(seconds=15)
WEBHOOK_MAX_BACKOFF = timedelta(seconds=30)
QUERY_ATTEMPTS = 2  # executors asked for one rule's aggregates
# A rule's evaluation (a database activity) is tried this often, then left to the next round: a rule that cannot
# be evaluated must not hold the round, and with it every other rule (the schedule skips a round while one runs).
EVALUATE_ATTEMPTS = 5
# Starting a delivery nobody started: a few tries; if one still fails, the watermark stays where it was, so the next
# round reads the row again (the deliveries this round did start are not started twice: their ids are taken).
START_ATTEMPTS = 5
# A deprecated patch (docs/pages/contributing/patch-policy.md): a round does not send Relay's own alerts (their
# writers start an OwnAlertWorkflow each as the row is written); it starts the delivery of those nobody started, and
# still moves the audit watermark. Rounds before it sent them grouped (``AlertRound.own``): that branch is gone, and
# ``workflow.deprecate_patch`` keeps a round that wrote the marker replaying while a new round writes it deprecated.
OWN_AT_ONCE_PATCH = "own-alerts-at-once"


def _options(input: AlertsInput) -> DeliveryOptions:
    return DeliveryOptions(reply_timeout=input.reply_timeout, webhook_attempts=input.webhook_attempts,
                           executor_attempts=input.executor_attempts)


@workflow.defn
class AlertsWorkflow:
    @workflow.run
    async def run(self, input: AlertsInput) -> AlertsRoundResult:
        self._input = input
        self._now = workflow.now()
        self._result = AlertsRoundResult()
        self._delivery = Delivery(_options(input))
        batch = await workflow.execute_activity(
            load_alert_round, LoadAlertRoundInput(now=self._now, lookback=input.interval),
            start_to_close_timeout=DB_ACTIVITY_TIMEOUT)
        workflow.deprecate_patch(OWN_AT_ONCE_PATCH)
        own = [self._start_own(event) for event in batch.own_events]
        done = await asyncio.gather(*(self._rule(rule) for rule in batch.rules), *own)
        # A delivery that could not be started (False) keeps the watermark back: the next round reads its row again.
        if batch.audit_until is not None and False not in done:
            await workflow.execute_activity(advance_alert_watermark, AdvanceAlertWatermarkInput(batch.audit_until),
                                            start_to_close_timeout=DB_ACTIVITY_TIMEOUT)
        return self._result

    # -- rules -------------------------------------------------------------------------------------------------

    async def _rule(self, rule: RuleState) -> None:
        reply: dict[str, Any] | None = None
        failure: str | None = None
        if rule.query is not None:
            answer = await self._ask(rule.org, rule.app, "get_workflow_aggregates", {"body": rule.query})
            reply, failure = (None, answer) if isinstance(answer, str) else (answer, None)
        try:
            outcome = await workflow.execute_activity(
                evaluate_alert_rule, EvaluateAlertRuleInput(rule, self._now, reply=reply, failure=failure),
                start_to_close_timeout=DB_ACTIVITY_TIMEOUT,
                retry_policy=RetryPolicy(maximum_attempts=EVALUATE_ATTEMPTS))
        except ActivityError as err:
            # This rule is left to the next round; the others go on.
            workflow.logger.warning("alerting rule %s of %s/%s not evaluated: %s", rule.rule_id, rule.org, rule.app,
                                    err.cause or err)
            self._result.failed.append(rule.rule_id)
            return
        if not outcome.checked:
            self._result.unchecked.append(rule.rule_id)
        if outcome.message is None:
            return
        alert = Alert(str(workflow.uuid4()), rule.org, rule.app, rule.receiving_app, rule.rule_type.value,
                      outcome.message, self._now, rule.rule_id)
        if not outcome.fire:
            self._result.suppressed.append(rule.rule_id)
            await self._delivery.audit("alert.suppressed", alert, None, "held back by minIntervalSecs")
            return
        self._result.fired.append(rule.rule_id)
        await self._delivery.deliver(alert)

    # -- Relay's own alerts ------------------------------------------------------------------------------------

    async def _start_own(self, event: OwnAlertEvent) -> bool:
        """Start the delivery of an own-alert row's alert, unless its writer did (its id is then taken): False when
        it could not be started."""
        try:
            started = await workflow.execute_activity(
                start_own_alert, event, start_to_close_timeout=DB_ACTIVITY_TIMEOUT,
                retry_policy=RetryPolicy(maximum_attempts=START_ATTEMPTS))
        except ActivityError as err:
            workflow.logger.warning("could not start the %s alert of %s/%s (%s): %s; the next round tries again",
                                    event.operation, event.org, event.app, event.event_key, err.cause or err)
            return False
        if started:
            self._result.own_started.append(event.event_key)
        return True

    async def _ask(self, org: str, app: str, kind: str, fields: dict[str, Any]) -> dict[str, Any] | str:
        return await ask_executor(org, app, kind, fields, reply_timeout=self._input.reply_timeout,
                                  attempts=QUERY_ATTEMPTS)


@workflow.defn(name=OWN_ALERT_WORKFLOW)
class OwnAlertWorkflow:
    """One of Relay's own alerts, as it happens (started by whatever wrote its audit row; its id derives from the
    row, so it runs once per row): claimed against the rate of its kind, then delivered, or held back."""

    @workflow.run
    async def run(self, input: OwnAlertInput) -> OwnAlertResult:
        alert = input.alert
        claim = await self._claim(ClaimOwnAlertInput(alert, workflow.now()))
        delivery = Delivery(claim.options)
        if not claim.send:
            then = ("the next alert of its kind counts it" if claim.flush_at is None
                    else f"sent at {claim.flush_at.isoformat()} unless another alert of its kind goes first")
            await delivery.audit("alert.suppressed", alert, None, f"held back by RELAY_OWN_ALERT_MIN_INTERVAL_SECS; "
                                                                  f"{then}")
            if claim.flush_at is None:
                return OwnAlertResult(sent=False, held_back=True)
            wait = claim.flush_at - workflow.now()
            if wait > timedelta(0):
                await workflow.sleep(wait, summary="held back by the minimum interval")
            claim = await self._claim(ClaimOwnAlertInput(alert, workflow.now(), held_behind=claim.held_behind))
            if not claim.send:  # another alert of its kind went out meanwhile, and counted this one
                return OwnAlertResult(sent=False, held_back=True)
        await delivery.deliver(dataclasses.replace(alert, message=claim.message))
        return OwnAlertResult(sent=True)

    @staticmethod
    async def _claim(input: ClaimOwnAlertInput) -> OwnAlertClaim:
        return await workflow.execute_activity(claim_own_alert, input, start_to_close_timeout=DB_ACTIVITY_TIMEOUT)


# -- delivery, for both ------------------------------------------------------------------------------------------


@dataclass
class Delivery:
    """An alert on each channel independently (the webhook; the ``alert`` message to one HEALTHY executor of the
    receiving app), each outcome audited: ``alert.sent`` or ``alert.failed``."""

    options: DeliveryOptions

    async def deliver(self, alert: Alert) -> None:
        await asyncio.gather(self._webhook(alert), self._executor_alert(alert))

    async def _webhook(self, alert: Alert) -> None:
        try:
            result = await workflow.execute_activity(
                send_alert_webhook, SendAlertWebhookInput(alert), start_to_close_timeout=WEBHOOK_TIMEOUT,
                retry_policy=RetryPolicy(initial_interval=BACKOFF_INITIAL, backoff_coefficient=2,
                                         maximum_interval=WEBHOOK_MAX_BACKOFF,
                                         maximum_attempts=self.options.webhook_attempts),
                summary=f"alert {alert.kind} webhook")
        except ActivityError as err:
            await self.audit("alert.failed", alert, Channel.WEBHOOK, str(err.cause or err), status="failure")
            return
        if result.configured:
            await self.audit("alert.sent", alert, Channel.WEBHOOK, f"HTTP {result.status}")

    async def _executor_alert(self, alert: Alert) -> None:
        metadata = {"org": alert.org, "app": alert.app, "kind": alert.kind, "time": alert.time.isoformat(),
                    "ruleId": alert.rule_id or "", "alertId": alert.alert_id}
        fields = {"name": alert.kind, "message": alert.message, "metadata": metadata}
        tried: list[str] = []
        reply = await ask_executor(alert.org, alert.receiving_app, "alert", fields,
                                   reply_timeout=self.options.reply_timeout, attempts=self.options.executor_attempts,
                                   tried=tried)
        executor_id = tried[-1] if tried else None
        if isinstance(reply, str):
            await self.audit("alert.failed", alert, Channel.EXECUTOR, reply, status="failure",
                             executor_id=executor_id)
        elif reply.get("success") is not True:
            outcome = f"the executor's alert handler failed: {str(reply.get('error_message'))[:300]}"
            await self.audit("alert.failed", alert, Channel.EXECUTOR, outcome, status="failure",
                             executor_id=executor_id)
        else:
            await self.audit("alert.sent", alert, Channel.EXECUTOR, "success", executor_id=executor_id)

    async def audit(self, operation: str, alert: Alert, channel: str | None, outcome: str, *,
                    status: str = "success", executor_id: str | None = None) -> None:
        # workflow.uuid4() is replay-safe: a retried activity carries the same key and lands once.
        key = f"{workflow.info().workflow_id}/{operation}/{workflow.uuid4()}"
        await workflow.execute_activity(
            write_alert_audit, WriteAlertAuditInput(key, operation, alert, channel, outcome, status, executor_id),
            start_to_close_timeout=DB_ACTIVITY_TIMEOUT)
