"""A gateway that dies sends no `disconnected`: the gateway watch workflow notices and disconnects the
executors it held. Real processes: a Temporal dev server, `relay worker` and `relay gateway`, separately."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.rawclient import RawClient
from tests.support import (
    VENV_BIN,
    Process,
    RawPeer,
    Relay,
    audit_rows,
    free_port,
    healthy,
    registry,
    relay_env,
    start_temporal,
    wait_until,
)

pytestmark = pytest.mark.e2e
HEARTBEAT_TIMEOUT = 2.0


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[dict[str, str], Process]]:
    """An embedded-style Temporal dev server, run on its own, and a `relay worker` against it."""
    temporal, address = start_temporal(tmp_path)
    env = relay_env(tmp_path, RELAY_TEMPORAL_ADDRESS=address,
                    RELAY_GATEWAY_HEARTBEAT_TIMEOUT_SECS=str(HEARTBEAT_TIMEOUT))
    worker = Process([str(VENV_BIN / "relay"), "worker"], env=env, log=tmp_path / "worker.log")
    try:
        yield env, worker
    finally:
        worker.stop()
        temporal.stop()


def _gateway(env: dict[str, str], data_dir: Path, key: str, log: str) -> Relay:
    process = Process([str(VENV_BIN / "relay"), "gateway"], env=env, log=data_dir / log)
    relay = Relay(process, f"http://127.0.0.1:{env['RELAY_PORT']}", f"ws://127.0.0.1:{env['RELAY_PORT']}/", key,
                  data_dir)

    try:
        wait_until(lambda: healthy(relay.url), timeout=60, what="gateway up")
    except AssertionError:
        process.stop()
        raise
    return relay


def test_killed_gateway_disconnects_its_executors(cluster: tuple[dict[str, str], Process], tmp_path: Path) -> None:
    env, _worker = cluster
    key = subprocess.run([str(VENV_BIN / "relay"), "keys", "create"], env=env, check=True, capture_output=True,
                         text=True, timeout=60).stdout.strip()
    first = _gateway(env, tmp_path, key, "gateway-1.log")
    client: RawClient | None = None
    try:
        with first.api() as api:
            api.put("/v2/orgs/local/apps/watched-app")
            api.patch("/v2/orgs/local/apps/watched-app", json={"executorTimeoutSecs": 60})
        client = RawClient(f"{first.ws_url}websocket/watched-app/{key}")
        client.handshake("held-1")
        wait_until(lambda: first.executors("watched-app").get("held-1") == "HEALTHY", timeout=10, what="HEALTHY")
        first.process.kill()  # no `disconnected` can come from it now
    finally:
        if client is not None:
            client.close()
        first.process.stop()

    second = _gateway(env, tmp_path, key, "gateway-2.log")  # same port: the REST API is back, the socket is not
    try:
        wait_until(lambda: second.executors("watched-app").get("held-1") == "DISCONNECTED",
                   timeout=HEARTBEAT_TIMEOUT + 8, what="DISCONNECTED after the gateway died")
        ops = [op for op, ex in second.audit("watched-app") if ex == "held-1"]
        assert ops == ["executor.healthy", "executor.disconnected"], ops
    finally:
        second.process.stop()


def test_peer_gateway_killed_mid_recovery_moves_on_to_a_peer_elsewhere(
    cluster: tuple[dict[str, str], Process], tmp_path: Path
) -> None:
    """The recovery request is on its way through the peer's gateway when that gateway is SIGKILLed: the
    socket-bound activity's heartbeat timeout fails the attempt, and a peer on another gateway recovers."""
    env, _worker = cluster
    key = subprocess.run([str(VENV_BIN / "relay"), "keys", "create"], env=env, check=True, capture_output=True,
                         text=True, timeout=60).stdout.strip()
    app = "two-gateways"
    first = _gateway(env, tmp_path, key, "gateway-1.log")
    second = _gateway({**env, "RELAY_PORT": str(free_port())}, tmp_path, key, "gateway-2.log")
    peers: list[RawPeer] = []
    try:
        with first.api() as api:
            api.put(f"/v2/orgs/local/apps/{app}")
            api.patch(f"/v2/orgs/local/apps/{app}", json={"executorTimeoutSecs": 1})
        stuck = RawPeer(second.ws_url, app, key, "stuck", answer=lambda request: None, reconnect=False)
        dead = RawPeer(first.ws_url, app, key, "dead")
        peers += [stuck, dead]
        wait_until(lambda: registry(tmp_path, app) == {"stuck": "HEALTHY", "dead": "HEALTHY"}, timeout=15,
                   what="both HEALTHY")
        dead.stop()
        wait_until(lambda: stuck.requests_of("recovery"), timeout=15, what="the recovery request at the stuck peer")
        second.process.kill()  # mid-request: no reply, no `disconnected`, no activity failure from it
        rescuer = RawPeer(first.ws_url, app, key, "rescuer")
        peers.append(rescuer)
        wait_until(lambda: "dead" not in registry(tmp_path, app), timeout=40, what="recovered through the rescuer")
        # Once for "dead" (the stuck peer, DISCONNECTED with its gateway, is then recovered by the rescuer too).
        assert [r["executor_ids"] for r in rescuer.requests_of("recovery")].count(["dead"]) == 1
        rows = [r for r in audit_rows(tmp_path, app, "dead") if r.operation.startswith("executor.recovery.")]
        assert [(r.operation, r.details.get("candidate")) for r in rows] == [
            ("executor.recovery.dispatched", "stuck"), ("executor.recovery.failed", "stuck"),
            ("executor.recovery.dispatched", "rescuer"), ("executor.recovery.succeeded", "rescuer"),
        ], rows
        # The gateway watch saw the stuck peer's gateway go (it is then recovered in turn, by the rescuer).
        assert "executor.disconnected" in [r.operation for r in audit_rows(tmp_path, app, "stuck")]
    finally:
        for peer in peers:
            peer.stop()
        second.process.stop()
        first.process.stop()
