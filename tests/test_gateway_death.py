"""A gateway that dies sends no `disconnected`: the gateway watch workflow notices and disconnects the
executors it held. Real processes: a Temporal dev server, `relay worker` and `relay gateway`, separately."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.rawclient import RawClient
from tests.support import VENV_BIN, Process, Relay, healthy, relay_env, start_temporal, wait_until

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
