"""Retention: the cutoff arithmetic at the unit edges, the wire body, the storage queries, the audit log's own
retention (batched deletes), and the round and per-app workflows on the time-skipping server with fake activities
under the real names.

End-to-end behaviour on real executors is in ``test_retention_e2e.py``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import pytest
from sqlalchemy import event
from temporalio import activity
from temporalio.client import ScheduleActionStartWorkflow, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from activities.retention import RetentionActivities, audit_details
from core import metrics, units, wire
from core.errors import ProtocolError
from core.models import Application, AuditLog, Executor, make_engine
from core.settings import Settings
from core.store import Store
from core.temporal import data_converter, venv_binary
from tests.conftest import assert_eventually
from worker import retention_schedule
from workflows.contracts.common import Activity, Candidate, ExecutorStatus
from workflows.contracts.management import ExecutorRequestInput, ExecutorRequestReply, pack
from workflows.contracts.retention import (
    AppRetentionInput,
    AppRetentionResult,
    DispatchRetentionInput,
    ListRetentionTargetsInput,
    PruneAuditLogInput,
    RetentionInput,
    RetentionReply,
    RetentionRoundResult,
    RetentionTarget,
    SelectRetentionExecutorInput,
    WriteRetentionAuditInput,
    app_retention_workflow_id,
)
from workflows.retention import (
    EPOCH,
    AppRetentionWorkflow,
    RetentionWorkflow,
    is_recent,
    recent_window,
    retention_cutoffs,
)

T = TypeVar("T")
NOW = datetime(2026, 11, 30, 12, 0, 0, 123_456, tzinfo=UTC)  # sub-millisecond part on purpose
NOW_MS = 1_796_040_000_123  # floor: the wire never rounds an instant up
BATCH = 10_000


def _target(**settings: Any) -> RetentionTarget:
    return RetentionTarget("acme", "shop", **settings)


def _body(target: RetentionTarget, now: datetime = NOW, batch: int = BATCH) -> dict[str, int | None] | None:
    """What the wire would carry for ``target`` at ``now``."""
    cutoffs = retention_cutoffs(target, now=now, gc_batch_size=batch)
    if cutoffs is None:
        return None
    return wire.retention_body(gc_cutoff=cutoffs.gc_cutoff, gc_rows_threshold=cutoffs.gc_rows_threshold,
                               gc_batch_size=cutoffs.gc_batch_size, timeout_cutoff=cutoffs.timeout_cutoff)


# -- cutoff arithmetic -----------------------------------------------------------------------------------------


def test_epoch_ms_of_the_clock_is_floored() -> None:
    assert units.datetime_to_epoch_ms(NOW) == NOW_MS


@pytest.mark.parametrize("threshold_ms", [1, 999, 1000, 60_000, 86_400_000, 30 * 86_400_000])
def test_gc_cutoff_is_now_minus_the_threshold_in_epoch_ms(threshold_ms: int) -> None:
    # The REST edge turns gcTimeThresholdMs into a timedelta; the wire turns the cutoff into epoch ms.
    body = _body(_target(gc_time_threshold=units.ms_to_timedelta(threshold_ms)))
    assert body is not None
    assert body["gc_cutoff_epoch_ms"] == NOW_MS - threshold_ms
    assert body["timeout_cutoff_epoch_ms"] is None


@pytest.mark.parametrize("threshold_ms", [1, 1000, 3_600_000])
def test_timeout_cutoff_is_now_minus_the_global_timeout_in_epoch_ms(threshold_ms: int) -> None:
    body = _body(_target(global_timeout=units.ms_to_timedelta(threshold_ms), gc_rows_threshold=None))
    assert body == {"gc_cutoff_epoch_ms": None, "gc_rows_threshold": None, "gc_batch_size": BATCH,
                    "timeout_cutoff_epoch_ms": NOW_MS - threshold_ms}


def test_seconds_and_milliseconds_are_not_mixed_up() -> None:
    one_second = _body(_target(gc_time_threshold=units.seconds_to_timedelta(1)))
    thousand_ms = _body(_target(gc_time_threshold=units.ms_to_timedelta(1000)))
    one_ms = _body(_target(gc_time_threshold=units.ms_to_timedelta(1)))
    assert one_second == thousand_ms
    assert one_second is not None and one_ms is not None
    assert one_ms["gc_cutoff_epoch_ms"] - one_second["gc_cutoff_epoch_ms"] == 999  # type: ignore[operator]


def test_everything_set() -> None:
    body = _body(_target(gc_time_threshold=timedelta(hours=1), gc_rows_threshold=5,
                         global_timeout=timedelta(days=2)), batch=1234)
    assert body == {"gc_cutoff_epoch_ms": NOW_MS - 3_600_000, "gc_rows_threshold": 5, "gc_batch_size": 1234,
                    "timeout_cutoff_epoch_ms": NOW_MS - 2 * 86_400_000}


def test_the_default_row_threshold_alone_is_a_setting() -> None:
    # Like the upstream conductor: every app gets gcRowsThreshold 1,000,000 unless it clears it.
    assert _body(_target(gc_rows_threshold=1_000_000)) == {
        "gc_cutoff_epoch_ms": None, "gc_rows_threshold": 1_000_000, "gc_batch_size": BATCH,
        "timeout_cutoff_epoch_ms": None,
    }


def test_nothing_set_means_no_message() -> None:
    assert _body(_target()) is None


@pytest.mark.parametrize("rows", [0, -1])
def test_a_row_threshold_of_zero_or_less_is_never_sent(rows: int) -> None:
    assert _body(_target(gc_rows_threshold=rows)) is None  # alone: nothing else set, so no message at all
    body = _body(_target(gc_rows_threshold=rows, gc_time_threshold=timedelta(seconds=1)))
    assert body is not None and body["gc_rows_threshold"] is None
    # The wire enforces it too, whatever its caller passes.
    assert wire.retention_body(gc_cutoff=None, gc_rows_threshold=rows, gc_batch_size=0,
                               timeout_cutoff=None) == dict.fromkeys(_KEYS)


_KEYS = ("gc_cutoff_epoch_ms", "gc_rows_threshold", "gc_batch_size", "timeout_cutoff_epoch_ms")


@pytest.mark.parametrize("duration", [timedelta(0), timedelta(milliseconds=-1)])
def test_a_time_threshold_of_zero_or_less_is_unset(duration: timedelta) -> None:
    # Zero would collect every finished workflow at once; the REST edge refuses it, and so does the round.
    assert _body(_target(gc_time_threshold=duration, global_timeout=duration)) is None


def test_a_threshold_older_than_the_epoch_is_clamped_to_zero() -> None:
    huge = timedelta(days=999_999_999)  # timedelta.max: NOW - huge would underflow datetime
    body = _body(_target(gc_time_threshold=huge, global_timeout=NOW - EPOCH))
    assert body is not None
    assert body["gc_cutoff_epoch_ms"] == 0 and body["timeout_cutoff_epoch_ms"] == 0
    just_inside = _body(_target(gc_time_threshold=NOW - EPOCH - timedelta(milliseconds=1)))
    assert just_inside is not None and just_inside["gc_cutoff_epoch_ms"] == 1


@pytest.mark.parametrize(("interval", "window"), [
    (timedelta(seconds=300), timedelta(seconds=270)),
    (timedelta(seconds=10), timedelta(seconds=5)),
    (timedelta(hours=1), timedelta(minutes=59, seconds=30)),
])
def test_recent_means_within_the_interval_less_a_slack(interval: timedelta, window: timedelta) -> None:
    assert recent_window(interval) == window
    tick = timedelta(microseconds=1)
    assert is_recent(NOW - window + tick, now=NOW, interval=interval)
    assert not is_recent(NOW - window, now=NOW, interval=interval)
    assert not is_recent(None, now=NOW, interval=interval)


# -- wire ------------------------------------------------------------------------------------------------------


def test_retention_request_frame() -> None:
    frame = wire.retention_request("r-1", gc_cutoff=NOW - timedelta(milliseconds=90_000), gc_rows_threshold=5,
                                   gc_batch_size=1234, timeout_cutoff=None)
    assert json.loads(frame) == {"type": "retention", "request_id": "r-1", "body": {
        "gc_cutoff_epoch_ms": NOW_MS - 90_000, "gc_rows_threshold": 5, "gc_batch_size": 1234,
        "timeout_cutoff_epoch_ms": None}}


def test_retention_reply_is_parsed_and_validated() -> None:
    reply = wire.parse_reply('{"type": "retention", "request_id": "r-1", "success": true, "new_field": 1}')
    assert isinstance(reply, wire.RetentionReply) and reply.success
    with pytest.raises(ProtocolError, match="retention reply: .*success: Field required"):
        wire.parse_reply('{"type": "retention", "request_id": "r-1"}')


# -- storage ---------------------------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(make_engine(f"sqlite:///{tmp_path / 'relay.db'}"))


def _executor(store: Store, executor_id: str, version: str, created_min: int,
              status: ExecutorStatus = ExecutorStatus.HEALTHY) -> None:
    from sqlmodel import Session

    with Session(store.engine) as s:
        s.add(Executor(org="acme", app="shop", executor_id=executor_id, app_version=version, status=status,
                       gateway_queue=f"q-{executor_id}", created_at=NOW + timedelta(minutes=created_min)))
        s.commit()


def test_executor_selection_prefers_the_newest_version(store: Store) -> None:
    # v2's latest executor registered last, so v2 is the newest version, even though v1's x2 is newer than v2's y1.
    _executor(store, "y1", "v2", created_min=1)
    _executor(store, "x2", "v1", created_min=2)
    _executor(store, "y3", "v2", created_min=3)
    _executor(store, "z9", "v3", created_min=9, status=ExecutorStatus.DISCONNECTED)

    def pick(*exclude: str) -> str | None:
        found = store.select_retention_executor(org="acme", app="shop", exclude=list(exclude))
        return None if found is None else found[0]

    assert store.select_retention_executor(org="acme", app="shop", exclude=[]) == ("y3", "q-y3")
    assert pick("y3") == "y1"  # still v2: excluding an executor does not demote its version
    assert pick("y3", "y1") == "x2"
    assert pick("y3", "y1", "x2") is None


def test_targets_are_apps_with_a_setting_with_their_last_round(store: Store) -> None:
    from sqlmodel import Session

    settings: dict[tuple[str, str], dict[str, Any]] = {
        ("acme", "default"): {},  # gcRowsThreshold 1,000,000 by default
        ("acme", "nothing"): {"gc_rows_threshold": None},
        ("acme", "zero-rows"): {"gc_rows_threshold": 0},
        ("acme", "timeout"): {"gc_rows_threshold": None, "global_timeout": timedelta(hours=1)},
        ("other", "gc"): {"gc_rows_threshold": None, "gc_time_threshold": timedelta(days=7)},
    }
    with Session(store.engine) as s:
        for org, name in settings:
            s.add(Application(org=org, name=name))
        s.commit()
    for (org, name), changes in settings.items():
        # Cleared as the REST API clears them: inserting None would take the column default instead.
        store.update_app(org, name, changes, subject="test")
    store.write_retention_audit(org="acme", app="timeout", operation="retention.succeeded", event_key="k1",
                                status="success", executor_id="e1", details={}, started_at=NOW, request_id="r1")

    targets = {(app.org, app.name): last for app, last in store.list_retention_targets()}
    assert targets == {("acme", "default"): None, ("acme", "timeout"): NOW, ("other", "gc"): None}
    assert [app.name for app, _ in store.list_retention_targets("other")] == ["gc"]
    assert [app.name for app, _ in store.list_retention_targets("acme", "timeout")] == ["timeout"]
    assert store.list_retention_targets("acme", "nothing") == []


def test_retention_audit_lands_once_per_event_key_and_the_last_round_only_moves_forward(store: Store) -> None:
    for key, started in [("k1", NOW), ("k1", NOW + timedelta(hours=1)), ("k2", NOW - timedelta(hours=1))]:
        store.write_retention_audit(org="acme", app="shop", operation="retention.succeeded", event_key=key,
                                    status="success", executor_id="e1", details={}, started_at=started)
    assert [a.operation for a in store.list_audit("acme")] == ["retention.succeeded"] * 2
    store.ensure_app("acme", "shop")
    [(_, last)] = store.list_retention_targets()
    assert last == NOW  # not the retried k1's later time, nor k2's earlier one


def test_audit_details_show_the_body_as_sent_next_to_the_clock_and_settings() -> None:
    target = _target(gc_time_threshold=units.ms_to_timedelta(90_000), gc_rows_threshold=5,
                     global_timeout=units.ms_to_timedelta(7_200_000))
    cutoffs = retention_cutoffs(target, now=NOW, gc_batch_size=BATCH)
    details = audit_details(WriteRetentionAuditInput("acme", "shop", "retention.dispatched", "k", NOW,
                                                     target=target, cutoffs=cutoffs, details={"attempt": 1}))
    assert details == {
        "clock": NOW.isoformat(), "clock_epoch_ms": NOW_MS, "attempt": 1,
        "settings": {"gcTimeThresholdMs": 90_000, "gcRowsThreshold": 5, "globalTimeoutMs": 7_200_000},
        "body": {"gc_cutoff_epoch_ms": NOW_MS - 90_000, "gc_rows_threshold": 5, "gc_batch_size": BATCH,
                 "timeout_cutoff_epoch_ms": NOW_MS - 7_200_000},
    }


# -- the audit log's retention ------------------------------------------------------------------------------------


def _audit_rows(store: Store, ages: dict[str, timedelta], now: datetime = NOW) -> None:
    """One audit row per name, emitted ``age`` before ``now``, in orgs of their own (retention is every org's)."""
    from sqlmodel import Session

    with Session(store.engine) as s:
        for n, (name, age) in enumerate(ages.items()):
            s.add(AuditLog(id=name, org=f"org-{n % 3}", operation="app.registered", emit_time=now - age))
        s.commit()


def _left(store: Store) -> set[str]:
    from sqlmodel import Session, select

    with Session(store.engine) as s:
        return set(s.exec(select(AuditLog.id)).all())


def _deletes(store: Store) -> list[int]:
    """Records, for each DELETE on the audit log from now on, how many ids it named."""
    seen: list[int] = []

    @event.listens_for(store.engine, "before_cursor_execute")
    def _count(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool) -> None:
        if statement.lstrip().upper().startswith("DELETE FROM AUDITLOG"):
            seen.append(len(parameters))

    return seen


RETENTION = timedelta(days=7)


def test_audit_rows_older_than_the_retention_are_deleted_in_batches_oldest_first(store: Store) -> None:
    old = {f"old-{n}": RETENTION + timedelta(days=n, minutes=1) for n in range(7)}
    new = {"new-1": RETENTION - timedelta(minutes=1), "new-2": timedelta(0), "future": -timedelta(hours=1)}
    _audit_rows(store, {**old, **new})
    deletes = _deletes(store)
    before = NOW - RETENTION

    assert store.prune_audit_batch(before=before, limit=3) == 3
    assert _left(store) == set(old) - {"old-6", "old-5", "old-4"} | set(new)  # the oldest three went first
    assert store.prune_audit_batch(before=before, limit=3) == 3
    assert store.prune_audit_batch(before=before, limit=3) == 1  # short: none older left
    assert store.prune_audit_batch(before=before, limit=3) == 0
    assert _left(store) == set(new)
    assert deletes == [3, 3, 1]  # one DELETE per batch, never more rows than the batch, none when nothing is left


def test_the_pruning_activity_loops_over_batches_counts_and_logs_once(store: Store,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    _audit_rows(store, {f"old-{n}": RETENTION + timedelta(hours=n + 1) for n in range(7)} | {"new": timedelta(0)})
    deletes = _deletes(store)
    counted = metrics.REGISTRY.get_sample_value("relay_audit_rows_pruned_total") or 0.0
    prune = RetentionActivities(store).prune_audit_log
    with caplog.at_level(logging.INFO, logger="relay.worker"):
        pruned = asyncio.run(ActivityEnvironment().run(prune, PruneAuditLogInput(NOW - RETENTION, batch_size=3)))
    assert pruned == 7 and deletes == [3, 3, 1] and _left(store) == {"new"}
    assert (metrics.REGISTRY.get_sample_value("relay_audit_rows_pruned_total") or 0.0) - counted == 7
    [line] = [r.getMessage() for r in caplog.records if r.name == "relay.worker"]
    assert line == f"audit log: 7 rows emitted before {(NOW - RETENTION).isoformat()} deleted"

    caplog.clear()  # nothing to prune: no line
    assert asyncio.run(ActivityEnvironment().run(prune, PruneAuditLogInput(NOW - RETENTION, batch_size=3))) == 0
    assert [r for r in caplog.records if r.name == "relay.worker"] == []


def test_the_pruning_activity_stops_after_its_budget(store: Store, caplog: pytest.LogCaptureFixture) -> None:
    _audit_rows(store, {f"old-{n}": RETENTION + timedelta(hours=n + 1) for n in range(7)})
    prune = RetentionActivities(store).prune_audit_log
    with caplog.at_level(logging.INFO, logger="relay.worker"):
        pruned = asyncio.run(ActivityEnvironment().run(
            prune, PruneAuditLogInput(NOW - RETENTION, batch_size=3, budget=timedelta(0))))
    assert pruned == 3 and len(_left(store)) == 4  # one batch, the rest for the next round
    assert [r.getMessage() for r in caplog.records if r.name == "relay.worker"][0].endswith(
        "deleted; more are left for the next round")


# -- workflows on the time-skipping server ---------------------------------------------------------------------

INTERVAL = timedelta(minutes=10)
REPLY_TIMEOUT = timedelta(seconds=20)
RESULT_WALL_TIMEOUT = timedelta(seconds=20)


@dataclass
class Dispatch:
    input: DispatchRetentionInput
    task_queue: str
    scheduled: datetime


@dataclass
class FakeRetention:
    """Fake activities under the real names. Executors per app in preference order; replies scripted per
    executor (popped; then success)."""

    task_queue: str
    targets: list[RetentionTarget] = field(default_factory=list)
    executors: dict[str, list[str]] = field(default_factory=dict)
    replies: dict[str, list[RetentionReply | Exception]] = field(default_factory=dict)
    hold: dict[str, asyncio.Event] = field(default_factory=dict)  # executor id -> dispatch waits for it
    selects: list[SelectRetentionExecutorInput] = field(default_factory=list)
    audits: list[WriteRetentionAuditInput] = field(default_factory=list)
    dispatches: list[Dispatch] = field(default_factory=list)
    # What each executor's SDK answers to ``list_application_versions`` (none: an empty list).
    versions: dict[str, list[dict[str, object]]] = field(default_factory=dict)
    asked_versions: list[str] = field(default_factory=list)
    # The audit log's retention: each call's input; the real activity on this store when set (else nothing pruned).
    prunes: list[PruneAuditLogInput] = field(default_factory=list)
    audit_store: Store | None = None

    def queue(self, executor_id: str) -> str:
        return f"{self.task_queue}-gw-{executor_id}"

    def all_executor_ids(self) -> list[str]:
        return sorted({e for ids in self.executors.values() for e in ids})

    def ops(self, app: str) -> list[tuple[str, str | None]]:
        return [(a.operation, a.executor_id) for a in self.audits if a.app == app]

    @activity.defn(name=Activity.LIST_RETENTION_TARGETS)
    async def list_retention_targets(self, input: ListRetentionTargetsInput) -> list[RetentionTarget]:
        return [t for t in self.targets if input.app in (None, t.app) and input.org in (None, t.org)]

    @activity.defn(name=Activity.SELECT_RETENTION_EXECUTOR)
    async def select_retention_executor(self, input: SelectRetentionExecutorInput) -> Candidate | None:
        self.selects.append(input)
        left = [e for e in self.executors.get(input.app, []) if e not in input.exclude]
        return Candidate(left[0], self.queue(left[0])) if left else None

    @activity.defn(name=Activity.WRITE_RETENTION_AUDIT)
    async def write_retention_audit(self, input: WriteRetentionAuditInput) -> None:
        if all(a.event_key != input.event_key for a in self.audits):
            self.audits.append(input)

    @activity.defn(name=Activity.PRUNE_AUDIT_LOG)
    async def prune_audit_log(self, input: PruneAuditLogInput) -> int:
        self.prunes.append(input)
        if self.audit_store is None:
            return 0
        return await RetentionActivities(self.audit_store).prune_audit_log(input)

    @activity.defn(name=Activity.EXECUTOR_REQUEST)
    async def executor_request(self, input: ExecutorRequestInput) -> ExecutorRequestReply:
        assert json.loads(input.frame)["type"] == "list_application_versions"
        self.asked_versions.append(input.executor_id)
        return ExecutorRequestReply(reply_z=pack({"output": self.versions.get(input.executor_id, []),
                                                  "error_message": None}))

    @activity.defn(name=Activity.DISPATCH_RETENTION)
    async def dispatch_retention(self, input: DispatchRetentionInput) -> RetentionReply:
        info = activity.info()
        self.dispatches.append(Dispatch(input, info.task_queue, info.current_attempt_scheduled_time))
        if input.executor_id in self.hold:
            await self.hold[input.executor_id].wait()
        script = self.replies.get(input.executor_id)
        answer = script.pop(0) if script else RetentionReply(True)
        if isinstance(answer, Exception):
            raise answer
        return answer


@dataclass
class Env:
    env: WorkflowEnvironment
    fakes: FakeRetention

    async def round(self) -> RetentionRoundResult:
        handle = await self.env.client.start_workflow(
            RetentionWorkflow.run, RetentionInput(INTERVAL, gc_batch_size=BATCH, reply_timeout=REPLY_TIMEOUT),
            id=f"round-{uuid.uuid4()}", task_queue=self.fakes.task_queue,
        )
        return await _bounded(handle.result())

    def child(self, app: str) -> WorkflowHandle[AppRetentionWorkflow, AppRetentionResult]:
        return self.env.client.get_workflow_handle_for(AppRetentionWorkflow.run,
                                                       app_retention_workflow_id("acme", app))

    async def app_result(self, app: str) -> AppRetentionResult:
        """The result of the app's round started by a round. Time does not skip while waiting for it (only a
        handle from ``start_workflow`` unlocks skipping): use ``run_app`` when the round needs timers."""
        return await _bounded(self.child(app).result())

    async def run_app(self, target: RetentionTarget) -> AppRetentionResult:
        """One app's round on its own, as a round would start it, skipping time while it runs."""
        handle = await self.env.client.start_workflow(
            AppRetentionWorkflow.run,
            AppRetentionInput(target, interval=INTERVAL, gc_batch_size=BATCH, reply_timeout=REPLY_TIMEOUT),
            id=app_retention_workflow_id(target.org, target.app), task_queue=self.fakes.task_queue,
        )
        return await _bounded(handle.result())


async def _bounded(waiting: Awaitable[T]) -> T:
    return await asyncio.wait_for(waiting, RESULT_WALL_TIMEOUT.total_seconds())


async def _time_skipping_server() -> WorkflowEnvironment:
    return await WorkflowEnvironment.start_time_skipping(
        test_server_existing_path=str(venv_binary("temporal-test-server")), data_converter=data_converter,
    )


@pytest.fixture(scope="module")
async def apps_env() -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping server for one app's rounds. Not the session's: a test elsewhere that leaves the server's
    time-skipping lock held would make these timers run at wall speed."""
    env = await _time_skipping_server()
    try:
        yield env
    finally:
        await env.shutdown()


@pytest.fixture(scope="module")
async def rounds_env() -> AsyncIterator[WorkflowEnvironment]:
    """A time-skipping server for whole rounds, kept apart from ``apps_env``: a child workflow started by a
    workflow leaves the test server's time-skipping lock held (temporal-test-server 1.40), after which every timer
    on that server runs at wall speed. Round tests therefore use no timers."""
    env = await _time_skipping_server()
    try:
        yield env
    finally:
        await env.shutdown()


@asynccontextmanager
async def _workers(env: WorkflowEnvironment) -> AsyncIterator[Env]:
    """Workers for one test: workflows and database fakes on a uuid queue, one gateway queue per executor."""
    fakes = FakeRetention(task_queue=f"retention-test-{uuid.uuid4()}")
    client = env.client
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(Worker(
            client, task_queue=fakes.task_queue, workflows=[RetentionWorkflow, AppRetentionWorkflow],
            activities=[fakes.list_retention_targets, fakes.select_retention_executor, fakes.write_retention_audit,
                        fakes.prune_audit_log],
        ))
        for executor_id in EXECUTORS:
            await stack.enter_async_context(Worker(client, task_queue=fakes.queue(executor_id),
                                                   activities=[fakes.dispatch_retention, fakes.executor_request]))
        try:
            yield Env(env, fakes)
        finally:
            for event in fakes.hold.values():
                event.set()  # nothing left waiting in a fake


EXECUTORS = ("e1", "e2", "slow")


@pytest.fixture
async def ts(apps_env: WorkflowEnvironment) -> AsyncIterator[Env]:
    """One app's round at a time (``run_app``)."""
    async with _workers(apps_env) as env:
        yield env


@pytest.fixture
async def ts_rounds(rounds_env: WorkflowEnvironment) -> AsyncIterator[Env]:
    """Whole rounds (``round``), on this module's own server."""
    async with _workers(rounds_env) as env:
        yield env


def _app(name: str, **settings: Any) -> RetentionTarget:
    return RetentionTarget("acme", f"{name}-{uuid.uuid4().hex[:8]}", **settings)


async def test_a_round_messages_each_app_with_a_setting_once_with_its_cutoffs(ts_rounds: Env) -> None:
    full = _app("full", gc_time_threshold=timedelta(milliseconds=90_000), gc_rows_threshold=5,
                global_timeout=timedelta(hours=2))
    rows = _app("rows", gc_rows_threshold=1_000_000)
    nothing = _app("nothing")
    zero = _app("zero", gc_rows_threshold=0)
    ts_rounds.fakes.targets = [full, rows, nothing, zero]
    for t in ts_rounds.fakes.targets:
        ts_rounds.fakes.executors[t.app] = ["e1"]
    before = await ts_rounds.env.get_current_time()

    result = await ts_rounds.round()
    assert result == RetentionRoundResult(started=[f"acme/{full.app}", f"acme/{rows.app}"])
    assert await ts_rounds.app_result(full.app) == AppRetentionResult("SUCCEEDED", "e1", attempts=1)
    assert await ts_rounds.app_result(rows.app) == AppRetentionResult("SUCCEEDED", "e1", attempts=1)
    after = await ts_rounds.env.get_current_time()

    sent = {d.input.request_id: d for d in ts_rounds.fakes.dispatches}
    assert len(sent) == 2 and {d.task_queue for d in sent.values()} == {ts_rounds.fakes.queue("e1")}
    # The gateway finds the socket by org, app and executor id.
    assert {(d.input.org, d.input.app) for d in sent.values()} == {("acme", full.app), ("acme", rows.app)}
    [dispatched] = [a for a in ts_rounds.fakes.audits if a.app == full.app and a.operation == "retention.dispatched"]
    clock = dispatched.clock
    assert before - timedelta(seconds=1) <= clock <= after + timedelta(seconds=1)
    cutoffs = sent[dispatched.details["request_id"]].input.cutoffs
    assert cutoffs.gc_cutoff == clock - timedelta(milliseconds=90_000)
    assert cutoffs.timeout_cutoff == clock - timedelta(hours=2)
    assert (cutoffs.gc_rows_threshold, cutoffs.gc_batch_size) == (5, BATCH)
    assert ts_rounds.fakes.ops(full.app) == [("retention.dispatched", "e1"), ("retention.succeeded", "e1")]
    [succeeded] = [a for a in ts_rounds.fakes.audits if a.app == full.app and a.operation == "retention.succeeded"]
    assert succeeded.started_at == clock and succeeded.cutoffs == cutoffs
    assert ts_rounds.fakes.ops(nothing.app) == [] and ts_rounds.fakes.ops(zero.app) == []
    assert {s.app for s in ts_rounds.fakes.selects} == {full.app, rows.app}

    # Deterministic: the recorded histories replay.
    replayer = Replayer(workflows=[RetentionWorkflow, AppRetentionWorkflow], data_converter=data_converter)
    await replayer.replay_workflow(await ts_rounds.child(full.app).fetch_history())


async def test_failure_and_timeout_move_on_to_another_executor_with_backoff(ts: Env) -> None:
    app = _app("flaky", gc_time_threshold=timedelta(days=1))
    ts.fakes.targets = [app]
    ts.fakes.executors[app.app] = ["e1", "e2"]
    timeout = ApplicationError("executor e1 did not answer within 0:00:20", type="ExecutorTimeoutError",
                               non_retryable=True)
    ts.fakes.replies = {"e1": [timeout], "e2": [RetentionReply(False, "busy")]}

    assert await ts.run_app(app) == AppRetentionResult("SUCCEEDED", "e1", attempts=3)

    assert ts.fakes.ops(app.app) == [
        ("retention.dispatched", "e1"), ("retention.failed", "e1"),
        ("retention.dispatched", "e2"), ("retention.failed", "e2"),
        ("retention.dispatched", "e1"), ("retention.succeeded", "e1"),  # every one failed once: all again
    ]
    failed = [a.details["reason"] for a in ts.fakes.audits if a.operation == "retention.failed"]
    assert "did not answer" in failed[0] and "success=false: busy" in failed[1]
    # First the executor asked for the latest version, then one per attempt.
    assert [s.exclude for s in ts.fakes.selects] == [[], [], ["e1"], ["e1", "e2"], []]
    gaps = [b.scheduled - a.scheduled for a, b in zip(ts.fakes.dispatches, ts.fakes.dispatches[1:], strict=False)]
    assert timedelta(seconds=1) <= gaps[0] < timedelta(seconds=1.3)  # backoff 1 s (+ up to 20 % jitter)
    # Backoff 2 s after e2 failed, then none left: 4 s more before trying them all again.
    assert timedelta(seconds=6) <= gaps[1] < timedelta(seconds=7.5)
    # One clock for the whole app round: every attempt sends the same cutoffs.
    assert len({json.dumps(str(d.input.cutoffs)) for d in ts.fakes.dispatches}) == 1
    assert len({d.input.request_id for d in ts.fakes.dispatches}) == 3


async def test_the_latest_version_is_the_one_the_sdk_reports(ts: Env) -> None:
    """The executor registered last runs v1, but the SDK says v2 is latest (``set_latest_application_version``):
    the round goes to v2's executor."""
    app = _app("versions", gc_time_threshold=timedelta(days=1))
    ts.fakes.targets = [app]
    ts.fakes.executors[app.app] = ["e1", "e2"]  # the fake picks the first one left unless told the latest
    ts.fakes.versions = {"e1": [{"version_id": "a", "version_name": "v1", "version_timestamp": 100},
                                {"version_id": "b", "version_name": "v2", "version_timestamp": 200}]}
    assert await ts.run_app(app) == AppRetentionResult("SUCCEEDED", "e1", attempts=1)
    assert ts.fakes.asked_versions == ["e1"]
    assert [s.latest for s in ts.fakes.selects] == [None, "v2"]


async def test_no_healthy_executor_skips_the_app_for_this_round(ts_rounds: Env) -> None:
    app = _app("alone", gc_rows_threshold=10)
    ts_rounds.fakes.targets = [app]
    await ts_rounds.round()
    result = await ts_rounds.app_result(app.app)
    assert (result.outcome, result.reason) == ("SKIPPED", "no HEALTHY executor")
    assert ts_rounds.fakes.ops(app.app) == [("retention.skipped", None)]
    assert ts_rounds.fakes.audits[0].status == "failure" and ts_rounds.fakes.dispatches == []


async def test_a_recent_round_is_not_repeated(ts_rounds: Env) -> None:
    now = await ts_rounds.env.get_current_time()
    recent = _app("recent", gc_rows_threshold=10, last_started_at=now - recent_window(INTERVAL) + timedelta(minutes=1))
    due = _app("due", gc_rows_threshold=10, last_started_at=now - recent_window(INTERVAL) - timedelta(seconds=1))
    ts_rounds.fakes.targets = [recent, due]
    ts_rounds.fakes.executors = {recent.app: ["e1"], due.app: ["e2"]}

    await ts_rounds.round()
    assert (await ts_rounds.app_result(recent.app)).outcome == "SKIPPED"
    assert (await ts_rounds.app_result(due.app)).outcome == "SUCCEEDED"
    [skipped] = [a for a in ts_rounds.fakes.audits if a.app == recent.app]
    assert (skipped.operation, skipped.status) == ("retention.skipped", "success")
    assert "is recent" in skipped.details["reason"]
    assert [d.input.executor_id for d in ts_rounds.fakes.dispatches] == ["e2"]


async def test_an_app_round_reads_its_app_afresh(ts: Env) -> None:
    now = await ts.env.get_current_time()
    listed = _app("raced", gc_rows_threshold=10)  # as the round listed it: never run
    ts.fakes.targets = [dataclasses.replace(listed, last_started_at=now)]  # the previous round just recorded
    ts.fakes.executors[listed.app] = ["e1"]
    assert (await ts.run_app(listed)).outcome == "SKIPPED"
    assert ts.fakes.dispatches == [] and "is recent" in ts.fakes.audits[0].details["reason"]

    gone = _app("gone", gc_rows_threshold=10)  # deleted, or its settings cleared, since the round listed it
    ts.fakes.executors[gone.app] = ["e1"]
    assert await ts.run_app(gone) == AppRetentionResult("NOTHING_SET")
    assert ts.fakes.ops(gone.app) == [] and ts.fakes.dispatches == []


async def test_an_app_that_never_starts_gives_up_before_the_next_round(ts: Env) -> None:
    app = _app("broken", gc_rows_threshold=10)
    ts.fakes.targets = [app]
    ts.fakes.executors[app.app] = ["e1"]
    ts.fakes.replies = {"e1": [RetentionReply(False, "no")] * 100}

    result = await ts.run_app(app)
    assert result.outcome == "SKIPPED" and "no executor started the round" in (result.reason or "")
    window = recent_window(INTERVAL)
    assert ts.fakes.dispatches[-1].scheduled - ts.fakes.dispatches[0].scheduled <= window
    assert 5 <= result.attempts <= 12  # backoff 1, 2, 4, ... capped at 30 s, within the 5 min window
    assert ts.fakes.ops(app.app)[-1] == ("retention.skipped", None)


async def test_a_slow_app_delays_neither_another_app_nor_the_next_round(ts_rounds: Env) -> None:
    slow = _app("slow", gc_rows_threshold=10)
    fast = _app("fast", gc_rows_threshold=10)
    ts_rounds.fakes.targets = [slow, fast]
    ts_rounds.fakes.executors = {slow.app: ["slow"], fast.app: ["e1"]}
    ts_rounds.fakes.hold["slow"] = asyncio.Event()

    first = await ts_rounds.round()  # returns with the slow app's dispatch still in flight
    assert first.started == [f"acme/{slow.app}", f"acme/{fast.app}"]
    assert await ts_rounds.app_result(fast.app) == AppRetentionResult("SUCCEEDED", "e1", attempts=1)

    def slow_in_flight() -> None:
        assert [d.input.executor_id for d in ts_rounds.fakes.dispatches].count("slow") == 1

    await assert_eventually(slow_in_flight)
    second = await ts_rounds.round()  # the fast app's next round starts; the slow one's previous still runs
    assert second == RetentionRoundResult(started=[f"acme/{fast.app}"], still_running=[f"acme/{slow.app}"])
    assert ts_rounds.fakes.ops(slow.app) == [("retention.dispatched", "slow"), ("retention.skipped", None)]
    [skipped] = [a for a in ts_rounds.fakes.audits if a.app == slow.app and a.operation == "retention.skipped"]
    assert "still running" in skipped.details["reason"]

    ts_rounds.fakes.hold["slow"].set()
    assert (await ts_rounds.app_result(slow.app)).outcome == "SUCCEEDED"
    assert (await ts_rounds.app_result(fast.app)).outcome == "SUCCEEDED"



async def test_a_round_prunes_the_audit_log_by_its_own_clock(ts_rounds: Env, tmp_path: Path) -> None:
    store = Store(make_engine(f"sqlite:///{tmp_path / 'relay.db'}"))
    ts_rounds.fakes.audit_store = store  # the real activity behind the fake's name
    now = await ts_rounds.env.get_current_time()  # the test server's clock, years ahead of the wall's
    _audit_rows(store, {"older": RETENTION + timedelta(days=30), "old": RETENTION + timedelta(hours=1),
                        "kept": RETENTION - timedelta(hours=1), "new": timedelta(0)}, now=now)
    handle = await ts_rounds.env.client.start_workflow(
        RetentionWorkflow.run, RetentionInput(INTERVAL, gc_batch_size=BATCH, reply_timeout=REPLY_TIMEOUT,
                                              audit_retention=RETENTION),
        id=f"round-{uuid.uuid4()}", task_queue=ts_rounds.fakes.task_queue,
    )
    result = await _bounded(handle.result())
    after = await ts_rounds.env.get_current_time()
    try:
        [prune] = ts_rounds.fakes.prunes
        # From the round's clock (the workflow's, not the worker's wall clock), less the retention.
        assert now - RETENTION - timedelta(seconds=1) <= prune.before <= after - RETENTION + timedelta(seconds=1)
        assert result == RetentionRoundResult(audit_rows_pruned=2)
        assert _left(store) == {"kept", "new"}
    finally:
        store.engine.dispose()
    # Deterministic: this history (with the patch's marker) replays, as the one recorded before the patch does
    # (tests/histories/before-audit-retention/, replayed by test_replay.py).
    replayer = Replayer(workflows=[RetentionWorkflow, AppRetentionWorkflow], data_converter=data_converter)
    await replayer.replay_workflow(await handle.fetch_history())


def test_the_schedule_carries_the_audit_retention_setting() -> None:
    action = retention_schedule(Settings(audit_retention_days=30)).action
    assert isinstance(action, ScheduleActionStartWorkflow)
    [argument] = action.args
    assert isinstance(argument, RetentionInput) and argument.audit_retention == timedelta(days=30)
