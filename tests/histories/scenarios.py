"""The paths whose histories are recorded as replay fixtures (``record.py`` runs them; ``test_replay`` replays).

Each scenario drives a workflow on the time-skipping server with the fakes of ``tests/lifecycle_fakes.py`` and
checks that it took the path it is named after, raising ``ScenarioError`` otherwise, so that a fixture never
records a path other than the one its name promises.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta

from temporalio import activity
from temporalio.common import TypedSearchAttributes
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from tests.lifecycle_fakes import (
    APP,
    DEAD,
    DISCONNECTED,
    GRACE,
    HEALTHY,
    ORG,
    RECONNECTED,
    RECOVERY_TIMEOUT,
    SUPERSEDED,
    VERSION,
    FakeRelay,
    Relay,
)
from workflows.contracts.common import Activity, ExecutorStatus, gateway_workflow_id, lifecycle_search_attributes
from workflows.contracts.gateway_watch import (
    DisconnectGatewayInput,
    DisconnectGatewayResult,
    GatewayGoneInput,
    GatewayGoneReply,
    GatewayInput,
    HoldGatewayInput,
    ProbeGatewayInput,
    ProbeGatewayReply,
)
from workflows.contracts.lifecycle import (
    ExistPendingReply,
    LifecycleInput,
    LifecycleResult,
    PeerAvailableSignal,
    RecoveryReply,
)
from workflows.contracts.orphans import OrphanInfo
from workflows.gateway_watch import GatewayWorkflow
from workflows.lifecycle import ExecutorLifecycleWorkflow
from workflows.recovery import BLOCKED_RECHECK
from workflows.timing import FENCE_LEAD

LOWERED_SIGNAL_BUDGET = 3


class ScenarioError(Exception):
    """A scenario did not take the path it is named after: nothing of it is written."""


def check(condition: bool, what: str) -> None:
    if not condition:
        raise ScenarioError(what)


@dataclass
class Lifecycle:
    """One executor's lifecycle workflow, started as the gateway starts it: with Relay's search attributes, so
    the history has the status upserts that production histories have."""

    env: WorkflowEnvironment
    fakes: FakeRelay
    relay: Relay

    async def connect(self, connection_id: str, *, signal_id: str | None = None) -> None:
        relay = self.relay
        signal = relay.connected_signal(connection_id, signal_id=signal_id)
        handle = await self.env.client.start_workflow(
            ExecutorLifecycleWorkflow.run,
            LifecycleInput(ORG, APP, relay.executor_id, recovery_timeout=RECOVERY_TIMEOUT),
            id=relay.workflow_id,
            task_queue=self.fakes.task_queue,
            start_signal="connected",
            start_signal_args=[signal],
            search_attributes=_search_attributes(relay.executor_id, ExecutorStatus.HEALTHY.value),
        )
        relay.started = relay.started or handle

    async def healthy(self, connection_id: str) -> None:
        """Wait until the workflow has recorded ``connection_id`` HEALTHY (the write completed, not just began),
        so that a disconnect sent next cannot land during the write: that race is a path of its own."""
        for _ in range(500):
            state = await self.relay.state()
            if (state.status, state.recorded_connection_id) == ("HEALTHY", connection_id):
                return
            await asyncio.sleep(0.02)
        raise ScenarioError(f"{connection_id} never recorded HEALTHY: {self.fakes.statuses()}")

    async def die(self) -> LifecycleResult:
        """Connect, disconnect, and let the grace run out: the workflow's result."""
        await self.connect("c1")
        await self.healthy("c1")
        await self.relay.disconnect("c1")
        return await self.relay.result()

    async def die_blocked(self) -> None:
        """Connect, disconnect, die with no peer HEALTHY: until the blocked alert is written."""
        self.fakes.peers_available = False
        await self.connect("c1", signal_id="s1")
        await self.healthy("c1")
        await self.relay.disconnect("c1", signal_id="d1")
        await self.env.sleep(GRACE + timedelta(seconds=5))
        await self.relay.wait_statuses(HEALTHY, DISCONNECTED, DEAD)
        for _ in range(500):
            if "executor.recovery.blocked" in self.fakes.audits():
                return
            await asyncio.sleep(0.02)
        raise ScenarioError(f"no blocked alert: {self.fakes.audits()}")

    async def peer_available(self) -> None:
        await self.relay.latest.signal(ExecutorLifecycleWorkflow.peer_available,
                                       PeerAvailableSignal("peer-a", VERSION))

    async def second_run(self) -> None:
        assert self.relay.started is not None
        first = self.relay.started.result_run_id
        for _ in range(500):
            if (await self.relay.latest.describe()).run_id != first:
                return
            await asyncio.sleep(0.02)
        raise ScenarioError("the run did not continue-as-new")


def _search_attributes(executor_id: str, status: str | None = None) -> TypedSearchAttributes:
    # As the gateway's start (status HEALTHY) and the orphan sweep's (none) set them: RelayOrg present is what makes
    # the workflow upsert its status.
    return lifecycle_search_attributes(ORG, APP, executor_id, VERSION, status)


def expect(result: LifecycleResult, status: str, *, attempts: int | None = None, by: str | None = None) -> None:
    check(result.status == status, f"ended {result}, expected {status}")
    check(attempts is None or result.attempts == attempts, f"{result.attempts} attempts, expected {attempts}")
    check(by is None or result.recovered_by == by, f"recovered by {result.recovered_by}, expected {by}")


async def happy_recovery(lc: Lifecycle) -> None:
    """Connect, disconnect, the grace runs out: DEAD, dispatch, confirm, delete."""
    expect(await lc.die(), "RECOVERED", attempts=1, by="peer-a")


async def recovered_via_its_own_gateway(lc: Lifecycle) -> None:
    """The peer is on the dead executor's own gateway, which looks for its socket as it sends the request: no probe
    right before it (lifecycle generation 6)."""
    fakes = lc.fakes
    fakes.candidate_script.append(fakes.self_peer)
    expect(await lc.die(), "RECOVERED", attempts=1, by=fakes.self_peer.executor_id)
    check(len(fakes.probes) == 1 and fakes.dispatches[0].input.look, f"calls {fakes.summary()}")


async def called_off_by_the_sending_gateway(lc: Lifecycle) -> None:
    """The peer is on the dead executor's own gateway, where the executor holds a live socket again: the gateway
    answers with it instead of sending, and the recovery is called off; HEALTHY again."""
    fakes = lc.fakes
    fakes.candidate_script.append(fakes.self_peer)
    fakes.alive_here = lc.relay.connected_signal("c2")
    await lc.connect("c1")
    await lc.healthy("c1")
    await lc.relay.disconnect("c1")
    await lc.env.sleep(GRACE + timedelta(seconds=5))
    await lc.relay.wait_statuses(HEALTHY, DISCONNECTED, DEAD, RECONNECTED)
    check(fakes.audits()[-1] == "executor.recovery.cancelled" and "executor.recovery.dispatched" not in fakes.audits(),
          f"audits {fakes.audits()}")
    await lc.relay.remove()
    expect(await lc.relay.result(), "REMOVED")


async def held_then_recovered(lc: Lifecycle) -> None:
    """The recovery gate holds the recovery twice (an operator's pause, then the storm breaker's pacing): each
    time the workflow waits on a timer and asks again, about the same death; then it recovers."""
    lc.fakes.gate_holds = [("paused", timedelta(minutes=5)), ("paced", timedelta(seconds=5))]
    expect(await lc.die(), "RECOVERED", attempts=1, by="peer-a")
    tickets = {call.input.ticket for call in lc.fakes.admissions}
    check(len(lc.fakes.admissions) == 3 and len(tickets) == 1, f"admissions {lc.fakes.admissions}")
    check(lc.fakes.dispatches[0].scheduled - lc.fakes.admissions[0].scheduled >= timedelta(minutes=5, seconds=5),
          "dispatched before the holds ended")


async def breaker_tripped(lc: Lifecycle) -> None:
    """The executor's admission at the gate trips the recovery-storm breaker: the workflow starts the
    RecoveryBreaker alert (the gate's row, by its key), then recovers."""
    lc.fakes.gate_trip = f"recovery-breaker/{ORG}/{APP}/1"
    expect(await lc.die(), "RECOVERED", attempts=1, by="peer-a")
    _alerts_started(lc, ["app.recovery.breaker_tripped"])


async def reconnect_within_grace(lc: Lifecycle) -> None:
    """A reconnect inside the grace cancels it; later the app is deleted (removed while HEALTHY)."""
    await lc.connect("c1")
    await lc.healthy("c1")
    await lc.relay.disconnect("c1")
    await lc.relay.wait_statuses(HEALTHY, DISCONNECTED)
    await lc.connect("c2")  # time is not skipping: well inside the grace
    await lc.healthy("c2")
    check(lc.fakes.statuses() == [HEALTHY, DISCONNECTED, RECONNECTED], f"statuses {lc.fakes.statuses()}")
    await lc.env.sleep(GRACE * 2)
    await lc.relay.remove()
    expect(await lc.relay.result(), "REMOVED")
    check(not lc.fakes.selects, "recovery started after a reconnect")


async def superseded(lc: Lifecycle) -> None:
    """A second socket while HEALTHY (its gateway lost, the executor back through another): recorded, its status
    attribute left as it is; later the app is deleted."""
    await lc.connect("c1")
    await lc.healthy("c1")
    await lc.connect("c2")
    await lc.healthy("c2")
    check(lc.fakes.statuses() == [HEALTHY, SUPERSEDED], f"statuses {lc.fakes.statuses()}")
    await lc.relay.remove()
    expect(await lc.relay.result(), "REMOVED")


async def retries(lc: Lifecycle) -> None:
    """The first candidate answers success=false; the next one recovers."""
    lc.fakes.recovery_replies["peer-a"] = [RecoveryReply(success=False, error_message="cannot recover")]
    expect(await lc.die(), "RECOVERED", attempts=2, by="peer-b")


async def retries_every_peer_fails(lc: Lifecycle) -> None:
    """Every failure branch: a dispatch that raises, pending workflows left after success=true, then no peer
    left to try (both failed once), so both are tried again after the backoff."""
    lc.fakes.recovery_replies["peer-a"] = [ApplicationError("socket closed", non_retryable=True)]
    lc.fakes.pending_replies["peer-b"] = [ExistPendingReply(exist=True)]
    expect(await lc.die(), "RECOVERED", attempts=3, by="peer-a")
    check(len(lc.fakes.selects) == 4, f"{len(lc.fakes.selects)} selects, expected 4 (one finding no one)")
    check("executor.recovery.blocked" not in lc.fakes.audits(), "every peer failing once is not blocked")


async def blocked_then_recovered(lc: Lifecycle) -> None:
    """No HEALTHY peer of the version (alert), a periodic re-check finding none, then a peer signals."""
    await lc.die_blocked()
    await lc.env.sleep(BLOCKED_RECHECK + timedelta(seconds=5))
    check(len(lc.fakes.selects) >= 2, "no periodic re-check while blocked")
    lc.fakes.peers_available = True
    await lc.peer_available()
    expect(await lc.relay.result(), "RECOVERED", attempts=1, by="peer-a")
    check(lc.fakes.audits().count("executor.recovery.blocked") == 1, f"alerts: {lc.fakes.audits()}")
    _alerts_started(lc, ["executor.recovery.blocked", "executor.recovery.unblocked"])


def _alerts_started(lc: Lifecycle, operations: list[str]) -> None:
    """Since ``own-alerts-at-once``: the deliveries of Relay's own alerts the workflow started, in order."""
    started = [c.input.operation for c in lc.fakes.own_alerts]
    check(started == operations, f"own alerts started {started}, expected {operations}")


async def continue_as_new_healthy(lc: Lifecycle) -> None:
    """The signal budget runs out while HEALTHY: run 2 keeps the dedup keys (a late retry is ignored)."""
    await lc.connect("c1", signal_id="s1")
    await lc.healthy("c1")
    await lc.relay.disconnect("c1", signal_id="d1")
    await lc.relay.wait_statuses(HEALTHY, DISCONNECTED)
    await lc.connect("c2", signal_id="s2")  # the third signal: continue-as-new once it is recorded
    await lc.relay.wait_statuses(HEALTHY, DISCONNECTED, RECONNECTED)
    await lc.second_run()
    await lc.connect("c1", signal_id="s1")  # a late retry of run 1's connect
    await lc.relay.disconnect("c2")
    await lc.relay.wait_statuses(HEALTHY, DISCONNECTED, RECONNECTED, DISCONNECTED)
    await lc.relay.remove()
    expect(await lc.relay.result(), "REMOVED")


async def continue_as_new_mid_grace(lc: Lifecycle) -> None:
    """The signal budget runs out during the grace (a stale disconnect is the third signal): run 2 resumes the
    carried deadline, dies and recovers."""
    await lc.connect("c1", signal_id="s1")
    await lc.healthy("c1")
    await lc.relay.disconnect("c1", signal_id="d1")
    await lc.relay.wait_statuses(HEALTHY, DISCONNECTED)
    await lc.relay.disconnect("c0", signal_id="stale")
    await lc.second_run()
    expect(await lc.relay.result(), "RECOVERED", attempts=1)
    check(len(lc.fakes.timeouts) == 1, "the grace restarted in run 2")


async def continue_as_new_mid_recovery(lc: Lifecycle) -> None:
    """The signal budget runs out while recovery is blocked: run 2 resumes the recovery and completes it."""
    await lc.die_blocked()
    await lc.relay.disconnect("c0", signal_id="stale")  # the third signal
    lc.fakes.peers_available = True
    await lc.peer_available()  # wakes the blocked loop, which then continues-as-new
    await lc.second_run()
    expect(await lc.relay.result(), "RECOVERED", attempts=1)
    _alerts_started(lc, ["executor.recovery.blocked", "executor.recovery.unblocked"])  # unblocked in run 2


async def dead_executor_returns(lc: Lifecycle) -> None:
    """It reconnects while a recovery request is out: recovery completes, run 2 registers it afresh; then its app
    goes. (Back before any request went out, recovery is called off instead: ``recovery_called_off``.)"""
    fakes = lc.fakes
    fakes.dispatch_gate = asyncio.Event()
    fakes.grace = timedelta(milliseconds=300)  # wall clock: time does not skip while the dispatch hangs
    await lc.connect("c1")
    await lc.healthy("c1")
    await lc.relay.disconnect("c1")
    for _ in range(500):
        if fakes.dispatches:
            break
        await asyncio.sleep(0.02)
    check(len(fakes.dispatches) == 1, f"no recovery request went out: {fakes.summary()}")
    await lc.connect("c2")
    await lc.relay.settle()
    fakes.dispatch_gate.set()
    await lc.relay.wait_statuses(HEALTHY, DISCONNECTED, DEAD, HEALTHY)
    await lc.relay.remove()
    expect(await lc.relay.result(), "REMOVED")
    check(len(lc.fakes.deletes) == 2, "expected the recovery's delete and the removal's")


async def recovery_called_off(lc: Lifecycle) -> None:
    """DEAD and blocked, it comes back before any request went out: recovery is called off, HEALTHY again."""
    await lc.die_blocked()
    await lc.connect("c2")
    await lc.relay.wait_statuses(HEALTHY, DISCONNECTED, DEAD, RECONNECTED)
    check(lc.fakes.audits()[-2:] == ["executor.recovery.cancelled", "executor.recovery.unblocked"],
          f"audits {lc.fakes.audits()}")
    _alerts_started(lc, ["executor.recovery.blocked", "executor.recovery.unblocked"])
    check(not lc.fakes.dispatches, "a recovery request went out")
    await lc.relay.remove()
    expect(await lc.relay.result(), "REMOVED")


async def fenced_before_dead(lc: Lifecycle) -> None:
    """The grace ends but the executor's gateway still holds its socket: HEALTHY again, nothing recovered."""
    lc.fakes.probe_replies.append(ProbeGatewayReply(connection=lc.relay.connected_signal("c1"),
                                                    contact_for=timedelta(days=1)))
    await lc.connect("c1")
    await lc.healthy("c1")
    await lc.relay.disconnect("c1")
    await lc.env.sleep(GRACE + timedelta(seconds=5))
    await lc.relay.wait_statuses(HEALTHY, DISCONNECTED, RECONNECTED)
    check("executor.fenced" in lc.fakes.audits(), f"audits {lc.fakes.audits()}")
    await lc.relay.remove()
    expect(await lc.relay.result(), "REMOVED")


async def called_off_during_the_last_probe(lc: Lifecycle) -> None:
    """DEAD, a candidate chosen, the last probe out; the new socket's `connected` lands meanwhile and the probe then
    says "not held there": the `connected` wins, no request goes out; HEALTHY again."""
    fakes = lc.fakes
    release_select = fakes.holds[Activity.SELECT_CANDIDATE] = asyncio.Event()
    await lc.connect("c1")
    await lc.healthy("c1")
    await lc.relay.disconnect("c1")
    await lc.env.sleep(GRACE + timedelta(seconds=1))
    await _started(fakes, Activity.SELECT_CANDIDATE)
    release_probe = fakes.holds[Activity.PROBE_GATEWAY] = asyncio.Event()
    release_select.set()
    await _started(fakes, Activity.PROBE_GATEWAY)
    await lc.connect("c2")
    await lc.relay.settle()
    release_probe.set()
    await lc.relay.wait_statuses(HEALTHY, DISCONNECTED, DEAD, RECONNECTED)
    check(not fakes.dispatches and "executor.recovery.cancelled" in fakes.audits(), f"audits {fakes.audits()}")
    await lc.relay.remove()
    expect(await lc.relay.result(), "REMOVED")


async def back_while_the_fence_holds(lc: Lifecycle) -> None:
    """The probe before DEAD out ahead of the grace's end, held by the gateway until then; the new socket's
    `connected` lands first: the wait ends (the probe cancelled), HEALTHY again, never DEAD."""
    fakes = lc.fakes
    release_probe = fakes.holds[Activity.PROBE_GATEWAY] = asyncio.Event()
    await lc.connect("c1")
    await lc.healthy("c1")
    await lc.relay.disconnect("c1")
    await lc.env.sleep(GRACE - FENCE_LEAD + timedelta(milliseconds=200))
    await _started(fakes, Activity.PROBE_GATEWAY)
    await lc.connect("c2")
    await lc.relay.wait_statuses(HEALTHY, DISCONNECTED, RECONNECTED)
    release_probe.set()
    await lc.relay.settle()
    check(not fakes.selects and "executor.dead" not in fakes.audits(), f"calls {fakes.summary()}")
    await lc.relay.remove()
    expect(await lc.relay.result(), "REMOVED")


async def gateway_known_gone(lc: Lifecycle) -> None:
    """The executor's gateway is known gone (it retired): DEAD when the grace ends and the request right after,
    with no probe."""
    lc.fakes.gone_queues.add(lc.fakes.self_queue)
    expect(await lc.die(), "RECOVERED", attempts=1, by="peer-a")
    check(not lc.fakes.probes and len(lc.fakes.gone_checks) == 2, f"calls {lc.fakes.summary()}")


async def _started(fakes: FakeRelay, name: str) -> None:
    for _ in range(500):
        if name in fakes.started:
            return
        await asyncio.sleep(0.02)
    raise ScenarioError(f"{name} was never called: {fakes.summary()}")


async def grace_extended(lc: Lifecycle) -> None:
    """Its gateway regained contact with Temporal 10 s before the grace ended: a whole grace from then, then DEAD
    and recovered."""
    lc.fakes.probe_replies.append(ProbeGatewayReply(connection=None, contact_for=timedelta(seconds=10)))
    expect(await lc.die(), "RECOVERED", attempts=1, by="peer-a")
    check("executor.grace.extended" in lc.fakes.audits(), f"audits {lc.fakes.audits()}")


async def removed_mid_grace(lc: Lifecycle) -> None:
    """The app is deleted during the grace: the workflow ends without recovery."""
    await lc.connect("c1")
    await lc.healthy("c1")
    await lc.relay.disconnect("c1")
    await lc.relay.wait_statuses(HEALTHY, DISCONNECTED)
    await lc.relay.remove()
    expect(await lc.relay.result(), "REMOVED")
    check(not lc.fakes.selects, "recovery started after removal")


async def removed_mid_recovery(lc: Lifecycle) -> None:
    """The app is deleted while a peer sits on the recovery request: the dispatch is abandoned (cancelled)."""
    fakes = lc.fakes
    fakes.dispatch_gate = asyncio.Event()
    fakes.grace = timedelta(milliseconds=300)  # wall clock: time does not skip while the dispatch hangs
    try:
        await lc.connect("c1")
        await lc.healthy("c1")
        await lc.relay.disconnect("c1")
        await lc.relay.wait_statuses(HEALTHY, DISCONNECTED, DEAD)
        for _ in range(500):
            if fakes.dispatches:
                break
            await asyncio.sleep(0.02)
        await lc.relay.remove()
        expect(await lc.relay.result(), "REMOVED")
        check(len(fakes.dispatches) == 1 and not fakes.exist_calls, "the dispatch was not the one abandoned")
    finally:
        fakes.dispatch_gate.set()


async def disconnect_during_healthy_write(lc: Lifecycle) -> None:
    """The disconnect arrives while HEALTHY is being written: one grace, no phantom reconnect; then recovery."""
    fakes = lc.fakes
    fakes.healthy_gate = asyncio.Event()
    await lc.connect("c1")
    await asyncio.wait_for(fakes.healthy_writing.wait(), 10)
    # Landed on the server when the call returns; the write is a local activity, so the signal reaches the
    # workflow once the write ends.
    await lc.relay.disconnect("c1")
    fakes.healthy_gate.set()
    expect(await lc.relay.result(), "RECOVERED", attempts=1)
    check(fakes.statuses() == [HEALTHY, DISCONNECTED, DEAD] and len(fakes.timeouts) == 1,
          f"statuses {fakes.statuses()}, {len(fakes.timeouts)} graces")


async def app_gone(lc: Lifecycle) -> None:
    """The app no longer exists when the grace would start: the workflow ends."""
    lc.fakes.grace = None
    expect(await lc.die(), "REMOVED")


# -- gateway watch -------------------------------------------------------------------------------------------------


@dataclass
class GatewayFakes:
    """hold_gateway returns at once the first time (the hold ran its course); the second time it stops
    heartbeating (the process froze, or Temporal was away) but the probe is answered: alive, hold again; the
    third time the gateway's worker is gone, so neither the hold nor the probe is picked up.

    With ``retired_at`` set, the gateway is recorded gone (it retired) from that hold on: no probe at all."""

    retired_at: int | None = None
    holds: int = 0
    probes: int = 0
    gone_checks: int = 0
    third_hold: asyncio.Event = field(default_factory=asyncio.Event)
    swept: list[DisconnectGatewayInput] = field(default_factory=list)

    @activity.defn(name=Activity.HOLD_GATEWAY)
    async def hold_gateway(self, input: HoldGatewayInput) -> None:
        self.holds += 1
        if self.holds == 3:
            self.third_hold.set()
        if self.holds > 1:
            # No heartbeat, so the server fails the hold at its heartbeat timeout.
            await asyncio.sleep(input.heartbeat_interval.total_seconds() * 12)

    @activity.defn(name=Activity.PROBE_GATEWAY)
    async def probe_gateway(self, input: ProbeGatewayInput) -> ProbeGatewayReply:
        self.probes += 1
        return ProbeGatewayReply(contact_for=timedelta(hours=1))

    @activity.defn(name=Activity.GATEWAY_GONE)
    async def gateway_gone(self, input: GatewayGoneInput) -> GatewayGoneReply:
        self.gone_checks += 1
        gone = self.retired_at is not None and self.holds >= self.retired_at
        return GatewayGoneReply(gone=gone, reason="retired" if gone else "")

    @activity.defn(name=Activity.DISCONNECT_GATEWAY_EXECUTORS)
    async def disconnect_gateway_executors(self, input: DisconnectGatewayInput) -> DisconnectGatewayResult:
        self.swept.append(input)
        return DisconnectGatewayResult(signalled=2)


async def gateway_watch(env: WorkflowEnvironment, name: str) -> tuple[str, str]:
    """``gateway-watch``: Run 1: the hold ends, continue-as-new. Run 2: the hold's heartbeats stop, the probe is
    answered, continue-as-new. Run 3: the gateway's worker is gone; the probe is not picked up; the sweep
    disconnects. ``gateway-watch-retired``: run 1 as above; run 2: the heartbeats stop and the gateway is recorded
    gone (it retired): the sweep disconnects at once, with no probe.

    Returns the workflow id and its first run's id."""
    retired = name == "gateway-watch-retired"
    fakes = GatewayFakes(retired_at=2 if retired else None)
    shared, gateway_queue = f"record-{name}", f"record-{name}-gateway"
    workflow_id = gateway_workflow_id(gateway_queue)
    async with Worker(env.client, task_queue=shared, workflows=[GatewayWorkflow],
                      activities=[fakes.disconnect_gateway_executors, fakes.gateway_gone]):
        async with Worker(env.client, task_queue=gateway_queue,
                          activities=[fakes.hold_gateway, fakes.probe_gateway]):
            handle = await env.client.start_workflow(
                GatewayWorkflow.run,
                GatewayInput(gateway_queue, heartbeat_timeout=timedelta(seconds=1), hold_for=timedelta(seconds=2)),
                id=workflow_id, task_queue=shared,
            )
            # Retired: the gateway's worker still runs (and would answer a probe), yet none is sent. Otherwise its
            # worker goes away after the third hold starts: neither the hold nor the probe is picked up.
            await asyncio.wait_for(handle.result() if retired else fakes.third_hold.wait(), timeout=30)
        result = await asyncio.wait_for(handle.result(), timeout=30)
    check(result == DisconnectGatewayResult(signalled=2), f"ended {result}")
    expected = (2, 0, 1) if retired else (3, 1, 1)
    check((fakes.holds, fakes.probes, len(fakes.swept)) == expected,
          f"{fakes.holds} holds, {fakes.probes} probes, {len(fakes.swept)} sweeps")
    check(fakes.gone_checks == (1 if retired else 2), f"{fakes.gone_checks} known-gone checks")
    check("gateway gone" in fakes.swept[0].reason, f"sweep reason {fakes.swept[0].reason!r}")
    assert handle.result_run_id is not None
    return workflow_id, handle.result_run_id


async def orphan_recovered(lc: Lifecycle) -> None:
    """Started by the orphan sweep: one grace for it to connect, DEAD, dispatch, confirm, delete."""
    await lc.relay.start_orphan(OrphanInfo(VERSION, pending=2), search_attributes=_search_attributes(
        lc.relay.executor_id))
    expect(await lc.relay.result(), "RECOVERED", attempts=1, by="peer-a")
    check("executor.orphan.found" in lc.fakes.audits(), f"audits {lc.fakes.audits()}")
    check(lc.fakes.statuses() == [DEAD], f"statuses {lc.fakes.statuses()}")


# -- the list ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    play: Callable[[Lifecycle], Awaitable[None]] | None = None  # None: the gateway watch
    runs: int = 1  # how many runs the history must have (continue-as-new), checked before writing
    signal_budget: int | None = None  # set: lowered in an unsandboxed worker, and named in the files

    @property
    def stem(self) -> str:
        return f"{self.name}-signal-budget-{self.signal_budget}" if self.signal_budget else self.name


SCENARIOS = [
    Scenario("happy-recovery", happy_recovery),
    Scenario("reconnect-within-grace", reconnect_within_grace),
    Scenario("superseded", superseded),
    Scenario("retries", retries),
    Scenario("retries-every-peer-fails", retries_every_peer_fails),
    Scenario("blocked-then-recovered", blocked_then_recovered),
    Scenario("held-then-recovered", held_then_recovered),
    Scenario("breaker-tripped", breaker_tripped),
    Scenario("continue-as-new-healthy", continue_as_new_healthy, runs=2, signal_budget=LOWERED_SIGNAL_BUDGET),
    Scenario("continue-as-new-mid-grace", continue_as_new_mid_grace, runs=2, signal_budget=LOWERED_SIGNAL_BUDGET),
    Scenario("continue-as-new-mid-recovery", continue_as_new_mid_recovery, runs=2,
             signal_budget=LOWERED_SIGNAL_BUDGET),
    Scenario("dead-executor-returns", dead_executor_returns, runs=2),
    Scenario("disconnect-during-healthy-write", disconnect_during_healthy_write),
    Scenario("removed-mid-grace", removed_mid_grace),
    Scenario("removed-mid-recovery", removed_mid_recovery),
    Scenario("app-gone", app_gone),
    Scenario("recovery-called-off", recovery_called_off),
    Scenario("fenced-before-dead", fenced_before_dead),
    Scenario("grace-extended", grace_extended),
    Scenario("gateway-watch", None, runs=3),
    Scenario("gateway-watch-retired", None, runs=2),
    Scenario("called-off-during-the-last-probe", called_off_during_the_last_probe),
    Scenario("gateway-known-gone", gateway_known_gone),
    Scenario("back-while-the-fence-holds", back_while_the_fence_holds),
    Scenario("orphan-recovered", orphan_recovered),
    Scenario("recovered-via-its-own-gateway", recovered_via_its_own_gateway),
    Scenario("called-off-by-the-sending-gateway", called_off_by_the_sending_gateway),
]
