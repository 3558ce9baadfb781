"""``AlertsWorkflow`` on the time-skipping server, with fake activities under the real names: a rule fires once
and is delivered on both channels, ``minIntervalSecs`` holds the next firing back, webhook delivery is retried
with backoff and audited as failed when it gives up, the ``alert`` message goes to another executor when one
fails, Relay's own alerts go out and move the watermark, and a round replays deterministically."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import pytest
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from core import alerts
from core.temporal import data_converter, venv_binary
from workflows.alerts import AlertsWorkflow
from workflows.contracts.alerts import (
    AdvanceAlertWatermarkInput,
    AlertRound,
    AlertsInput,
    AlertsRoundResult,
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
from workflows.contracts.common import Activity, Candidate
from workflows.contracts.management import ExecutorRequestInput, ExecutorRequestReply, Failure, pack
from workflows.contracts.retention import SelectRetentionExecutorInput

WALL_TIMEOUT = 30


@dataclass
class Fakes:
    task_queue: str
    gateway_queue: str
    rules: dict[str, RuleState] = field(default_factory=dict)
    own: list[OwnEvents] = field(default_factory=list)
    failures: int = 2  # what get_workflow_aggregates reports
    webhook_failures: int = 0  # the next this many POSTs fail
    posts: list[SendAlertWebhookInput] = field(default_factory=list)
    frames: list[str] = field(default_factory=list)
    audits: list[WriteAlertAuditInput] = field(default_factory=list)
    evaluations: list[EvaluateAlertRuleInput] = field(default_factory=list)
    watermark: datetime | None = None
    executors: list[str] = field(default_factory=lambda: ["e1"])
    gone: set[str] = field(default_factory=set)  # executors whose gateway no longer holds their socket
    asked: list[str] = field(default_factory=list)

    @activity.defn(name=Activity.LOAD_ALERT_ROUND)
    async def load_alert_round(self, input: LoadAlertRoundInput) -> AlertRound:
        rules = [dataclasses.replace(r, query=alerts.aggregates_query(r, input.now)) for r in self.rules.values()]
        return AlertRound(rules=rules, own=list(self.own), audit_until=input.now)

    @activity.defn(name=Activity.EVALUATE_ALERT_RULE)
    async def evaluate_alert_rule(self, input: EvaluateAlertRuleInput) -> RuleOutcome:
        """The real decision (``core.alerts``) on an in-memory rule, with the store's compare-and-set."""
        self.evaluations.append(input)
        rule = self.rules[input.rule.rule_id]
        seen = alerts.observe(rule.rule_type, input.reply, input.failure)
        d = alerts.decide(input.rule, seen, input.now)
        rule.checked_until, rule.condition_since = d.checked_until, d.condition_since
        claimed = d.fire and rule.last_fired_at == input.rule.last_fired_at
        if claimed:
            rule.last_fired_at, rule.suppressed = input.now, 0
        elif d.message is not None:
            rule.suppressed += 1
        return RuleOutcome(d.message, fire=claimed, suppressed=d.message is not None and not claimed,
                           checked=seen.failed is None)

    @activity.defn(name=Activity.WRITE_ALERT_AUDIT)
    async def write_alert_audit(self, input: WriteAlertAuditInput) -> None:
        if all(a.event_key != input.event_key for a in self.audits):
            self.audits.append(input)

    @activity.defn(name=Activity.ADVANCE_ALERT_WATERMARK)
    async def advance_alert_watermark(self, input: AdvanceAlertWatermarkInput) -> None:
        self.watermark = input.until

    @activity.defn(name=Activity.SEND_ALERT_WEBHOOK)
    async def send_alert_webhook(self, input: SendAlertWebhookInput) -> WebhookResult:
        self.posts.append(input)
        if self.webhook_failures > 0:
            self.webhook_failures -= 1
            raise ApplicationError("webhook to receiver answered HTTP 503", type="WebhookRefused")
        return WebhookResult(configured=True, status=200)

    @activity.defn(name=Activity.SELECT_RETENTION_EXECUTOR)
    async def select_retention_executor(self, input: SelectRetentionExecutorInput) -> Candidate | None:
        left = [e for e in self.executors if e not in input.exclude]
        return Candidate(left[0], self.gateway_queue) if left else None

    @activity.defn(name=Activity.EXECUTOR_REQUEST)
    async def executor_request(self, input: ExecutorRequestInput) -> ExecutorRequestReply:
        self.asked.append(input.executor_id)
        if input.executor_id in self.gone:
            return ExecutorRequestReply(failure=Failure.UNAVAILABLE, detail="not connected to its gateway")
        self.frames.append(input.frame)
        if '"type": "alert"' in input.frame:
            return ExecutorRequestReply(pack({"type": "alert", "success": True, "error_message": None}))
        output = [{"group": {"name": "pay"}, "count": self.failures}] if self.failures else []
        return ExecutorRequestReply(pack({"type": "get_workflow_aggregates", "output": output}))

    def operations(self, channel: str | None = None) -> list[str]:
        return [a.operation for a in self.audits if channel is None or a.channel == channel]


@pytest.fixture(scope="module")
async def env() -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping server of this module's own (see tests/workflows/test_retention.py for why)."""
    env = await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(venv_binary("temporal-test-server")), data_converter=data_converter)
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture
async def fakes(env: WorkflowEnvironment) -> AsyncIterator[Fakes]:
    fakes = Fakes(task_queue=f"alerts-{uuid.uuid4()}", gateway_queue=f"alerts-gw-{uuid.uuid4()}")
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(Worker(
            env.client, task_queue=fakes.task_queue, workflows=[AlertsWorkflow],
            activities=[fakes.load_alert_round, fakes.evaluate_alert_rule, fakes.write_alert_audit,
                        fakes.advance_alert_watermark, fakes.send_alert_webhook, fakes.select_retention_executor]))
        await stack.enter_async_context(Worker(env.client, task_queue=fakes.gateway_queue,
                                               activities=[fakes.executor_request]))
        yield fakes


async def _round(env: WorkflowEnvironment, fakes: Fakes, **options: Any) -> AlertsRoundResult:
    handle = await env.client.start_workflow(AlertsWorkflow.run, AlertsInput(**options),
                                             id=f"alerts-{uuid.uuid4()}", task_queue=fakes.task_queue)
    return await asyncio.wait_for(handle.result(), WALL_TIMEOUT)


def _failure_rule(fakes: Fakes, **state: Any) -> RuleState:
    rule = RuleState("r1", "acme", "shop", "ops", RuleType.WORKFLOW_FAILURE, {"workflowName": "pay"},
                     datetime.fromisoformat("2026-01-01T00:00:00+00:00"), **state)
    fakes.rules[rule.rule_id] = rule
    return rule


async def test_a_rule_fires_once_on_both_channels(env: WorkflowEnvironment, fakes: Fakes) -> None:
    _failure_rule(fakes)
    result = await _round(env, fakes)
    assert (result.fired, result.suppressed) == (["r1"], [])
    [post] = fakes.posts
    assert (post.alert.kind, post.alert.app, post.alert.receiving_app) == ("WorkflowFailure", "shop", "ops")
    assert "2 workflow(s) of 'pay' (pay) failed" in post.alert.message
    query, alert = fakes.frames
    assert '"get_workflow_aggregates"' in query and '"status": ["ERROR"]' in query and '"name": ["pay"]' in query
    assert '"name": "WorkflowFailure"' in alert
    assert sorted(fakes.operations()) == ["alert.sent", "alert.sent"]
    assert {a.channel for a in fakes.audits} == {"webhook", "executor"}
    assert fakes.rules["r1"].last_fired_at is not None


async def test_min_interval_holds_the_next_firing_back(env: WorkflowEnvironment, fakes: Fakes) -> None:
    # Fired "just now" by the server's clock (the test server may jump its clock between runs: a round after
    # another could be years later, so the rule's state is set rather than made by a first round).
    _failure_rule(fakes, min_interval=timedelta(hours=1), last_fired_at=await env.get_current_time())
    held = await _round(env, fakes)
    assert (held.fired, held.suppressed) == ([], ["r1"])
    assert fakes.posts == [] and fakes.rules["r1"].suppressed == 1
    assert fakes.operations() == ["alert.suppressed"]
    [evaluation] = fakes.evaluations
    assert evaluation.reply is not None  # observed all the same: the window moves on, the firing is counted


async def test_no_failures_no_alert(env: WorkflowEnvironment, fakes: Fakes) -> None:
    _failure_rule(fakes)
    fakes.failures = 0
    assert (await _round(env, fakes)).fired == []
    assert fakes.posts == [] and fakes.audits == [] and fakes.rules["r1"].checked_until is not None


async def test_webhook_delivery_is_retried_with_backoff(env: WorkflowEnvironment, fakes: Fakes) -> None:
    _failure_rule(fakes)
    fakes.webhook_failures = 2
    await _round(env, fakes, webhook_attempts=5)
    assert len(fakes.posts) == 3 and len({p.alert.alert_id for p in fakes.posts}) == 1  # one alert, three tries
    assert fakes.operations("webhook") == ["alert.sent"]


async def test_webhook_gives_up_and_audits_the_failure(env: WorkflowEnvironment, fakes: Fakes) -> None:
    _failure_rule(fakes)
    fakes.webhook_failures = 100
    await _round(env, fakes, webhook_attempts=3)
    assert len(fakes.posts) == 3
    [failed] = [a for a in fakes.audits if a.channel == "webhook"]
    assert (failed.operation, failed.status) == ("alert.failed", "failure") and "HTTP 503" in failed.outcome
    assert fakes.operations("executor") == ["alert.sent"]  # the other channel is independent


async def test_own_alerts_go_to_the_app_and_move_the_watermark(env: WorkflowEnvironment, fakes: Fakes) -> None:
    fakes.own = [OwnEvents("acme", "shop", "executor.recovery.blocked", 2, ["e9"], {"reason": "no peer"},
                           kind="RecoveryBlocked", message="RecoveryBlocked in app 'shop'")]
    result = await _round(env, fakes)
    assert result.fired == ["own:RecoveryBlocked:acme/shop"]
    [post] = fakes.posts
    assert (post.alert.kind, post.alert.receiving_app, post.alert.rule_id) == ("RecoveryBlocked", "shop", None)
    assert fakes.watermark is not None


async def test_a_round_replays_deterministically(env: WorkflowEnvironment, fakes: Fakes) -> None:
    _failure_rule(fakes)
    fakes.own = [OwnEvents("acme", "shop", "orphans.found", 1, kind="OrphansFound", message="orphans")]
    fakes.webhook_failures = 1
    handle = await env.client.start_workflow(AlertsWorkflow.run, AlertsInput(), id=f"alerts-{uuid.uuid4()}",
                                             task_queue=fakes.task_queue)
    await asyncio.wait_for(handle.result(), WALL_TIMEOUT)
    history = await handle.fetch_history()
    await Replayer(workflows=[AlertsWorkflow], data_converter=data_converter).replay_workflow(history)


async def test_an_executor_that_fails_passes_the_alert_to_another(env: WorkflowEnvironment, fakes: Fakes) -> None:
    fakes.own = [OwnEvents("acme", "shop", "orphans.found", 1, kind="OrphansFound", message="orphans")]
    fakes.executors, fakes.gone = ["e1", "e2"], {"e1"}
    await _round(env, fakes)
    assert fakes.asked == ["e1", "e2"]
    [sent] = [a for a in fakes.audits if a.channel == "executor"]
    assert (sent.operation, sent.executor_id) == ("alert.sent", "e2")


async def test_no_executor_left_fails_the_channel(env: WorkflowEnvironment, fakes: Fakes) -> None:
    fakes.own = [OwnEvents("acme", "shop", "orphans.found", 1, kind="OrphansFound", message="orphans")]
    fakes.gone = {"e1"}
    await _round(env, fakes)
    [failed] = [a for a in fakes.audits if a.channel == "executor"]
    assert failed.operation == "alert.failed" and "e1" in failed.outcome
    assert fakes.operations("webhook") == ["alert.sent"]
