"""The fence, on the time-skipping server: nothing is declared DEAD, nor recovered, while the gateway that last held
the executor still holds its socket; a gateway that regained contact with Temporal late owes it a full grace.

The executor's gateway is the fakes' ``self_queue``, where ``FakeRelay.probe_gateway`` answers (a gateway that is
gone — a probe never picked up — is covered end to end, on the dev server, by tests/e2e/test_gateway_death.py and
tests/e2e/test_outages.py: the time-skipping server does not skip time while an activity waits to be picked up).
"""

from __future__ import annotations

import uuid
from datetime import timedelta

from tests.lifecycle_fakes import DEAD, DISCONNECTED, GRACE, HEALTHY, RECONNECTED, Relay
from tests.workflows.test_lifecycle_workflow import relay  # noqa: F401 — the workers fixture
from workflows.contracts.gateway_watch import ProbeGatewayReply
from workflows.contracts.lifecycle import LifecycleResult, disconnect_event_key
from workflows.timing import FENCE_LEAD


async def test_a_socket_still_held_at_the_end_of_the_grace_is_healthy_not_dead(relay: Relay) -> None:  # noqa: F811
    """The `disconnected` was wrong (say, a watch that read Temporal's own outage as the gateway's death): the
    gateway still holds the socket, so the executor is HEALTHY again and nothing is recovered."""
    fakes = relay.fakes
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    fakes.probe_replies.append(ProbeGatewayReply(connection=relay.connected_signal("c1"),
                                                 contact_for=timedelta(days=1)))
    await relay.disconnect("c1")
    await relay.env.sleep(GRACE + timedelta(seconds=5))

    await relay.wait_statuses(HEALTHY, DISCONNECTED, RECONNECTED)
    [probe] = fakes.probes
    assert probe.task_queue == fakes.self_queue
    assert (probe.input.org, probe.input.app, probe.input.executor_id) == ("acme", "shop", relay.executor_id)
    assert "executor.fenced" in fakes.audits()
    assert not fakes.dispatches and not fakes.selects and not fakes.deletes
    state = await relay.state()
    assert (state.status, state.recorded_connection_id) == ("HEALTHY", "c1")


async def test_contact_regained_late_extends_the_grace_from_that_moment(relay: Relay) -> None:  # noqa: F811
    """The gateway has been in contact with Temporal for only 10 s when the grace ends: the executor was away
    while Relay could not have taken it back, so it gets a whole grace from the moment contact came back."""
    fakes = relay.fakes
    regained_ago = timedelta(seconds=10)
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    fakes.probe_replies.append(ProbeGatewayReply(connection=None, contact_for=regained_ago))
    await relay.disconnect("c1")

    result = await relay.result()

    assert result == LifecycleResult(status="RECOVERED", recovered_by="peer-a", attempts=1)
    assert fakes.statuses() == [HEALTHY, DISCONNECTED, DEAD]
    disconnected, dead = fakes.records[1], fakes.records[2]
    first_probe, second_probe, before_dispatch = fakes.probes
    extended_by = GRACE - regained_ago
    lateness = dead.scheduled - (disconnected.scheduled + GRACE + extended_by)
    assert timedelta(0) <= lateness < timedelta(seconds=2), (disconnected.scheduled, dead.scheduled)
    assert second_probe.scheduled - first_probe.scheduled >= extended_by - timedelta(seconds=1)
    assert fakes.audits().index("executor.grace.extended") < fakes.audits().index("executor.recovery.dispatched")
    assert before_dispatch.scheduled >= dead.scheduled


async def test_back_on_its_gateway_right_before_the_request_calls_recovery_off(relay: Relay) -> None:  # noqa: F811
    """Gone when the grace ended, but holding a new socket on the same gateway when the request is about to go
    out (its `connected` not yet landed): the probe before the request sees it, and no request is sent."""
    fakes = relay.fakes
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    fakes.probe_replies += [ProbeGatewayReply(connection=None, contact_for=timedelta(days=1)),
                            ProbeGatewayReply(connection=relay.connected_signal("c2"), contact_for=timedelta(days=1))]
    await relay.disconnect("c1")
    await relay.env.sleep(GRACE + timedelta(seconds=5))

    await relay.wait_statuses(HEALTHY, DISCONNECTED, DEAD, RECONNECTED)
    assert len(fakes.probes) == 2 and fakes.selects
    assert not fakes.dispatches and not fakes.deletes
    assert fakes.audits()[-1] == "executor.recovery.cancelled"
    state = await relay.state()
    assert (state.status, state.recorded_connection_id) == ("HEALTHY", "c2")
    # And it is watched as ever: a real disconnect later starts a new grace.
    await relay.disconnect("c2", signal_id=str(uuid.uuid4()))
    await relay.wait_statuses(HEALTHY, DISCONNECTED, DEAD, RECONNECTED, DISCONNECTED)


async def test_every_request_is_preceded_by_a_probe(relay: Relay) -> None:  # noqa: F811
    """A failed attempt, then another: the executor's gateway is asked before each request, not only the first."""
    fakes = relay.fakes
    fakes.recovery_replies["peer-a"] = [RuntimeError("peer-a went away")]
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1")

    await relay.result()

    assert len(fakes.dispatches) == 2
    # one before DEAD, one before each of the two requests
    assert len(fakes.probes) == 3


async def test_the_fence_before_dead_is_asked_ahead_and_answers_for_the_grace_end(relay: Relay) -> None:  # noqa: F811
    """The probe before DEAD goes to the gateway ``FENCE_LEAD`` before the grace ends, asking it to look at the
    grace's end (``answer_at``): its round trip runs inside the grace. One probe before DEAD, and DEAD no sooner than
    the grace's end."""
    fakes = relay.fakes
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1")

    await relay.result()

    assert fakes.statuses() == [HEALTHY, DISCONNECTED, DEAD]
    disconnected, dead = fakes.records[1], fakes.records[2]
    ahead, before_dispatch = fakes.probes
    deadline = ahead.input.answer_at
    assert deadline is not None and before_dispatch.input.answer_at is None
    assert abs(deadline - (disconnected.scheduled + GRACE)) < timedelta(seconds=1)
    assert abs((deadline - ahead.scheduled) - FENCE_LEAD) < timedelta(seconds=1)
    assert dead.scheduled >= deadline


async def test_an_older_gateway_answering_at_once_is_asked_again_when_the_grace_ends(relay: Relay) -> None:  # noqa: F811
    """A gateway of older code ignores ``answer_at`` and answers at once: that answer says nothing of the grace's
    end, so the grace is waited out and the gateway asked again then, before DEAD."""
    fakes = relay.fakes
    fakes.held_answers = False
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1")

    await relay.result()

    disconnected, dead = fakes.records[1], fakes.records[2]
    ahead, at_the_end, before_dispatch = fakes.probes
    assert ahead.input.answer_at is not None and at_the_end.input.answer_at is None
    assert at_the_end.scheduled >= disconnected.scheduled + GRACE - timedelta(seconds=1)
    assert dead.scheduled >= at_the_end.scheduled



async def test_a_row_the_gateway_wrote_at_the_close_is_the_graces_start_and_key(relay: Relay) -> None:  # noqa: F811
    """The gateway that saw the socket close wrote DISCONNECTED itself, 5 s before the workflow's task came (its
    row's time is the close): the workflow asks under the key its ``disconnected`` signal names, so it finds that row
    rather than writing a second, and the grace runs from the close, not from when the workflow got to it."""
    fakes = relay.fakes
    fakes.write_lag = -timedelta(seconds=5)
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1", signal_id="closed-on-gateway")

    await relay.result()

    healthy, disconnected, dead = fakes.records[:3]
    assert disconnected.input.event_key == disconnect_event_key("acme", "shop", relay.executor_id,
                                                                "closed-on-gateway")
    assert healthy.input.event_key != disconnected.input.event_key != dead.input.event_key
    deadline = fakes.probes[0].input.answer_at
    assert deadline is not None
    assert abs(deadline - (disconnected.scheduled - timedelta(seconds=5) + GRACE)) < timedelta(seconds=1)
    assert dead.scheduled < disconnected.scheduled + GRACE - timedelta(seconds=3)


async def test_the_grace_runs_from_the_disconnected_rows_time(relay: Relay) -> None:  # noqa: F811
    """The DISCONNECTED row's write lands late (a busy database: its row says 5 s after the workflow task): the grace
    runs from that row's time, so DEAD never comes sooner than the row's time plus the grace."""
    fakes = relay.fakes
    fakes.write_lag = timedelta(seconds=5)
    await relay.connect("c1")
    await relay.wait_statuses(HEALTHY)
    await relay.disconnect("c1")

    await relay.result()

    disconnected, dead = fakes.records[1], fakes.records[2]
    deadline = fakes.probes[0].input.answer_at
    assert deadline is not None
    assert abs(deadline - (disconnected.scheduled + fakes.write_lag + GRACE)) < timedelta(seconds=1)
    assert dead.scheduled >= disconnected.scheduled + fakes.write_lag + GRACE - timedelta(milliseconds=100)
