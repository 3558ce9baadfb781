"""The shipped load-balancer configuration (deploy/haproxy/haproxy.cfg) run by Debian's haproxy in front of two
`relay gateway`s: executors dial the load balancer, one gateway is SIGKILLed, and they are back through the other
before Relay's grace runs out, so nothing is recovered; the load balancer's log never holds an API key.

The configuration file is used as shipped: only the addresses it reads from the environment are filled in.
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import (
    Process,
    RawPeer,
    Relay,
    audit_rows,
    free_port,
    ready,
    registry,
    start_gateways,
    wait_until,
)

pytestmark = pytest.mark.e2e
HAPROXY = Path("/usr/sbin/haproxy")
CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "haproxy" / "haproxy.cfg"
HEARTBEAT_TIMEOUT = 2.0
GRACE = 3  # executorTimeoutSecs: a reconnection through the load balancer must beat it by far
EXECUTORS = 6
APP = "behind-lb"


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[tuple[Relay, list[Process], Path]]:
    """Temporal dev server, `relay worker`, two `relay gateway`s on one SQLite database, and HAProxy in front.
    Yields the Relay as seen through the load balancer, the two gateway processes and HAProxy's log."""
    if not HAPROXY.exists():
        pytest.skip("Debian's haproxy is not installed (make test installs it)")
    processes: list[Process] = []
    try:
        # Rebalancing off: this is the load balancer's failover alone (tests/e2e/test_rebalance.py has the
        # rebalance behind HAProxy). The test counts a second handshake on the live gateway as a disturbance, and a
        # rebalance's close is one: before the kill (leastconn spreading unevenly under load), or, before the
        # balancer waited for every peer to report again, toward the killed gateway while its last report counted.
        started = start_gateways(tmp_path, processes, RELAY_GATEWAY_HEARTBEAT_TIMEOUT_SECS=str(HEARTBEAT_TIMEOUT),
                                 RELAY_GATEWAY_REBALANCE="false")
        env, key, ports, gateways = started.env, started.key, started.ports, started.processes
        lb_port, log = free_port(), tmp_path / "haproxy.log"
        lb_env = {"PATH": "/usr/bin:/bin", "LB_BIND": f"127.0.0.1:{lb_port}",
                  "LB_METRICS_BIND": f"127.0.0.1:{free_port()}",
                  "GATEWAY_1": f"127.0.0.1:{ports[0]}", "GATEWAY_2": f"127.0.0.1:{ports[1]}"}
        processes.append(Process([str(HAPROXY), "-db", "-f", str(CONFIG)], env=lb_env, log=log))
        lb = Relay(processes[-1], f"http://127.0.0.1:{lb_port}", f"ws://127.0.0.1:{lb_port}/", key, tmp_path, env)
        wait_until(lambda: ready(lb.url), timeout=20, what="/readyz through HAProxy")
        yield lb, gateways, log
    finally:
        for process in reversed(processes):
            process.stop()



def test_executors_move_to_the_live_gateway_through_haproxy(stack: tuple[Relay, list[Process], Path]) -> None:
    lb, gateways, log = stack
    with lb.api() as api:  # REST through the load balancer too
        assert api.put(f"/v2/orgs/local/apps/{APP}").status_code == 204
        assert api.patch(f"/v2/orgs/local/apps/{APP}", json={"executorTimeoutSecs": GRACE}).status_code == 204
    ids = [f"x{n}" for n in range(EXECUTORS)]
    peers = [RawPeer(lb.ws_url, APP, lb.key, executor_id) for executor_id in ids]
    try:
        wait_until(lambda: registry(lb.data_dir, APP) == dict.fromkeys(ids, "HEALTHY"), timeout=20,
                   what="every executor HEALTHY through HAProxy")
        moved = _on_gateway(lb.data_dir, "gateway-1")
        # leastconn spread them: some are on the gateway about to be killed (else nothing is tested), not all of them.
        assert 0 < len(moved) < EXECUTORS, moved
        gateways[0].kill()
        wait_until(lambda: all(p.handshakes >= 2 for p in peers if p.executor_id in moved), timeout=10,
                   what="the killed gateway's executors reconnecting")
        # The watch finds the gateway gone within twice its heartbeat timeout; a grace later, anything it had
        # disconnected for good would be DEAD. Every executor stays (or is again) HEALTHY all along that span.
        deadline_passed = 2 * HEARTBEAT_TIMEOUT + GRACE + 3
        _stays_healthy(lb, ids, deadline_passed)
        rows = audit_rows(lb.data_dir, APP)
        bad = [(r.operation, r.executor_id) for r in rows
               if r.operation == "executor.dead" or r.operation.startswith("executor.recovery.")]
        assert bad == [], bad
        # The live gateway's executors were never disturbed.
        assert {p.executor_id: p.handshakes for p in peers if p.executor_id not in moved} == \
            {executor_id: 1 for executor_id in ids if executor_id not in moved}
    finally:
        for peer in peers:
            peer.stop()
    _log_has_no_key(log.read_text(errors="replace"), lb.key)


def _on_gateway(data_dir: Path, identity: str) -> set[str]:
    """The executors whose socket is held by the gateway process running as ``identity``, read from Relay's database."""
    with contextlib.closing(sqlite3.connect(data_dir / "relay.db", timeout=10)) as db:
        rows = db.execute("SELECT e.executor_id FROM executor e JOIN gatewayprocess g ON e.gateway_queue = g.queue "
                          "WHERE e.app = ? AND g.identity = ?", (APP, identity)).fetchall()
    return {str(executor_id) for (executor_id,) in rows}


def _stays_healthy(lb: Relay, ids: list[str], seconds: float) -> None:
    """Every executor HEALTHY at the end of ``seconds``, and never DEAD (nor gone) in between."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        seen = registry(lb.data_dir, APP)
        assert set(seen) == set(ids) and "DEAD" not in seen.values(), seen
        time.sleep(0.2)
    assert registry(lb.data_dir, APP) == dict.fromkeys(ids, "HEALTHY")


def _log_has_no_key(text: str, key: str) -> None:
    sockets = [line for line in text.splitlines() if "/websocket/" in line]
    # Lines were written (an executor socket is logged when it ends: the killed gateway's and the stopped peers').
    assert sockets, text[-2000:]
    assert key not in text
    assert all(re.search(r'"/websocket/\.\.\." ', line) for line in sockets), sockets
    assert not re.search(r"/websocket/(?!\.\.\.)", text), text[-2000:]
    # REST requests keep their path (their key travels in a header, never logged).
    assert f'"/v2/orgs/local/apps/{APP}"' in text, text[-2000:]
