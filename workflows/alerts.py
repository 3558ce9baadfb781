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

Relay's own alerts (audit rows such as ``executor.recovery.blocked``) are grouped per app and operation and sent
the same way to the app itself; then the audit watermark moves to where the round read up to. The watermarks
(per rule and for the audit log) live in the database, as schedules start a fresh run each time.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

from workflows.executor_requests import ask_executor
from workflows.timing import BACKOFF_INITIAL, DB_ACTIVITY_TIMEOUT

with workflow.unsafe.imports_passed_through():
    from workflows.contracts.alerts import (
        AdvanceAlertWatermarkInput,
        Alert,
        AlertsInput,
        AlertsRoundResult,
        Channel,
        EvaluateAlertRuleInput,
        LoadAlertRoundInput,
        OwnEvents,
        RuleState,
        SendAlertWebhookInput,
        WriteAlertAuditInput,
        advance_alert_watermark,
        evaluate_alert_rule,
        load_alert_round,
        send_alert_webhook,
        write_alert_audit,
    )

WEBHOOK_TIMEOUT = timedelta(seconds=15)
WEBHOOK_MAX_BACKOFF = timedelta(seconds=30)
QUERY_ATTEMPTS = 2  # executors asked for one rule's aggregates


@workflow.defn
class AlertsWorkflow:
    @workflow.run
    async def run(self, input: AlertsInput) -> AlertsRoundResult:
        self._input = input
        self._now = workflow.now()
        self._result = AlertsRoundResult()
        batch = await workflow.execute_activity(
            load_alert_round, LoadAlertRoundInput(now=self._now, lookback=input.interval),
            start_to_close_timeout=DB_ACTIVITY_TIMEOUT)
        await asyncio.gather(*(self._rule(rule) for rule in batch.rules),
                             *(self._own(events) for events in batch.own))
        if batch.audit_until is not None:
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
        outcome = await workflow.execute_activity(
            evaluate_alert_rule, EvaluateAlertRuleInput(rule, self._now, reply=reply, failure=failure),
            start_to_close_timeout=DB_ACTIVITY_TIMEOUT)
        if not outcome.checked:
            self._result.unchecked.append(rule.rule_id)
        if outcome.message is None:
            return
        alert = Alert(str(workflow.uuid4()), rule.org, rule.app, rule.receiving_app, rule.rule_type.value,
                      outcome.message, self._now, rule.rule_id)
        if not outcome.fire:
            self._result.suppressed.append(rule.rule_id)
            await self._audit("alert.suppressed", alert, None, "held back by minIntervalSecs")
            return
        self._result.fired.append(rule.rule_id)
        await self._deliver(alert)

    # -- Relay's own alerts ------------------------------------------------------------------------------------

    async def _own(self, events: OwnEvents) -> None:
        alert = Alert(str(workflow.uuid4()), events.org, events.app, events.app, events.kind, events.message,
                      self._now)
        self._result.fired.append(f"own:{events.kind}:{events.org}/{events.app}")
        await self._deliver(alert)

    # -- delivery ----------------------------------------------------------------------------------------------

    async def _deliver(self, alert: Alert) -> None:
        await asyncio.gather(self._webhook(alert), self._executor_alert(alert))

    async def _webhook(self, alert: Alert) -> None:
        try:
            result = await workflow.execute_activity(
                send_alert_webhook, SendAlertWebhookInput(alert), start_to_close_timeout=WEBHOOK_TIMEOUT,
                retry_policy=RetryPolicy(initial_interval=BACKOFF_INITIAL, backoff_coefficient=2,
                                         maximum_interval=WEBHOOK_MAX_BACKOFF,
                                         maximum_attempts=self._input.webhook_attempts),
                summary=f"alert {alert.kind} webhook")
        except ActivityError as err:
            await self._audit("alert.failed", alert, Channel.WEBHOOK, str(err.cause or err), status="failure")
            return
        if result.configured:
            await self._audit("alert.sent", alert, Channel.WEBHOOK, f"HTTP {result.status}")

    async def _executor_alert(self, alert: Alert) -> None:
        metadata = {"org": alert.org, "app": alert.app, "kind": alert.kind, "time": alert.time.isoformat(),
                    "ruleId": alert.rule_id or "", "alertId": alert.alert_id}
        fields = {"name": alert.kind, "message": alert.message, "metadata": metadata}
        tried: list[str] = []
        reply = await self._ask(alert.org, alert.receiving_app, "alert", fields,
                                attempts=self._input.executor_attempts, tried=tried)
        executor_id = tried[-1] if tried else None
        if isinstance(reply, str):
            await self._audit("alert.failed", alert, Channel.EXECUTOR, reply, status="failure",
                              executor_id=executor_id)
        elif reply.get("success") is not True:
            outcome = f"the executor's alert handler failed: {str(reply.get('error_message'))[:300]}"
            await self._audit("alert.failed", alert, Channel.EXECUTOR, outcome, status="failure",
                              executor_id=executor_id)
        else:
            await self._audit("alert.sent", alert, Channel.EXECUTOR, "success", executor_id=executor_id)

    # -- asking an executor ------------------------------------------------------------------------------------

    async def _ask(self, org: str, app: str, kind: str, fields: dict[str, Any], *, attempts: int = QUERY_ATTEMPTS,
                   tried: list[str] | None = None) -> dict[str, Any] | str:
        return await ask_executor(org, app, kind, fields, reply_timeout=self._input.reply_timeout, attempts=attempts,
                                  tried=tried)

    async def _audit(self, operation: str, alert: Alert, channel: str | None, outcome: str, *,
                     status: str = "success", executor_id: str | None = None) -> None:
        # workflow.uuid4() is replay-safe: a retried activity carries the same key and lands once.
        key = f"{workflow.info().workflow_id}/{operation}/{workflow.uuid4()}"
        await workflow.execute_activity(
            write_alert_audit, WriteAlertAuditInput(key, operation, alert, channel, outcome, status, executor_id),
            start_to_close_timeout=DB_ACTIVITY_TIMEOUT)
