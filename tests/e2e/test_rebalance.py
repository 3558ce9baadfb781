"""Gateways that stay balanced (``gateway.balance``) behind the shipped HAProxy configuration (Debian's haproxy,
``leastconn``): two `relay gateway`s rolled one at a time as the compose guide's procedure says (SIGTERM, wait for the
exit, start the replacement, wait until the load balancer has it UP), then the sockets, all on the gateway restarted
first, spread back to within 10 % of even, with no executor DISCONNECTED for it and none DEAD.

The rebalance runs on its defaults (a check every 5 s, 5 a second, a 10 s handoff); the executors are protocol
clients that reconnect as the SDKs do after a close. Units of the balancer: tests/unit/test_balance.py.
"""

from __future__ import annotations

import contextlib
import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from tests.postgres import postgres_cluster
from tests.support import (
    VENV_BIN,
    Process,
    RawPeer,
    Relay,
    dbos_executor,
    free_port,
    ready,
    start_gateways,
    wait_until,
)

pytestmark = pytest.mark.e2e
HAPROXY = Path("/usr/sbin/haproxy")
CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "haproxy" / "haproxy.cfg"
GRACE = 10  # executorTimeoutSecs: the drain's reconnections are well inside it
EXECUTORS = 20
REAL = 4  # of them real dbos==3.2.0 executors; the others protocol clients
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
    db: str  # Relay's database, a SQLAlchemy URL

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
def fleet(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Fleet]:
    """Temporal, `relay worker`, two `relay gateway`s and HAProxy in front; on SQLite, or on PostgreSQL (a private
    cluster) when the test is parametrized so."""
    if not HAPROXY.exists():
        pytest.skip("Debian's haproxy is not installed (make test installs it)")
    processes: list[Process] = []
    with contextlib.ExitStack() as stack:
        if getattr(request, "param", "sqlite") == "postgresql":
            url = stack.enter_context(postgres_cluster()).create_database("fleet")
        else:
            url = f"sqlite:///{tmp_path / 'relay.db'}"
        yield from _fleet(tmp_path, processes, url)


def _fleet(tmp_path: Path, processes: list[Process], url: str) -> Iterator[Fleet]:
    try:
        started = start_gateways(tmp_path, processes, RELAY_DATABASE_URL=url)
        lb_port, metrics_port = free_port(), free_port()
        lb_env = {"PATH": "/usr/bin:/bin", "LB_BIND": f"127.0.0.1:{lb_port}",
                  "LB_METRICS_BIND": f"127.0.0.1:{metrics_port}",
                  "GATEWAY_1": f"127.0.0.1:{started.ports[0]}", "GATEWAY_2": f"127.0.0.1:{started.ports[1]}"}
        processes.append(Process([str(HAPROXY), "-db", "-f", str(CONFIG)], env=lb_env, log=tmp_path / "haproxy.log"))
        lb = Relay(processes[-1], f"http://127.0.0.1:{lb_port}", f"ws://127.0.0.1:{lb_port}/", started.key, tmp_path,
                   started.env)
        fleet = Fleet(lb, started.processes, started.env, started.ports, f"http://127.0.0.1:{metrics_port}/metrics",
                      processes, url)
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
    peers: list[RawPeer] = []
    real: list[Process] = []
    try:
        # Real dbos==3.2.0 executors among them (each on a system database of its own, started one after the other):
        # the SDK reconnects after the 1012 its gateway closes it with, as after a drain's.
        for n in range(REAL):
            real.append(dbos_executor(lb.ws_url, lb.key, APP, lb.data_dir / f"sys-{n}.db",
                                      lb.data_dir / f"executor-{n}.log"))
            wait_until(lambda n=n: len(_registry(fleet.db)) == n + 1, timeout=60, what="a real executor HEALTHY")
        raw = [f"x{n:02d}" for n in range(EXECUTORS - REAL)]
        for executor_id in raw:
            peers.append(RawPeer(lb.ws_url, APP, lb.key, executor_id))
        wait_until(lambda: list(_registry(fleet.db).values()) == ["HEALTHY"] * EXECUTORS, timeout=30,
                   what="every executor HEALTHY through HAProxy")
        ids = sorted(_registry(fleet.db))
        fleet.roll(1)
        fleet.roll(2)
        rolled_at = time.monotonic()
        disconnects_at_roll = len(_audit(fleet.db, "executor.disconnected"))
        rebalances_at_roll = len(_audit(fleet.db, "gateway.rebalanced"))
        _no_dead(fleet.db)
        samples: list[tuple[float, dict[str, int]]] = []

        def balanced() -> bool:
            counts = _per_gateway(fleet.db)
            samples.append((round(time.monotonic() - rolled_at, 1), counts))
            _no_dead(fleet.db)
            return len(counts) == 2 and abs(counts["gateway-1"] - counts["gateway-2"]) <= 0.1 * EXECUTORS
        took = wait_until(balanced, timeout=BALANCED_WITHIN, interval=1, what="the sockets within 10 % of even") \
            - rolled_at
        print("\nbalance after the roll (s since gateway-2's replacement was UP: sockets on gateway-1, gateway-2): "
              + ", ".join(f"{t}: {c.get('gateway-1', 0)}/{c.get('gateway-2', 0)}" for t, c in samples[::3]))
        print(f"within 10 % of even {took:.1f} s after the roll")
        # Balanced it stays (nothing moves back and forth, nothing is lost) until the rebalance is over: audited when
        # a check after the last batch was taken in finds the spread within the tolerance.
        def over() -> bool:
            counts = _per_gateway(fleet.db)
            assert abs(counts.get("gateway-1", 0) - counts.get("gateway-2", 0)) <= 0.1 * EXECUTORS, counts
            _no_dead(fleet.db)
            return len(_audit(fleet.db, "gateway.rebalanced")) > rebalances_at_roll
        wait_until(over, timeout=30, interval=0.5, what="the rebalance audited")
        assert _registry(fleet.db) == dict.fromkeys(ids, "HEALTHY")
        rebalanced = _audit(fleet.db, "gateway.rebalanced")
        moved = {e for details in rebalanced for e in json.loads(details)["executors"]}
        assert moved and moved <= set(ids)
        print(f"moved by rebalances: {len(moved)} executors, {len(moved - set(raw))} of them real dbos executors")
        # A socket closed to rebalance is no disconnect: after the rolls (their drains' disconnects all written by
        # the time the replacement is UP), sockets were closed to rebalance and not one executor.disconnected row.
        assert len(_audit(fleet.db, "executor.disconnected")) == disconnects_at_roll
        assert len(rebalanced) > rebalances_at_roll
        assert all(peer.handshakes >= 2 for peer in peers)  # each moved at least once, as the drains made them
        # What a drain costs an executor (docs/pages/guides/compose.md, "Rolling a deploy"): briefly DISCONNECTED, an
        # executor.disconnected row per drain it went through, each followed by its new connection's row
        # (executor.reconnected; executor.superseded when that reached its workflow before the close did). The
        # rebalance's moves add superseded rows, never a disconnected one.
        for executor_id in ids:
            disconnected = len(_audit(fleet.db, "executor.disconnected", executor_id))
            back = sum(len(_audit(fleet.db, op, executor_id)) for op in ("executor.reconnected",
                                                                             "executor.superseded"))
            assert 1 <= disconnected <= 2 and back >= disconnected, executor_id
    finally:
        for peer in peers:
            peer.stop()
        for process in real:
            process.stop()


@pytest.mark.parametrize("fleet", ["postgresql"], indirect=True)
def test_a_drain_on_postgresql_writes_each_disconnect_once_with_no_traceback(fleet: Fleet) -> None:
    """One gateway drained (SIGTERM) on PostgreSQL, as in production: its executors' disconnects are written by the
    gateway and by their workflows at once, under one key. Each lands once, and no writer fails on the key (before
    the insert-if-absent: a UniqueViolation on auditlog_event_key_key, a WARNING with its traceback and an activity
    retried, for 2 or 3 of every 9 sockets)."""
    lb = fleet.lb
    with lb.api() as api:
        assert api.put(f"/v2/orgs/local/apps/{APP}").status_code == 204
        assert api.patch(f"/v2/orgs/local/apps/{APP}", json={"executorTimeoutSecs": GRACE}).status_code == 204
    # Two workers, as the production topology runs (docs/pages/guides/compose.md): the workflows' writes come from both.
    fleet.processes.append(Process([str(VENV_BIN / "relay"), "worker"], env=fleet.env,
                                   log=lb.data_dir / "worker-2.log"))
    ids = [f"x{n:02d}" for n in range(EXECUTORS)]
    peers = []
    try:
        for executor_id in ids:
            peers.append(RawPeer(lb.ws_url, APP, lb.key, executor_id))
        wait_until(lambda: _registry(fleet.db) == dict.fromkeys(ids, "HEALTHY"), timeout=30, what="all HEALTHY")
        drained = [e for e, in _db(fleet.db, "SELECT e.executor_id FROM executor e JOIN gatewayprocess g ON "
                                             "e.gateway_queue = g.queue WHERE g.identity = 'gateway-1'")]
        assert drained, "leastconn put none on the gateway to drain"
        fleet.roll(1)
        wait_until(lambda: all(len(_audit(fleet.db, "executor.disconnected", str(e))) == 1 for e in drained)
                   and _registry(fleet.db) == dict.fromkeys(ids, "HEALTHY"), timeout=30,
                   what="every drained executor disconnected once and HEALTHY again")
        time.sleep(2)  # the workflows' own writes of those disconnects, a workflow task later
        # The worker runs the workflows' activities (begin_grace); the gateways write their own disconnects.
        logs = "".join(path.read_text(errors="replace") for path in lb.data_dir.glob("*.log")
                       if path.name != "temporal.log")
        worker = "".join(path.read_text(errors="replace") for path in lb.data_dir.glob("worker*.log"))
        failed = logs.count("UniqueViolation"), logs.count("Traceback"), worker.count("Completing activity as failed")
        print(f"\ndrain of {len(drained)} sockets on PostgreSQL: UniqueViolation {failed[0]}, tracebacks {failed[1]}, "
              f"activities failed (retried) {failed[2]}")
        assert failed == (0, 0, 0), logs[-3000:]
        assert all(len(_audit(fleet.db, "executor.disconnected", str(e))) == 1 for e in drained)
        _no_dead(fleet.db)
    finally:
        for peer in peers:
            peer.stop()


def _db(url: str, query: str, **params: object) -> list[tuple[object, ...]]:
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return [tuple(row) for row in conn.execute(text(query), params)]
    finally:
        engine.dispose()


def _per_gateway(url: str) -> dict[str, int]:
    """HEALTHY executors of the app by the identity of the gateway process holding them."""
    rows = _db(url, "SELECT g.identity, count(*) FROM executor e JOIN gatewayprocess g ON e.gateway_queue = g.queue "
                    "WHERE e.app = :app AND e.status = 'HEALTHY' GROUP BY g.identity", app=APP)
    return {str(identity): int(str(n)) for identity, n in rows}


def _no_dead(url: str) -> None:
    assert "DEAD" not in _registry(url).values()
    assert _audit(url, "executor.dead") == []


def _registry(url: str) -> dict[str, str]:
    return {str(e): str(status) for e, status in _db(url, "SELECT executor_id, status FROM executor WHERE app = :app",
                                                      app=APP)}


def _audit(url: str, operation: str, executor_id: str | None = None) -> list[str]:
    rows = _db(url, "SELECT details FROM auditlog WHERE operation = :op"
                    + (" AND executor_id = :executor_id" if executor_id is not None else ""),
               op=operation, executor_id=executor_id)
    return [json.dumps(details) if not isinstance(details, str) else details for (details,) in rows]
