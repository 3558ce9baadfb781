"""A wall-clock jump on the Relay host during a grace period changes nothing: graces are Temporal timers and
liveness uses monotonic clocks, never a comparison of wall-clock timestamps.

`relay worker` and `relay gateway` run under libfaketime (Debian package `faketime`, installed by `make test`),
whose offset file the test rewrites mid-grace: their wall clock jumps two hours ahead, then back behind.
The Temporal server keeps the real clock, as a cluster would beside one host whose clock went astray."""

from __future__ import annotations

import glob
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.rawclient import RawClient
from tests.support import VENV_BIN, Process, Relay, audit_rows, healthy, relay_env, start_temporal, wait_until

pytestmark = pytest.mark.e2e
LIBFAKETIME = sorted(glob.glob("/usr/lib/*/faketime/libfaketime.so.1"))
GRACE = 4.0
# A jump mishandled would be off by two hours; lateness itself is the bench's (P4). A clean-clone run with the
# concurrent tier beside saw DEAD 4.4 s after the grace (the disconnected signal 1.9 s, the fence's probe 2.4 s).
LATE_SLACK = 8.0


@pytest.fixture
def skewed(tmp_path: Path) -> Iterator[tuple[Relay, Path]]:
    if not LIBFAKETIME:
        pytest.fail("libfaketime is missing: `make test` installs the Debian package faketime")
    offset = tmp_path / "clock-offset"
    offset.write_text("+0\n")
    temporal, address = start_temporal(tmp_path)
    env = relay_env(tmp_path, RELAY_TEMPORAL_ADDRESS=address, LD_PRELOAD=LIBFAKETIME[0],
                    FAKETIME_TIMESTAMP_FILE=str(offset), FAKETIME_NO_CACHE="1", FAKETIME_DONT_FAKE_MONOTONIC="1")
    key = subprocess.run([str(VENV_BIN / "relay"), "keys", "create", "--init"], env=env, check=True,
                         capture_output=True, text=True, timeout=60).stdout.strip()
    worker = Process([str(VENV_BIN / "relay"), "worker"], env=env, log=tmp_path / "worker.log")
    gateway = Process([str(VENV_BIN / "relay"), "gateway"], env=env, log=tmp_path / "gateway.log")
    relay = Relay(gateway, f"http://127.0.0.1:{env['RELAY_PORT']}", f"ws://127.0.0.1:{env['RELAY_PORT']}/", key,
                  tmp_path, env)
    try:
        wait_until(lambda: healthy(relay.url), timeout=60, what="gateway up")
        # The worker too: on a slow machine it was still starting when the test's executor was due HEALTHY.
        wait_until(lambda: "worker running on task queue" in worker.output(), timeout=60, what="worker up")
        yield relay, offset
    finally:
        gateway.stop()
        worker.stop()
        temporal.stop()


@pytest.mark.parametrize("jump", ["+2h", "-2h"])
def test_a_clock_jump_mid_grace_changes_nothing(skewed: tuple[Relay, Path], jump: str) -> None:
    relay, offset = skewed
    with relay.api() as api:
        api.put("/v2/orgs/local/apps/skewed-app")
        api.patch("/v2/orgs/local/apps/skewed-app", json={"executorTimeoutSecs": int(GRACE)})
    client = RawClient(f"{relay.ws_url}websocket/skewed-app/{relay.key}")
    try:
        client.handshake("skewed-1")
        wait_until(lambda: relay.executors("skewed-app").get("skewed-1") == "HEALTHY", timeout=10, what="HEALTHY")
    finally:
        client.close()  # also on a failure: an unclosed socket fails a later test with a ResourceWarning
    closed = time.monotonic()
    wait_until(lambda: relay.executors("skewed-app").get("skewed-1") == "DISCONNECTED", timeout=5,
               what="DISCONNECTED")
    time.sleep(1)
    offset.write_text(f"{jump}\n")  # Relay's host clock jumps, mid-grace
    dead = wait_until(lambda: relay.executors("skewed-app").get("skewed-1") == "DEAD", timeout=GRACE + 10,
                      interval=0.05, what="DEAD")
    # Neither early nor late (a jump would be off by two hours). The slack covers the registry writes, the REST
    # polling, and the fence's probe to the gateway before DEAD, on a loaded machine.
    assert GRACE - 0.5 <= dead - closed <= GRACE + LATE_SLACK, dead - closed
    # The jump did reach Relay: the worker stamped the DEAD audit row with its skewed clock.
    [stamp] = [r.emit_time for r in audit_rows(relay.data_dir, "skewed-app", "skewed-1")
               if r.operation == "executor.dead"]
    skew = stamp - time.time()
    assert (skew > 3600) if jump.startswith("+") else (skew < -3600), skew
