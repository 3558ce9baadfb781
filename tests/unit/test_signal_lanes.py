"""The gateway's per-executor signal order (``signals.SignalLanes``): one executor's signals go out one at a time,
in the order they were queued; those overtaken by a newer connection are dropped; other executors do not wait."""

from __future__ import annotations

import asyncio

import pytest

from gateway.signals import SignalLanes

EX = ("acme", "shop", "ex-1")


class Wire:
    """Records what was sent; each send blocks until the test releases it (a slow Temporal)."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.gates: dict[str, asyncio.Event] = {}

    def send(self, what: str) -> asyncio.Future[bool]:
        gate = self.gates.setdefault(what, asyncio.Event())

        async def go() -> bool:
            self.sent.append(what)
            await gate.wait()
            return True

        return asyncio.ensure_future(go())

    def release(self, what: str) -> None:
        self.gates.setdefault(what, asyncio.Event()).set()


def _queue(lanes: SignalLanes, wire: Wire, executor: tuple[str, str, str], connection: str, connected: bool
           ) -> asyncio.Task[bool]:
    what = f"{'connected' if connected else 'disconnected'}:{connection}"
    return asyncio.create_task(lanes.send(executor, connection, connected=connected, send=lambda: wire.send(what)))


async def _turns() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_one_executors_signals_go_one_at_a_time_in_order() -> None:
    lanes, wire = SignalLanes(), Wire()
    first = _queue(lanes, wire, EX, "a", True)
    second = _queue(lanes, wire, EX, "a", False)
    await _turns()
    assert wire.sent == ["connected:a"]  # the disconnect waits for the connect to land
    wire.release("connected:a")
    await _turns()
    assert wire.sent == ["connected:a", "disconnected:a"]
    wire.release("disconnected:a")
    assert all(await asyncio.wait_for(asyncio.gather(first, second), 5))
    assert len(lanes) == 0  # nothing kept once the lane is empty


async def test_signals_overtaken_by_a_newer_connection_are_dropped() -> None:
    lanes, wire = SignalLanes(), Wire()
    tasks = [_queue(lanes, wire, EX, "a", True)]
    await _turns()
    tasks += [_queue(lanes, wire, EX, "a", False), _queue(lanes, wire, EX, "b", True),
              _queue(lanes, wire, EX, "b", False), _queue(lanes, wire, EX, "c", True)]
    await _turns()
    for what in ("connected:a", "connected:c"):
        wire.release(what)
    assert all(await asyncio.wait_for(asyncio.gather(*tasks), 5))
    # a's disconnect and all of b came after c's connect was queued: c supersedes them in the workflow.
    assert wire.sent == ["connected:a", "connected:c"]


async def test_a_disconnect_queued_after_the_lane_emptied_is_sent() -> None:
    lanes, wire = SignalLanes(), Wire()
    wire.release("connected:a")
    assert await _queue(lanes, wire, EX, "a", True)
    wire.release("disconnected:a")
    assert await _queue(lanes, wire, EX, "a", False)
    assert wire.sent == ["connected:a", "disconnected:a"]


async def test_a_newer_connections_disconnect_is_not_dropped_by_an_older_ones() -> None:
    """Supersede on one gateway: b's connect is queued, then the superseded a's socket closes."""
    lanes, wire = SignalLanes(), Wire()
    blocker = _queue(lanes, wire, EX, "a", True)
    await _turns()
    b_connected = _queue(lanes, wire, EX, "b", True)
    a_disconnected = _queue(lanes, wire, EX, "a", False)
    for what in ("connected:a", "connected:b"):
        wire.release(what)
    assert all(await asyncio.wait_for(asyncio.gather(blocker, b_connected, a_disconnected), 5))
    assert wire.sent == ["connected:a", "connected:b"]  # a's late disconnect would only be ignored


async def test_executors_do_not_wait_for_each_other() -> None:
    lanes, wire = SignalLanes(), Wire()
    slow = _queue(lanes, wire, EX, "a", True)
    other = _queue(lanes, wire, ("acme", "shop", "ex-2"), "z", True)
    wire.release("connected:z")
    assert await asyncio.wait_for(other, 1)
    assert not slow.done()
    wire.release("connected:a")
    assert await slow


async def test_a_cancelled_waiter_does_not_stall_the_lane() -> None:
    lanes, wire = SignalLanes(), Wire()
    first = _queue(lanes, wire, EX, "a", True)
    waiting = _queue(lanes, wire, EX, "a", False)
    await _turns()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    wire.release("connected:a")
    assert await first
    wire.release("connected:b")
    assert await asyncio.wait_for(_queue(lanes, wire, EX, "b", True), 1)
    assert wire.sent == ["connected:a", "connected:b"]
