"""Gateways that stay balanced (``gateway.balance``) behind the shipped HAProxy configuration (Debian's haproxy,
``leastconn``): two `relay gateway`s rolled one at a time as the README's procedure says (SIGTERM, wait for the exit,
start the replacement, wait until the load balancer has it UP), then the sockets, all on the gateway restarted first,
spread back to within 10 % of even, with no executor DISCONNECTED for it and none DEAD.

The rebalance runs on its defaults (a check every 5 s, 5 a second, a 10 s handoff); the executors are protocol
clients that reconnect as the SDKs do after a close. Units of the balancer: tests/unit/test_balance.py.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support import (
    VENV_BIN,
    Process,
    RawPeer,
    Relay,
    free_port,
    ready,
    registry,
    start_gateways,
    wait_until,
)

pytestmark = pytest.mark.e2e
HAPROXY = Path("/usr/sbin/haproxy")
CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "haproxy" / "haproxy.cfg"
GRACE = 10  # executorTimeoutSecs: the drain's reconnections are well inside it
EXECUTORS = 20
APP = "rolled"
BALANCED_WITHIN = 60.0  # seconds after the last replacement is UP


@dataclass
class Fleet:
    lb: Relay
    gateways: list[Process]
    env: dict[str, str]
    ports: list[int]
    lb_metrics: str
    processes: list[Process]

    def roll(self, n: int) -> None:
        """Gateway ``n`` (1-based): SIGTERM, wait for its exit (the drain), start its replacement under the same
        identity and port, and wait until HAProxy has it UP."""
        assert self.gateways[n - 1].stop(timeout=30) == 0
        env = {**self.env, "RELAY_PORT": str(self.ports[n - 1]), "RELAY_GATEWAY_ID": f"gateway-{n}"}
        replacement = Process([str(VENV_BIN / "relay"), "gateway"], log=self.lb.data_dir / f"gateway-{n}b.log", env=env)
        self.processes.append(replacement)
        self.gateways[n - 1] = replacement
        wait_until(lambda: ready(f"http://127.0.0.1:{self.ports[n - 1]}"), timeout=60, what=f"gateway-{n} ready")
        wait_until(lambda: self.up(f"gateway-{n}"), timeout=20, what=f"gateway-{n} UP in HAProxy")

    def up(self, server: str) -> bool:
        try:
            text = httpx.get(self.lb_metrics, timeout=5).text
        except httpx.TransportError:  # HAProxy still starting
            return False
        state = rf'haproxy_server_status{{proxy="gateways",server="{server}",state="UP"}} 1\b'
        return re.search(state, text) is not None


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    if not HAPROXY.exists():
        pytest.skip("Debian's haproxy is not installed (make test installs it)")
    processes: list[Process] = []
    try:
        started = start_gateways(tmp_path, processes)
        lb_port, metrics_port = free_port(), free_port()
        lb_env = {"PATH": "/usr/bin:/bin", "LB_BIND": f"127.0.0.1:{lb_port}",
                  "LB_METRICS_BIND": f"127.0.0.1:{metrics_port}",
                  "GATEWAY_1": f"127.0.0.1:{started.ports[0]}", "GATEWAY_2": f"127.0.0.1:{started.ports[1]}"}
        processes.append(Process([str(HAPROXY), "-db", "-f", str(CONFIG)], env=lb_env, log=tmp_path / "haproxy.log"))
        lb = Relay(processes[-1], f"http://127.0.0.1:{lb_port}", f"ws://127.0.0.1:{lb_port}/", started.key, tmp_path,
                   started.env)
        fleet = Fleet(lb, started.processes, started.env, started.ports, f"http://127.0.0.1:{metrics_port}/metrics",
                      processes)
        wait_until(lambda: fleet.up("gateway-1") and fleet.up("gateway-2"), timeout=20, what="both gateways UP")
        yield fleet
    finally:
        for process in reversed(processes):
            process.stop()


def test_after_a_rolling_restart_the_sockets_spread_back_within_ten_percent(fleet: Fleet) -> None:
    lb = fleet.lb
    with lb.api() as api:
        assert api.put(f"/v2/orgs/local/apps/{APP}").status_code == 204
        assert api.patch(f"/v2/orgs/local/apps/{APP}", json={"executorTimeoutSecs": GRACE}).status_code == 204
    ids = [f"x{n:02d}" for n in range(EXECUTORS)]
    peers = []
    try:
        for executor_id in ids:
            peers.append(RawPeer(lb.ws_url, APP, lb.key, executor_id))
        wait_until(lambda: registry(lb.data_dir, APP) == dict.fromkeys(ids, "HEALTHY"), timeout=30,
                   what="every executor HEALTHY through HAProxy")
        fleet.roll(1)
        fleet.roll(2)
        rolled_at = time.monotonic()
        disconnects_at_roll = len(_audit(lb.data_dir, "executor.disconnected"))
        rebalances_at_roll = len(_audit(lb.data_dir, "gateway.rebalanced"))
        _no_dead(lb.data_dir)
        samples: list[tuple[float, dict[str, int]]] = []

        def balanced() -> bool:
            counts = _per_gateway(lb.data_dir)
            samples.append((round(time.monotonic() - rolled_at, 1), counts))
            _no_dead(lb.data_dir)
            return len(counts) == 2 and abs(counts["gateway-1"] - counts["gateway-2"]) <= 0.1 * EXECUTORS
        took = wait_until(balanced, timeout=BALANCED_WITHIN, interval=1, what="the sockets within 10 % of even") \
            - rolled_at
        print("\nbalance after the roll (s since gateway-2's replacement was UP: sockets on gateway-1, gateway-2): "
              + ", ".join(f"{t}: {c.get('gateway-1', 0)}/{c.get('gateway-2', 0)}" for t, c in samples[::3]))
        print(f"within 10 % of even {took:.1f} s after the roll")
        # Balanced it stays (nothing moves back and forth, nothing is lost) until the rebalance is over: audited when
        # a check after the last batch was taken in finds the spread within the tolerance.
        def over() -> bool:
            counts = _per_gateway(lb.data_dir)
            assert abs(counts.get("gateway-1", 0) - counts.get("gateway-2", 0)) <= 0.1 * EXECUTORS, counts
            _no_dead(lb.data_dir)
            return len(_audit(lb.data_dir, "gateway.rebalanced")) > rebalances_at_roll
        wait_until(over, timeout=30, interval=0.5, what="the rebalance audited")
        assert registry(lb.data_dir, APP) == dict.fromkeys(ids, "HEALTHY")
        rebalanced = _audit(lb.data_dir, "gateway.rebalanced")
        moved = {e for details in rebalanced for e in re.findall(r'"(x\d\d)"', details)}
        assert moved and moved <= set(ids)
        # A socket closed to rebalance is no disconnect: after the rolls (their drains' disconnects all written by
        # the time the replacement is UP), sockets were closed to rebalance and not one executor.disconnected row.
        assert len(_audit(lb.data_dir, "executor.disconnected")) == disconnects_at_roll
        assert len(rebalanced) > rebalances_at_roll
        assert all(peer.handshakes >= 2 for peer in peers)  # each moved at least once, as the drains made them
        # What a drain costs an executor (README, "Rolling a deploy"): briefly DISCONNECTED, an
        # executor.disconnected row per drain it went through, each followed by its new connection's row
        # (executor.reconnected; executor.superseded when that reached its workflow before the close did). The
        # rebalance's moves add superseded rows, never a disconnected one.
        for executor_id in ids:
            disconnected = len(_audit(lb.data_dir, "executor.disconnected", executor_id))
            back = sum(len(_audit(lb.data_dir, op, executor_id)) for op in ("executor.reconnected",
                                                                             "executor.superseded"))
            assert 1 <= disconnected <= 2 and back >= disconnected, executor_id
    finally:
        for peer in peers:
            peer.stop()


def _db(data_dir: Path, query: str, *args: object) -> list[tuple[object, ...]]:
    with contextlib.closing(sqlite3.connect(data_dir / "relay.db", timeout=10)) as db:
        return db.execute(query, args).fetchall()


def _per_gateway(data_dir: Path) -> dict[str, int]:
    """HEALTHY executors of the app by the identity of the gateway process holding them."""
    rows = _db(data_dir, "SELECT g.identity, count(*) FROM executor e JOIN gatewayprocess g "
                         "ON e.gateway_queue = g.queue WHERE e.app = ? AND e.status = 'HEALTHY' GROUP BY g.identity",
               APP)
    return {str(identity): int(str(n)) for identity, n in rows}


def _no_dead(data_dir: Path) -> None:
    assert "DEAD" not in registry(data_dir, APP).values()
    assert _audit(data_dir, "executor.dead") == []


def _audit(data_dir: Path, operation: str, executor_id: str | None = None) -> list[str]:
    rows = _db(data_dir, "SELECT details FROM auditlog WHERE operation = ? AND (? IS NULL OR executor_id = ?)",
               operation, executor_id, executor_id)
    return [str(details) for (details,) in rows]
