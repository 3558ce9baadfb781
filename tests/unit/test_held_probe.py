"""The fence's probe held until a grace's end (``ProbeGatewayInput.answer_at``), in the gateway: it looks then, or
answers with the executor's socket the moment one appears; it never looks before it was asked to, it measures the hold
on Temporal's clock (the activity's start time), not its own, and nothing holds it for more than ``MAX_PROBE_HOLD``."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta

import pytest
from temporalio.testing import ActivityEnvironment

from core.units import utcnow
from gateway import activities
from gateway.activities import HubActivities
from gateway.hub import Connection, Hub
from gateway.session import Session
from workflows.contracts.common import ConnectedSignal, ExecutorInfo
from workflows.contracts.gateway_watch import ProbeGatewayInput, ProbeGatewayReply

ORG, APP, EXECUTOR = "o", "a", "x1"


def _connection(connection_id: str) -> Connection:
    async def send(frame: str) -> None:
        pass

    async def close(code: int, reason: str) -> None:
        pass

    conn = Connection(connection_id=connection_id, org=ORG, app=APP, executor_id=EXECUTOR, session=Session(),
                      send=send, close=close)
    conn.signal = ConnectedSignal(connection_id=connection_id, gateway_queue="relay-gateway-test",
                                  info=ExecutorInfo(EXECUTOR), signal_id=f"s-{connection_id}")
    return conn


def _probe(after: timedelta | None) -> ProbeGatewayInput:
    return ProbeGatewayInput(ORG, APP, EXECUTOR, answer_at=None if after is None else utcnow() + after)


async def _ask(hub: Hub, probe: ProbeGatewayInput, *, clock_off: timedelta = timedelta(0)) -> ProbeGatewayReply:
    """Run the activity as the worker would, started now by Temporal's clock, which is ``clock_off`` from ours."""
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, started_time=utcnow() + clock_off)
    return await env.run(HubActivities(hub).probe_gateway, probe)


async def test_a_held_probe_looks_at_the_time_it_was_asked_for_not_before() -> None:
    hub = Hub()
    asked = _probe(timedelta(milliseconds=300))
    reply = await _ask(hub, asked)
    assert asked.answer_at is not None and utcnow() >= asked.answer_at
    assert reply.connection is None and reply.held
    assert not hub._awaited  # the waiter is gone with the answer


async def test_a_socket_that_appears_during_the_hold_is_the_answer_at_once() -> None:
    hub = Hub()
    asked = _probe(timedelta(seconds=30))
    probe = asyncio.ensure_future(_ask(hub, asked))
    await asyncio.sleep(0.05)
    assert not probe.done()
    hub.attach(_connection("c2"))
    reply = await asyncio.wait_for(probe, timeout=10)
    assert reply.connection is not None and reply.connection.connection_id == "c2" and reply.held
    assert asked.answer_at is not None and utcnow() < asked.answer_at
    assert not hub._awaited


async def test_a_socket_held_already_is_the_answer_without_waiting() -> None:
    hub = Hub()
    hub.attach(_connection("c1"))
    reply = await asyncio.wait_for(_ask(hub, _probe(timedelta(seconds=30))), timeout=10)
    assert reply.connection is not None and reply.connection.connection_id == "c1" and reply.held


async def test_another_executors_socket_does_not_end_the_hold() -> None:
    hub = Hub()
    asked = _probe(timedelta(milliseconds=300))
    probe = asyncio.ensure_future(_ask(hub, asked))
    other = _connection("c-other")
    other.executor_id = "x2"
    hub.attach(other)
    reply = await probe
    assert reply.connection is None
    assert asked.answer_at is not None and utcnow() >= asked.answer_at


async def test_a_probe_without_answer_at_answers_at_once_and_says_it_did_not_hold() -> None:
    hub = Hub()
    reply = await asyncio.wait_for(_ask(hub, _probe(None)), timeout=10)
    assert reply.connection is None and not reply.held


async def test_the_hold_is_measured_on_temporals_clock_not_the_gateways() -> None:
    """This gateway's clock is an hour behind Temporal's: it still looks when the grace ends by Temporal's clock (the
    hold is ``answer_at`` less the activity's start time, both Temporal's), not an hour later."""
    hub = Hub()
    loop = asyncio.get_running_loop()
    began = loop.time()
    # answer_at 300 ms after the start, both an hour ahead of this machine's clock
    probe = ProbeGatewayInput(ORG, APP, EXECUTOR, answer_at=utcnow() + timedelta(hours=1, milliseconds=300))
    reply = await asyncio.wait_for(_ask(hub, probe, clock_off=timedelta(hours=1)), timeout=10)
    assert reply.connection is None and reply.held
    assert loop.time() - began >= 0.25  # held until then (and not the cap's 30 s: wait_for would have failed)


async def test_a_clock_far_off_holds_no_longer_than_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(activities, "MAX_PROBE_HOLD", timedelta(milliseconds=200))
    hub = Hub()
    reply = await asyncio.wait_for(_ask(hub, _probe(timedelta(hours=1))), timeout=10)
    assert reply.connection is None and reply.held


async def test_a_retiring_gateway_answers_its_held_probes_at_once_and_not_held() -> None:
    """Its sockets closed, the process retires (``Gateway.retire``): the probes it holds end now, saying they did not
    look at ``answer_at`` (the workflow asks again then, and finds the gateway gone); none is held after that."""
    hub = Hub()
    asked = _probe(timedelta(seconds=30))
    probe = asyncio.ensure_future(_ask(hub, asked))
    await asyncio.sleep(0.05)
    assert not probe.done()
    hub.stop_holding()
    reply = await asyncio.wait_for(probe, timeout=10)
    assert reply.connection is None and not reply.held
    assert not hub._awaited
    later = await asyncio.wait_for(_ask(hub, _probe(timedelta(seconds=30))), timeout=10)
    assert later.connection is None and not later.held
