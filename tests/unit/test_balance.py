"""Gateways that stay balanced (``gateway.balance``), piece by piece on a real SQLite store: the share, what a
gateway over it closes and what it never closes, the reports it goes by, and the handoff that keeps a closed
executor's disconnect from starting a grace. Behind HAProxy with real gateways: tests/e2e/test_rebalance.py."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from pathlib import Path

import pytest

from core import metrics
from core.models import make_engine
from core.settings import Settings
from core.store import Store
from gateway.balance import REBALANCE_CLOSE_CODE, REBALANCED_OPERATION, Balancer, excess
from gateway.hub import Connection, Hub
from gateway.session import Session
from workflows.contracts.common import ExecutorInfo, ExecutorStatus

MINE, PEER = "relay-gateway-mine", "relay-gateway-peer"


@pytest.mark.parametrize(("counts", "mine", "closes"), [
    ({"a": 6}, "a", 0),  # alone
    ({"a": 6, "b": 0}, "a", 3),  # every socket on the gateway restarted first
    ({"a": 0, "b": 6}, "a", 0),  # under its share: the other one sheds
    ({"a": 10, "b": 10}, "a", 0),
    ({"a": 11, "b": 9}, "a", 1),  # a spread of 2 on a share of 10: more than 10 %
    ({"a": 11, "b": 10}, "a", 0),  # 1 on 10.5: within
    ({"a": 4, "b": 3}, "a", 0),  # over by half a socket: nothing whole to move
    ({"a": 12, "b": 9, "c": 9}, "a", 2),
    ({"a": 20_000, "b": 20_000, "c": 0}, "a", 6666),
    ({"a": 10_400, "b": 9_600}, "a", 0),  # 8 % apart
])
def test_a_gateway_closes_what_it_holds_over_the_even_share(counts: dict[str, int], mine: str, closes: int) -> None:
    assert excess(counts, mine, 0.1) == closes


class Socket:
    """What a ``Connection`` closes through; records the close."""

    def __init__(self) -> None:
        self.closed: list[int] = []

    async def send(self, frame: str) -> None:
        pass

    async def close(self, code: int, reason: str) -> None:
        self.closed.append(code)


class Stand:
    """A gateway's balancer over a real store and hub; the disconnects it lets through are recorded."""

    def __init__(self, tmp_path: Path, **settings: object) -> None:
        self.store = Store(make_engine(f"sqlite:///{tmp_path / 'relay.db'}"))
        self.store.ensure_app("o", "a")
        self.hub = Hub()
        self.accepting = True
        self.disconnected: list[tuple[str, str]] = []
        self.sockets: dict[str, Socket] = {}
        defaults: dict[str, object] = {"gateway_rebalance_per_second": 1000, "gateway_rebalance_check_secs": 0.2,
                                       "gateway_rebalance_handoff_secs": 0.6}
        self.balancer = Balancer(settings=Settings.model_validate({"data_dir": tmp_path} | defaults | settings),
                                 store=self.store,
                                 hub=self.hub, task_queue=MINE, accepting=lambda: self.accepting,
                                 disconnect=lambda org, app, eid, cid: self.disconnected.append((eid, cid)))
        self.store.gateways.register(MINE, "gateway-mine")
        self.store.gateways.register(PEER, "gateway-peer")

    def hold(self, executor_id: str, *, landed: bool = True) -> Connection:
        socket = self.sockets[executor_id] = Socket()
        conn = Connection(connection_id=f"c-{executor_id}", org="o", app="a", executor_id=executor_id,
                          session=Session(), send=socket.send, close=socket.close)
        conn.landed = landed
        self.hub.attach(conn)
        self.store.record_status(org="o", app="a", executor_id=executor_id, status=ExecutorStatus.HEALTHY,
                                 operation="executor.healthy", event_key=f"{executor_id}/1",
                                 connection_id=conn.connection_id, gateway_queue=MINE, details={},
                                 info=ExecutorInfo(executor_id, application_version="v1"))
        return conn

    def closed(self) -> set[str]:
        return {eid for eid, socket in self.sockets.items() if socket.closed}

    def gone(self, executor_id: str) -> None:
        """The socket closed (the executor answered the close): as ``Gateway.socket_closed`` does."""
        conn = self.hub.get("o", "a", executor_id)
        self.hub.detach(conn)
        assert conn.shed
        self.balancer.hand_off(conn)

    def moved(self, executor_id: str) -> None:
        """Its new gateway wrote its new connection."""
        self.store.record_status(org="o", app="a", executor_id=executor_id, status=ExecutorStatus.HEALTHY,
                                 operation="executor.healthy", event_key=f"{executor_id}/2",
                                 connection_id=f"c-{executor_id}-new", gateway_queue=PEER, details={},
                                 info=ExecutorInfo(executor_id, application_version="v1"))


async def _introduce(stand: Stand) -> None:
    """The peer reports an empty gateway taking sockets, and has done so for a whole check (0.2 s) when this returns:
    only then is it counted (a load balancer puts a new gateway in its rotation only after its health checks)."""
    stand.store.gateways.report(PEER, sockets=0, accepting=True)
    assert await stand.balancer.tick() == 0  # seen for the first time: not counted yet
    await asyncio.sleep(0.2)
    stand.store.gateways.report(PEER, sockets=0, accepting=True)


async def _taken_in(stand: Stand) -> None:
    async with asyncio.timeout(5):
        while stand.balancer.holding():  # noqa: ASYNC110 - the balancer has no event for "all taken in"
            await asyncio.sleep(0.02)


def _shed() -> float:
    return metrics.REGISTRY.get_sample_value("relay_gateway_rebalance_shed_total") or 0.0


def _handoffs(outcome: str) -> float:
    return metrics.REGISTRY.get_sample_value("relay_gateway_rebalance_handoffs_total", {"outcome": outcome}) or 0.0


async def test_the_excess_is_closed_with_1012_idle_and_landed_executors_only(tmp_path: Path) -> None:
    stand = Stand(tmp_path)
    for n in range(8):
        stand.hold(f"e{n}")
    stand.hold("new", landed=False)  # its connected has not landed yet
    busy = stand.hold("busy")
    waiting = asyncio.create_task(busy.request("r1", "{}", timeout=timedelta(seconds=5)))  # a recovery in flight
    await asyncio.sleep(0)
    await _introduce(stand)
    before = _shed()
    assert await stand.balancer.tick() == 5  # 10 held, 0 there: 5 over the share
    assert len(stand.closed()) == 5
    assert not stand.closed() & {"new", "busy"}
    assert all(stand.sockets[e].closed == [REBALANCE_CLOSE_CODE] for e in stand.closed())
    assert _shed() == before + 5
    assert metrics.REGISTRY.get_sample_value("relay_gateway_fair_share") == 5
    waiting.cancel()


async def test_a_batch_waits_for_the_last_to_be_taken_in_and_for_fresh_reports(tmp_path: Path) -> None:
    stand = Stand(tmp_path)
    for n in range(6):
        stand.hold(f"e{n}")
    await _introduce(stand)
    assert await stand.balancer.tick() == 3
    first = stand.closed()
    for executor_id in first:
        stand.gone(executor_id)
    # Still held back: nothing more is closed, whatever the counts say.
    assert await stand.balancer.tick() == 0
    for executor_id in first:
        stand.moved(executor_id)
    await _taken_in(stand)
    # Taken in, but the peer's count is from before: no second batch on it.
    assert await stand.balancer.tick() == 0
    stand.store.gateways.report(PEER, sockets=3, accepting=True)
    assert await stand.balancer.tick() == 0  # 3 : 3
    assert stand.closed() == first
    assert stand.disconnected == []  # none of them counted as a disconnect


async def test_nothing_is_shed_toward_a_peer_silent_since_the_last_check(tmp_path: Path) -> None:
    """A peer killed right after it reported: its executors come here while its last report still counts. Nothing is
    closed toward it (they would come straight back) until it reports again, alive after all."""
    stand = Stand(tmp_path)
    for n in range(3):
        stand.hold(f"e{n}")
    await _introduce(stand)
    stand.store.gateways.report(PEER, sockets=3, accepting=True)
    assert await stand.balancer.tick() == 0  # 3 : 3, balanced
    for n in range(3, 6):  # the peer's executors, here now; the peer says nothing more
        stand.hold(f"e{n}")
    assert await stand.balancer.tick() == 0  # 6 here, the peer's 3 from before this gateway's last check
    assert stand.closed() == set()
    stand.store.gateways.report(PEER, sockets=0, accepting=True)  # it was alive after all
    assert await stand.balancer.tick() == 3
    assert len(stand.closed()) == 3


async def test_a_closed_executor_not_back_within_the_handoff_is_disconnected_then(tmp_path: Path) -> None:
    stand = Stand(tmp_path)
    for n in range(4):
        stand.hold(f"e{n}")
    await _introduce(stand)
    moved, lost = _handoffs("moved"), _handoffs("disconnected")
    assert await stand.balancer.tick() == 2
    back, dead = sorted(stand.closed())
    closed_at = time.monotonic()
    stand.gone(back)
    stand.gone(dead)
    stand.moved(back)
    await _taken_in(stand)
    # The one back elsewhere is never disconnected; the other only once the handoff (0.6 s) is over.
    assert stand.disconnected == [(dead, f"c-{dead}")]
    assert time.monotonic() - closed_at >= 0.6
    assert (_handoffs("moved"), _handoffs("disconnected")) == (moved + 1, lost + 1)


async def test_a_stopping_gateway_sends_every_held_disconnect_at_once(tmp_path: Path) -> None:
    stand = Stand(tmp_path, gateway_rebalance_handoff_secs=60)
    for n in range(4):
        stand.hold(f"e{n}")
    await _introduce(stand)
    assert await stand.balancer.tick() == 2
    for executor_id in stand.closed():
        stand.gone(executor_id)
    assert await stand.balancer.stop() == 2
    assert sorted(eid for eid, _ in stand.disconnected) == sorted(stand.closed())


async def test_nothing_is_closed_while_draining_alone_switched_off_or_beside_a_silent_peer(tmp_path: Path) -> None:
    stand = Stand(tmp_path)
    for n in range(6):
        stand.hold(f"e{n}")
    assert await stand.balancer.tick() == 0  # the peer never reported: not counted on
    stand.store.gateways.report(PEER, sockets=0, accepting=False)  # draining
    assert await stand.balancer.tick() == 0
    stand.store.gateways.mark_gone(PEER, "retired")
    stand.store.gateways.report(PEER, sockets=0, accepting=True)  # a row known gone is not written
    assert await stand.balancer.tick() == 0
    stand.store.gateways.register(PEER, "gateway-peer")
    stand.store.gateways.report(PEER, sockets=0, accepting=True)
    stand.accepting = False
    assert await stand.balancer.tick() == 0
    assert stand.store.gateways.live_counts(timedelta(minutes=1)).keys() == {PEER}  # it said it is not accepting
    (tmp_path / "off").mkdir()
    off = Stand(tmp_path / "off", gateway_rebalance=False)
    for n in range(6):
        off.hold(f"e{n}")
    await _introduce(off)
    assert await off.balancer.tick() == 0
    stand.accepting = True
    await _introduce(stand)
    assert await stand.balancer.tick() == 3
    assert stand.closed()


async def test_a_rebalance_is_one_audit_row_per_org_when_the_spread_is_within_the_tolerance(tmp_path: Path) -> None:
    stand = Stand(tmp_path)
    for n in range(6):
        stand.hold(f"e{n}")
    await _introduce(stand)
    assert await stand.balancer.tick() == 3
    assert [r for r in stand.store.list_audit("o") if r.operation == REBALANCED_OPERATION] == []
    for executor_id in stand.closed():
        stand.gone(executor_id)
        stand.moved(executor_id)
    await _taken_in(stand)
    stand.store.gateways.report(PEER, sockets=3, accepting=True)
    assert await stand.balancer.tick() == 0
    rows = [r for r in stand.store.list_audit("o") if r.operation == REBALANCED_OPERATION]
    assert len(rows) == 1
    details = rows[0].details or {}
    assert details["closed"] == 3 and sorted(details["executors"]) == sorted(stand.closed())
    assert details["before"] == {MINE: 6, PEER: 0} and details["after"] == {MINE: 3, PEER: 3}
