"""Look again right before the request, on the time-skipping server: a `connected` that lands while the recovery
path waits on anything — a probe, the gate's answer, a candidate's answer, a backoff — calls the recovery off; and a
gateway known gone is never probed.

Each test holds one of the fakes (``FakeRelay.holds``) while the executor's new socket is signalled, then lets it
answer as if nothing happened ("alive, not held" for a probe, "go" for the gate, a peer for the candidate): only the
workflow's own look at what landed meanwhile can call the recovery off.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from tests.conftest import assert_eventually
from tests.lifecycle_fakes import DEAD, DISCONNECTED, GRACE, HEALTHY, RECONNECTED, FakeRelay, Relay
from tests.workflows.test_lifecycle_workflow import relay  # noqa: F401 — the workers fixture
from workflows.contracts.common import Activity
from workflows.contracts.gateway_watch import ProbeGatewayReply
from workflows.contracts.lifecycle import LifecycleResult, RecoveryReply
from workflows.timing import FENCE_LEAD

CANCELLED = "executor.recovery.cancelled"


async def _dead(relay: Relay) -> None:  # noqa: F811
    """Connected as c1, gone, its grace over: DEAD, the recovery path begun."""
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1")
    # Just past the grace: time stops skipping while a fake is held, so the rest of a sleep is wall time.
    await relay.env.sleep(GRACE + timedelta(milliseconds=200))


async def _held(fakes: FakeRelay, name: str) -> asyncio.Event:
    """Hold the fake ``name`` from its next call on; returns the event that releases it."""
    release = fakes.holds[name] = asyncio.Event()
    fakes.started.pop(name, None)
    return release


async def _wait_started(fakes: FakeRelay, name: str) -> None:
    async def started() -> None:
        event = fakes.started.get(name)
        assert event is not None and event.is_set(), f"{name} not held yet; calls: {fakes.summary()}"

    await assert_eventually(started)


async def _called_off(relay: Relay, *after: tuple[str, str]) -> None:  # noqa: F811
    """No request went out, the call-off is audited, and the executor is HEALTHY on its new socket, same run."""
    fakes = relay.fakes
    await relay.wait_statuses(HEALTHY, DISCONNECTED, *after, RECONNECTED)
    assert not fakes.dispatches and not fakes.deletes, fakes.summary()
    assert CANCELLED in fakes.audits() and "executor.recovery.dispatched" not in fakes.audits()
    state = await relay.state()
    assert (state.status, state.recorded_connection_id, state.revived) == ("HEALTHY", "c2", False)


async def test_back_while_the_probe_before_the_request_is_out(relay: Relay) -> None:  # noqa: F811
    """The red team's case: DEAD, a candidate chosen, the last probe of the old gateway out (and slow: a frozen
    gateway takes the whole probe timeout); the executor's new socket is signalled meanwhile; the probe then says
    "not held there". The `connected` wins: no request."""
    fakes = relay.fakes
    release_select = await _held(fakes, Activity.SELECT_CANDIDATE)
    await _dead(relay)
    await _wait_started(fakes, Activity.SELECT_CANDIDATE)
    release_probe = await _held(fakes, Activity.PROBE_GATEWAY)  # the probe after the candidate: the last one
    release_select.set()
    await _wait_started(fakes, Activity.PROBE_GATEWAY)

    await relay.connect("c2")
    await relay.settle()
    release_probe.set()

    await _called_off(relay, DEAD)
    assert len(fakes.probes) == 2


async def test_back_while_the_probe_before_dead_is_out(relay: Relay) -> None:  # noqa: F811
    """The grace is over and the probe before DEAD is out when the new socket's `connected` lands; the probe then
    says "gone" (not held, in contact for a day). It is never recorded DEAD, nor is its connection overwritten."""
    fakes = relay.fakes
    release_probe = await _held(fakes, Activity.PROBE_GATEWAY)
    await _dead(relay)
    await _wait_started(fakes, Activity.PROBE_GATEWAY)

    await relay.connect("c2")
    await relay.settle()
    release_probe.set()

    await relay.wait_statuses(HEALTHY, DISCONNECTED, RECONNECTED)
    assert not fakes.selects and not fakes.dispatches and not fakes.deletes, fakes.summary()
    state = await relay.state()
    assert (state.status, state.recorded_connection_id) == ("HEALTHY", "c2")


async def test_back_while_the_fence_holds_its_probe_for_the_grace_end(relay: Relay) -> None:  # noqa: F811
    """The probe before DEAD is out ahead of the grace's end, held by the gateway until then; the new socket's
    `connected` lands first. It ends the wait at once: HEALTHY while the probe is still held, never DEAD."""
    fakes = relay.fakes
    release_probe = await _held(fakes, Activity.PROBE_GATEWAY)
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1")
    await relay.env.sleep(GRACE - FENCE_LEAD + timedelta(milliseconds=200))  # the probe out, the grace not over
    await _wait_started(fakes, Activity.PROBE_GATEWAY)

    await relay.connect("c2")

    await relay.wait_statuses(HEALTHY, DISCONNECTED, RECONNECTED)
    assert not release_probe.is_set() and fakes.probes[0].input.answer_at is not None
    release_probe.set()
    await relay.settle()
    assert fakes.statuses() == [HEALTHY, DISCONNECTED, RECONNECTED]
    assert not fakes.selects and not fakes.dispatches and not fakes.deletes, fakes.summary()
    state = await relay.state()
    assert (state.status, state.recorded_connection_id) == ("HEALTHY", "c2")


@pytest.mark.parametrize("waited_on", [Activity.ADMIT_RECOVERY, Activity.SELECT_CANDIDATE],
                         ids=["the-gate-answers", "a-candidate-is-chosen"])
async def test_back_while_a_database_answer_is_awaited(relay: Relay, waited_on: str) -> None:  # noqa: F811
    """The gate's answer, or the peer chosen, takes a while (a busy database); the new socket's `connected` lands
    meanwhile; the answer is then "go" and a peer."""
    fakes = relay.fakes
    release = await _held(fakes, waited_on)
    await _dead(relay)
    await _wait_started(fakes, waited_on)

    await relay.connect("c2")
    await relay.settle()
    release.set()

    await _called_off(relay, DEAD)


async def test_back_while_the_gate_holds_it(relay: Relay) -> None:  # noqa: F811
    """Held by the gate (paced) for a minute: the `connected` ends the hold at once, and calls the recovery off."""
    fakes = relay.fakes
    fakes.gate_holds.append(("paced", timedelta(minutes=1)))
    await _dead(relay)
    await assert_eventually(lambda: _assert(len(fakes.admissions) == 1
                                            and fakes.statuses() == [HEALTHY, DISCONNECTED, DEAD]))

    await relay.connect("c2")

    await _called_off(relay, DEAD)
    assert len(fakes.admissions) == 1


async def test_back_after_a_failed_attempt(relay: Relay) -> None:  # noqa: F811
    """A first request failed (no harm: the peer did not recover it); back during the backoff before the next."""
    fakes = relay.fakes
    fakes.recovery_replies["peer-a"] = [RecoveryReply(success=False, error_message="busy")]
    release = await _held(fakes, Activity.SELECT_CANDIDATE)
    await _dead(relay)
    await _wait_started(fakes, Activity.SELECT_CANDIDATE)
    fakes.started.pop(Activity.SELECT_CANDIDATE)
    release.set()
    await assert_eventually(lambda: _assert("executor.recovery.failed" in fakes.audits()))
    release_next = await _held(fakes, Activity.SELECT_CANDIDATE)

    await relay.connect("c2")
    await relay.settle()
    release_next.set()

    await relay.wait_statuses(HEALTHY, DISCONNECTED, DEAD, RECONNECTED)
    assert len(fakes.dispatches) == 1 and not fakes.deletes, fakes.summary()
    assert fakes.audits()[-1] == CANCELLED, fakes.audits()


async def test_came_and_went_again_while_the_probe_was_out(relay: Relay) -> None:  # noqa: F811
    """A new socket that opened and closed again while the last probe was out: the process is alive (it just
    connected), so no recovery; it is recorded HEALTHY, then DISCONNECTED, and gets a new grace of its own."""
    fakes = relay.fakes
    release_select = await _held(fakes, Activity.SELECT_CANDIDATE)
    await _dead(relay)
    await _wait_started(fakes, Activity.SELECT_CANDIDATE)
    release_probe = await _held(fakes, Activity.PROBE_GATEWAY)
    release_select.set()
    await _wait_started(fakes, Activity.PROBE_GATEWAY)

    await relay.connect("c2")
    await relay.disconnect("c2")
    await relay.settle()
    release_probe.set()

    await relay.wait_statuses(HEALTHY, DISCONNECTED, DEAD, RECONNECTED, DISCONNECTED)
    assert not fakes.dispatches and not fakes.deletes, fakes.summary()
    assert CANCELLED in fakes.audits()


async def test_a_gateway_known_gone_is_never_probed(relay: Relay) -> None:  # noqa: F811
    """The executor's gateway retired (or was found gone, or restarted): nothing waits on a probe of it, so DEAD
    comes when the grace ends and the request right after."""
    fakes = relay.fakes
    fakes.gone_queues.add(fakes.self_queue)
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1")

    result = await relay.result()

    assert result == LifecycleResult(status="RECOVERED", recovered_by="peer-a", attempts=1)
    assert not fakes.probes, fakes.summary()
    assert [c.input.gateway_queue for c in fakes.gone_checks] == [fakes.self_queue] * 2
    disconnected, dead = fakes.records[1], fakes.records[2]
    assert timedelta(0) <= dead.scheduled - (disconnected.scheduled + GRACE) < timedelta(seconds=1)
    assert fakes.dispatches[0].scheduled - dead.scheduled < timedelta(seconds=1)


async def test_a_live_gateway_is_still_probed(relay: Relay) -> None:  # noqa: F811
    """Known gone is a fact about one gateway: another, live, is asked as before (and its answer counts)."""
    fakes = relay.fakes
    fakes.gone_queues.add(f"{fakes.task_queue}-some-other-gateway")
    fakes.probe_replies.append(ProbeGatewayReply(connection=relay.connected_signal("c1"),
                                                 contact_for=timedelta(days=1)))
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1")
    await relay.env.sleep(GRACE + timedelta(seconds=5))

    await relay.wait_statuses(HEALTHY, DISCONNECTED, RECONNECTED)
    assert len(fakes.probes) == 1 and len(fakes.gone_checks) == 1
    assert not fakes.dispatches


async def _gone(relay: Relay, *, peer_on_its_gateway: bool = True) -> None:  # noqa: F811
    """Connected as c1 on its gateway, then gone; the peer chosen for its recovery on that same gateway (else the
    first of ``PEERS``, each on a gateway of its own)."""
    if peer_on_its_gateway:
        relay.fakes.candidate_script.append(relay.fakes.self_peer)
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1")


async def test_a_peer_on_the_dead_executors_gateway_is_sent_the_request_without_a_probe(
        relay: Relay) -> None:  # noqa: F811
    """The peer is on the gateway that last held the dead executor: that gateway looks for its socket as it picks
    the request up (``look``), so the probe right before the request is left out; the fence's probe at the grace's
    end is not."""
    fakes = relay.fakes
    await _gone(relay)

    result = await relay.result()

    assert result == LifecycleResult(status="RECOVERED", recovered_by="peer-s", attempts=1)
    assert len(fakes.probes) == 1 and fakes.probes[0].input.answer_at is not None, fakes.summary()
    [dispatch] = fakes.dispatches
    assert dispatch.input.look and dispatch.task_queue == fakes.self_queue
    [select] = fakes.selects  # declare_dead's
    assert select.input.prefer_gateway == fakes.self_queue
    assert "executor.recovery.dispatched" in fakes.audits() and len(fakes.deletes) == 1


async def test_a_peer_on_another_gateway_is_sent_the_request_after_a_probe(relay: Relay) -> None:  # noqa: F811
    """The other case: the dead executor's gateway is not the sender, so it is probed right before the request."""
    fakes = relay.fakes
    await _gone(relay, peer_on_its_gateway=False)

    result = await relay.result()

    assert result == LifecycleResult(status="RECOVERED", recovered_by="peer-a", attempts=1)
    assert len(fakes.probes) == 2 and fakes.probes[1].input.answer_at is None, fakes.summary()
    assert not fakes.dispatches[0].input.look


async def test_the_sending_gateway_finds_the_executor_there_and_the_recovery_is_called_off(
        relay: Relay) -> None:  # noqa: F811
    """The dead executor is back on its gateway (its `connected` not landed yet, a gateway out of touch with
    Temporal a moment) when the request comes to a peer there: the gateway answers with the socket instead of
    sending, and the workflow calls the recovery off as a probe's answer would."""
    fakes = relay.fakes
    fakes.alive_here = relay.connected_signal("c2")
    await _gone(relay)
    await relay.env.sleep(GRACE + timedelta(seconds=5))

    await relay.wait_statuses(HEALTHY, DISCONNECTED, DEAD, RECONNECTED)
    [dispatch] = fakes.dispatches
    assert dispatch.input.look and len(fakes.probes) == 1 and not fakes.deletes, fakes.summary()
    assert CANCELLED in fakes.audits() and "executor.recovery.dispatched" not in fakes.audits()
    assert "executor.recovery.failed" not in fakes.audits()
    state = await relay.state()
    assert (state.status, state.recorded_connection_id, state.revived) == ("HEALTHY", "c2", False)


async def test_an_older_gateway_refuses_and_the_next_attempt_is_probed(relay: Relay) -> None:  # noqa: F811
    """A gateway of older code ignores ``look`` and refuses with ``ExecutorAlive``: a failed attempt, no request
    sent. The next attempt, on a peer elsewhere, probes the dead executor's gateway first, finds the socket there
    and calls the recovery off."""
    fakes = relay.fakes
    fakes.alive_here, fakes.looking_gateway = relay.connected_signal("c2"), False
    fakes.probe_replies += [ProbeGatewayReply(contact_for=timedelta(days=1)),
                            ProbeGatewayReply(connection=relay.connected_signal("c2"), contact_for=timedelta(days=1))]
    await _gone(relay)
    await relay.env.sleep(GRACE + timedelta(minutes=2))

    await relay.wait_statuses(HEALTHY, DISCONNECTED, DEAD, RECONNECTED)
    [refused] = fakes.dispatches
    assert refused.input.look and refused.task_queue == fakes.self_queue, fakes.summary()
    assert len(fakes.probes) == 2 and fakes.probes[1].input.answer_at is None and not fakes.deletes
    assert fakes.audits()[-2:] == ["executor.recovery.failed", CANCELLED], fakes.audits()
    state = await relay.state()
    assert (state.status, state.recorded_connection_id) == ("HEALTHY", "c2")


def _assert(condition: bool) -> None:
    assert condition


