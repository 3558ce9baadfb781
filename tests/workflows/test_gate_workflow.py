"""The lifecycle workflow at the recovery gate, on the time-skipping server: the real gate activity
(``activities.gate``) on a real SQLite store, the other activities faked (``tests.lifecycle_fakes``). A DEAD
executor waits (on timers) while its app's recovery is paused and is recovered when the pause ends; the dead
executors of a storm are recovered one per pace; and the histories these runs make replay on the same code."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
from sqlmodel import Session
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, Worker

from activities.gate import GateActivities
from core.gate import GatePolicy
from core.models import Executor, make_engine
from core.store import Store
from core.temporal import data_converter
from tests.conftest import assert_eventually
from tests.lifecycle_fakes import APP, DEAD, DISCONNECTED, GRACE, HEALTHY, ORG, VERSION, FakeRelay, Relay
from worker import workflow_runner
from workflows.contracts.common import ExecutorStatus
from workflows.lifecycle import ExecutorLifecycleWorkflow

PACE = timedelta(seconds=30)
POLICY = GatePolicy(storm_share=0.5, storm_min=3, window=timedelta(minutes=5), pace=PACE,
                    pause_recheck=timedelta(minutes=10))


@dataclass
class GatedRelay:
    env: WorkflowEnvironment
    fakes: FakeRelay
    store: Store

    def relay(self, executor_id: str | None = None) -> Relay:
        return Relay(self.env, self.fakes, executor_id=executor_id or f"exec-{uuid.uuid4()}")

    async def register(self, executor_id: str, status: ExecutorStatus) -> None:
        """The registry row the real ``record_status`` would write (the fakes do not write the store), stamped
        with the test server's clock, which the workflows' requests to the gate carry."""
        now = await self.env.get_current_time()
        with Session(self.store.engine) as s:
            s.add(Executor(org=ORG, app=APP, executor_id=executor_id, app_version=VERSION, status=status,
                           gateway_queue="q", created_at=now, updated_at=now))
            s.commit()


@pytest.fixture
async def gated(time_skipping_env: WorkflowEnvironment, tmp_path: Path) -> AsyncIterator[GatedRelay]:
    client = time_skipping_env.client
    store = Store(make_engine(f"sqlite:///{tmp_path / 'relay.db'}"))
    store.ensure_app(ORG, APP)
    fakes = FakeRelay(task_queue=f"relay-gate-{uuid.uuid4()}", clock=time_skipping_env.get_current_time)
    fakes.gate = GateActivities(store, POLICY).admit_recovery  # the real gate, also where DEAD is declared
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(Worker(
            client, task_queue=fakes.task_queue, workflows=[ExecutorLifecycleWorkflow],
            activities=[*(a for a in fakes.db_activities() if a != fakes.admit_recovery), fakes.gate],
            workflow_runner=workflow_runner(client.data_converter)))  # the worker's sandbox, as in production
        for peer in fakes.peers:
            await stack.enter_async_context(
                Worker(client, task_queue=peer.gateway_queue, activities=fakes.gateway_activities()))
        await stack.enter_async_context(
            Worker(client, task_queue=fakes.self_queue, activities=fakes.self_gateway_activities()))
        yield GatedRelay(time_skipping_env, fakes, store)
    store.engine.dispose()


async def _dies(relay: Relay) -> None:
    await relay.connect("c1")
    await assert_recorded(relay, "executor.healthy")
    await relay.disconnect("c1")


async def assert_recorded(relay: Relay, operation: str) -> None:
    def check() -> None:
        assert any(c.input.operation == operation and c.input.executor_id == relay.executor_id
                   for c in relay.fakes.records)

    await assert_eventually(check)


async def _timer_summaries(relay: Relay) -> list[str]:
    out = []
    async for event in relay.latest.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_TIMER_STARTED:
            out.append(json.loads(event.user_metadata.summary.data))
    return out


async def test_a_dead_executor_waits_out_a_pause_and_is_recovered_when_it_ends(gated: GatedRelay) -> None:
    relay = gated.relay()
    start = await gated.env.get_current_time()
    pause_end = start + timedelta(hours=1)
    gated.store.set_pause(org=ORG, app=APP, until=pause_end, reason="maintenance", subject="system", source_ip="",
                          details={})
    await _dies(relay)

    result = await relay.result()  # time skips through the grace and the pause

    assert result.status == "RECOVERED"
    assert gated.fakes.statuses() == [HEALTHY, DISCONNECTED, DEAD]
    [dispatch] = gated.fakes.dispatches
    dead_at = gated.fakes.records[2].scheduled
    assert dead_at < pause_end <= dispatch.scheduled  # DEAD on time, recovered only once the pause was over
    assert dispatch.scheduled - pause_end < timedelta(minutes=1)
    summaries = await _timer_summaries(relay)
    # The wait is on Temporal timers (durable, visible): one per look, at most RELAY_RECOVERY_PAUSE_RECHECK apart.
    held = [s for s in summaries if s == "recovery held: paused"]
    assert len(held) == 6, summaries
    # The history of the gated path replays on the same code.
    history = await relay.latest.fetch_history()
    replayer = Replayer(workflows=[ExecutorLifecycleWorkflow], data_converter=data_converter)
    replay = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert replay.replay_failure is None


async def test_storm_recoveries_go_one_per_pace(gated: GatedRelay) -> None:
    relays = [gated.relay(f"storm-{n}") for n in range(4)]
    # The registry as the real activities would leave it: 4 of 6 executors down together (3 are enough to trip).
    for relay in relays:
        await gated.register(relay.executor_id, ExecutorStatus.DISCONNECTED)
    for n in range(2):
        await gated.register(f"survivor-{n}", ExecutorStatus.HEALTHY)
    for relay in relays:
        await _dies(relay)

    # One workflow's result at a time: the test server's time skipping does not take several waiting at once.
    await gated.env.sleep(GRACE + 4 * PACE)
    results = [await relay.result() for relay in relays]

    assert [r.status for r in results] == ["RECOVERED"] * 4
    times = sorted(c.scheduled for c in gated.fakes.dispatches)
    assert len(times) == 4
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert all(gap >= PACE - timedelta(seconds=1) for gap in gaps), gaps  # the test server's clock is coarse
    assert times[-1] - times[0] < 3 * PACE + timedelta(seconds=10)  # and no slower than the pace either
    pause, gate, waiting = gated.store.recovery_state(ORG, APP)
    assert pause is None and waiting == [] and gate is not None and gate.trips == 1


async def test_grace_still_counts_while_paused(gated: GatedRelay) -> None:
    """A pause holds recovery only: the executor still goes DEAD after its grace, on time."""
    relay = gated.relay()
    start = await gated.env.get_current_time()
    gated.store.set_pause(org=ORG, app=APP, until=start + timedelta(hours=2), reason="", subject="system",
                          source_ip="", details={})
    await _dies(relay)
    await relay.env.sleep(GRACE + timedelta(minutes=5))
    await relay.wait_statuses(HEALTHY, DISCONNECTED, DEAD)
    assert gated.fakes.dispatches == []
    [ticket] = gated.store.recovery_state(ORG, APP)[2]
    assert (ticket.executor_id, ticket.held, ticket.paused) == (relay.executor_id, "paused", True)
    await relay.stop()
