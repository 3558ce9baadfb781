"""``AlertsWorkflow`` and ``OwnAlertWorkflow`` on the time-skipping server, with fake activities under the real
names: a rule fires once and is delivered on both channels, ``minIntervalSecs`` holds the next firing back, webhook
delivery is retried with backoff and audited as failed when it gives up, the ``alert`` message goes to another
executor when one fails, and a round replays deterministically. Relay's own alerts: one per audit row however often
it is started, at most one per app and kind per minimum interval (the first held back goes out late), none sent by
the round, which starts those nobody started and moves the watermark only when it could. A round goes on past a
rule it cannot evaluate, and past one it cannot even carry (stored 300 deep, read by the real activities)."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio import activity
from temporalio.client import WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from activities.alerts import AlertActivities, start_own_alert_delivery
from core import alerts, own_alerts
from core.models import make_engine
from core.store import Store
from core.temporal import data_converter, venv_binary
from tests.conftest import assert_eventually
from worker import workflow_runner
from workflows.alerts import AlertsWorkflow, OwnAlertWorkflow
from workflows.contracts.alerts import (
    AdvanceAlertWatermarkInput,
    AlertRound,
    AlertsInput,
    AlertsRoundResult,
    ClaimOwnAlertInput,
    EvaluateAlertRuleInput,
    LoadAlertRoundInput,
    OwnAlertClaim,
    OwnAlertEvent,
    OwnAlertResult,
    OwnEvents,
    RuleOutcome,
    RuleState,
    RuleType,
    SendAlertWebhookInput,
    WebhookResult,
    WriteAlertAuditInput,
    own_alert_workflow_id,
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
    broken_rules: set[str] = field(default_factory=set)  # rule ids whose evaluation always fails
    # Relay's own alerts: the rows a round reads, the deliveries started (by event key), and the rate.
    own_events: list[OwnAlertEvent] = field(default_factory=list)
    starts: list[OwnAlertEvent] = field(default_factory=list)
    start_fails: bool = False
    own_min_interval: timedelta | None = timedelta(minutes=1)
    rates: dict[tuple[str, str, str], own_alerts.Rate] = field(default_factory=dict)

    @activity.defn(name=Activity.LOAD_ALERT_ROUND)
    async def load_alert_round(self, input: LoadAlertRoundInput) -> AlertRound:
        rules = [dataclasses.replace(r, query=alerts.aggregates_query(r, input.now)) for r in self.rules.values()]
        return AlertRound(rules=rules, own=list(self.own), audit_until=input.now, own_events=list(self.own_events))

    @activity.defn(name=Activity.EVALUATE_ALERT_RULE)
    async def evaluate_alert_rule(self, input: EvaluateAlertRuleInput) -> RuleOutcome:
        """The real decision (``core.alerts``) on an in-memory rule, with the store's compare-and-set."""
        self.evaluations.append(input)
        if input.rule.rule_id in self.broken_rules:
            raise RuntimeError(f"rule {input.rule.rule_id} cannot be evaluated")
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

    @activity.defn(name=Activity.START_OWN_ALERT)
    async def start_own_alert(self, input: OwnAlertEvent) -> bool:
        """Started unless a delivery of the same row was (its writer's start, or an earlier round's)."""
        if self.start_fails:
            raise ApplicationError("Temporal refused the start", non_retryable=True)
        started = all(e.event_key != input.event_key for e in self.starts)
        self.starts.append(input)
        return started

    @activity.defn(name=Activity.CLAIM_OWN_ALERT)
    async def claim_own_alert(self, input: ClaimOwnAlertInput) -> OwnAlertClaim:
        """The real rate (``core.own_alerts.claim``) on an in-memory row."""
        a = input.alert
        key = (a.org, a.app, a.kind)
        self.rates[key], outcome = own_alerts.claim(
            self.rates.get(key, own_alerts.Rate()), alert_id=a.alert_id, now=input.now,
            min_interval=self.own_min_interval, held_behind=input.held_behind)
        return OwnAlertClaim(outcome.send, own_alerts.message(a, outcome, flushed=input.held_behind is not None),
                             flush_at=outcome.flush_at, held_behind=outcome.held_behind)

    def operations(self, channel: str | None = None) -> list[str]:
        return [a.operation for a in self.audits if channel is None or a.channel == channel]

    def activities(self) -> list[Any]:
        return [self.load_alert_round, self.evaluate_alert_rule, self.write_alert_audit, self.advance_alert_watermark,
                self.send_alert_webhook, self.select_retention_executor, self.start_own_alert, self.claim_own_alert]


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
            env.client, task_queue=fakes.task_queue, workflows=[AlertsWorkflow, OwnAlertWorkflow],
            activities=fakes.activities(), workflow_runner=workflow_runner(env.client.data_converter)))
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


def _event(key: str = "relay-executor/acme/shop/e9/executor.recovery.blocked/1", *,
           operation: str = "executor.recovery.blocked", app: str = "shop") -> OwnAlertEvent:
    return OwnAlertEvent("acme", app, operation, key, datetime.fromisoformat("2026-01-01T00:00:00+00:00"), "e9",
                         {"reason": "no HEALTHY executor of version 'v1'"})


async def _delivery(env: WorkflowEnvironment, key: str) -> WorkflowHandle[OwnAlertWorkflow, OwnAlertResult]:
    """The delivery of the row with event key ``key``, by its run (the test server's long poll for a result
    without a run id can come back empty)."""
    workflow_id = own_alert_workflow_id(own_alerts.alert_id(key))
    run_id = (await env.client.get_workflow_handle(workflow_id).describe()).run_id
    return env.client.get_workflow_handle_for(OwnAlertWorkflow.run, workflow_id, run_id=run_id)


async def _own_alert(env: WorkflowEnvironment, fakes: Fakes, event: OwnAlertEvent) -> OwnAlertResult:
    """Start the row's delivery as its writer does (the real ``start_own_alert_delivery``), and wait for it."""
    assert await start_own_alert_delivery(env.client, event, task_queue=fakes.task_queue)
    return await asyncio.wait_for((await _delivery(env, event.event_key)).result(), WALL_TIMEOUT)


async def test_an_own_alert_is_delivered_once_per_audit_row(env: WorkflowEnvironment, fakes: Fakes) -> None:
    event = _event(f"relay-executor/acme/shop/e9/executor.recovery.blocked/{uuid.uuid4()}")
    assert (await _own_alert(env, fakes, event)).sent
    [post] = fakes.posts
    assert post.alert.alert_id == own_alerts.alert_id(event.event_key)  # the webhook's id: the row's
    assert (post.alert.kind, post.alert.app, post.alert.receiving_app, post.alert.rule_id) == (
        "RecoveryBlocked", "shop", "shop", None)
    assert post.alert.message == ("RecoveryBlocked in app 'shop': executor.recovery.blocked (executors: e9): "
                                  "no HEALTHY executor of version 'v1'")
    assert '"name": "RecoveryBlocked"' in fakes.frames[0]
    assert sorted(fakes.operations()) == ["alert.sent", "alert.sent"]
    # Started again (a retried start, the round, another writer): refused, so nothing more is sent.
    assert not await start_own_alert_delivery(env.client, event, task_queue=fakes.task_queue)
    assert len(fakes.posts) == 1


async def test_own_alerts_keep_a_minimum_interval_and_the_first_held_back_goes_out_late(
        env: WorkflowEnvironment, fakes: Fakes) -> None:
    """Three RecoveryBlocked rows of one app at once: the first goes out; the second is held back, waits out the
    interval and goes out then, counting the third, which is only held back (audited). Another kind is not held."""
    keys = [f"k{n}-{uuid.uuid4()}" for n in range(3)]
    first = await _own_alert(env, fakes, _event(keys[0]))
    assert await start_own_alert_delivery(env.client, _event(keys[1]), task_queue=fakes.task_queue)
    waiting = await _delivery(env, keys[1])

    def second_waits() -> None:
        assert fakes.operations() == ["alert.sent", "alert.sent", "alert.suppressed"]

    await assert_eventually(second_waits)
    third = await _own_alert(env, fakes, _event(keys[2]))
    other_kind = await _own_alert(env, fakes, _event(f"u-{uuid.uuid4()}", operation="executor.recovery.unblocked"))
    assert (first.sent, third.sent, third.held_back, other_kind.sent) == (True, False, True, True)
    assert [p.alert.kind for p in fakes.posts] == ["RecoveryBlocked", "RecoveryUnblocked"]

    await env.sleep(timedelta(minutes=1, seconds=1))  # the interval (a handle made by id does not skip time)
    second = await asyncio.wait_for(waiting.result(), WALL_TIMEOUT)
    assert second.sent
    late = fakes.posts[-1].alert
    assert late.alert_id == own_alerts.alert_id(keys[1])
    assert "sent late" in late.message and "1 more RecoveryBlocked alert(s) of this app held back" in late.message
    suppressed = [a for a in fakes.audits if a.operation == "alert.suppressed"]
    assert [a.alert.alert_id for a in suppressed] == [own_alerts.alert_id(k) for k in keys[1:]]
    assert "RELAY_OWN_ALERT_MIN_INTERVAL_SECS" in suppressed[0].outcome


async def test_a_round_sends_no_own_alert_and_starts_those_nobody_started(
        env: WorkflowEnvironment, fakes: Fakes) -> None:
    """Relay's own alerts are sent by the deliveries their writers start: a round sends none (grouped ``own`` is
    what a round before the patch sent), starts the delivery of a row whose writer did not, and moves the
    watermark."""
    written = _event("started-by-its-writer")
    fakes.starts = [written]  # its writer started it
    missed = _event("writer-failed-to-start", operation="orphans.found")
    fakes.own = [OwnEvents("acme", "shop", "executor.recovery.blocked", 2, ["e9"], {"reason": "no peer"},
                           kind="RecoveryBlocked", message="RecoveryBlocked in app 'shop'")]
    fakes.own_events = [written, missed]
    result = await _round(env, fakes)
    assert fakes.posts == [] and fakes.frames == [] and fakes.audits == []
    assert result.own_started == ["writer-failed-to-start"] and result.fired == []
    assert sorted(e.event_key for e in fakes.starts) == ["started-by-its-writer", "started-by-its-writer",
                                                         "writer-failed-to-start"]
    assert fakes.watermark is not None


async def test_a_round_keeps_its_watermark_when_a_delivery_cannot_be_started(
        env: WorkflowEnvironment, fakes: Fakes) -> None:
    _failure_rule(fakes)
    fakes.own_events, fakes.start_fails = [_event("cannot-start")], True
    result = await _round(env, fakes)
    assert result.fired == ["r1"] and result.own_started == []  # the rules went on
    assert fakes.watermark is None  # the next round reads the row again


async def test_a_round_goes_on_past_a_rule_that_cannot_be_evaluated(env: WorkflowEnvironment, fakes: Fakes) -> None:
    _failure_rule(fakes)
    broken = RuleState("r0", "acme", "greedy", "greedy", RuleType.UNRESPONSIVE_APPLICATION, None,
                       datetime.fromisoformat("2026-01-01T00:00:00+00:00"))
    fakes.rules[broken.rule_id] = broken
    fakes.broken_rules = {"r0"}
    result = await _round(env, fakes)
    assert (result.failed, result.fired) == (["r0"], ["r1"])
    assert [p.alert.rule_id for p in fakes.posts] == ["r1"]
    assert len([e for e in fakes.evaluations if e.rule.rule_id == "r0"]) == 5  # EVALUATE_ATTEMPTS, then given up


async def test_a_round_with_a_rule_it_cannot_carry_delivers_another_apps_alert(
        env: WorkflowEnvironment, fakes: Fakes, tmp_path: Path) -> None:
    """The incident: a rule stored with metadata 300 deep (before the REST API bounded it) made every round fail
    to serialize its batch, so no org's alert went out. With the real activities on a real store, the round skips
    that rule (logged once) and delivers another org's WorkflowFailure alert."""
    store = Store(make_engine(f"sqlite:///{tmp_path / 'relay.db'}"))
    deep: Any = {"thresholdSecs": 5}
    for _ in range(300):
        deep = {"x": deep}
    for org, app, rule_type, metadata in [("acme", "greedy", "UnresponsiveApplication", deep),
                                          ("other", "shop", "WorkflowFailure", {"workflowName": "pay"})]:
        store.ensure_app(org, app)
        store.create_alert_rule(org=org, app=app, receiving_app=app, rule_type=rule_type, metadata=metadata,
                                min_interval=None, subject="system", source_ip="")
    webhook = httpx.MockTransport(lambda request: httpx.Response(204))
    real = AlertActivities(store, webhook_url="http://receiver.test/hook", transport=webhook)
    task_queue = f"alerts-real-{uuid.uuid4()}"
    async with Worker(env.client, task_queue=task_queue, workflows=[AlertsWorkflow],
                      activities=[*real.all(), fakes.select_retention_executor, fakes.start_own_alert],
                      workflow_runner=workflow_runner(env.client.data_converter)):
        handle = await env.client.start_workflow(AlertsWorkflow.run, AlertsInput(), id=f"alerts-{uuid.uuid4()}",
                                                 task_queue=task_queue)
        result = await asyncio.wait_for(handle.result(), WALL_TIMEOUT)
    [fired] = result.fired
    [rule] = store.list_alert_rules("other", "shop")
    assert fired == rule.id and rule.last_fired_at is not None
    sent = [r for r in store.list_audit("other", app="shop") if r.operation == "alert.sent"]
    assert {(r.details or {}).get("channel") for r in sent} == {"webhook", "executor"}
    store.engine.dispose()


async def test_a_round_replays_deterministically(env: WorkflowEnvironment, fakes: Fakes) -> None:
    _failure_rule(fakes)
    fakes.own = [OwnEvents("acme", "shop", "orphans.found", 1, kind="OrphansFound", message="orphans")]
    fakes.own_events = [_event("replayed", operation="orphans.found")]
    fakes.webhook_failures = 1
    handle = await env.client.start_workflow(AlertsWorkflow.run, AlertsInput(), id=f"alerts-{uuid.uuid4()}",
                                             task_queue=fakes.task_queue)
    await asyncio.wait_for(handle.result(), WALL_TIMEOUT)
    history = await handle.fetch_history()
    await Replayer(workflows=[AlertsWorkflow], data_converter=data_converter).replay_workflow(history)


async def test_an_executor_that_fails_passes_the_alert_to_another(env: WorkflowEnvironment, fakes: Fakes) -> None:
    fakes.executors, fakes.gone = ["e1", "e2"], {"e1"}
    await _own_alert(env, fakes, _event(f"orphans-{uuid.uuid4()}", operation="orphans.found"))
    assert fakes.asked == ["e1", "e2"]
    [sent] = [a for a in fakes.audits if a.channel == "executor"]
    assert (sent.operation, sent.executor_id) == ("alert.sent", "e2")


async def test_no_executor_left_fails_the_channel(env: WorkflowEnvironment, fakes: Fakes) -> None:
    fakes.gone = {"e1"}
    await _own_alert(env, fakes, _event(f"orphans-{uuid.uuid4()}", operation="orphans.found"))
    [failed] = [a for a in fakes.audits if a.channel == "executor"]
    assert failed.operation == "alert.failed" and "e1" in failed.outcome
    assert fakes.operations("webhook") == ["alert.sent"]
