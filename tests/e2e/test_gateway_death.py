"""A gateway that dies sends no `disconnected`: the gateway watch workflow notices and disconnects the
executors it held, and once it has found the gateway gone nothing waits on that gateway again. Real processes: a
Temporal dev server, `relay worker` and `relay gateway`, separately."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError

from core import gateways
from core.models import make_engine
from core.store import Store
from core.temporal import connect
from tests.rawclient import RawClient
from tests.support import (
    VENV_BIN,
    AuditRow,
    Process,
    RawPeer,
    Relay,
    audit_rows,
    free_port,
    healthy,
    lifecycle_state,
    registry,
    relay_env,
    start_temporal,
    wait_recorded,
    wait_until,
)
from workflows.contracts.common import Activity, ExecutorStatus, gateway_workflow_id, lifecycle_workflow_id
from workflows.contracts.lifecycle import LifecycleState

pytestmark = pytest.mark.e2e
HEARTBEAT_TIMEOUT = 2.0
# A gateway known gone (here: its watch found it gone) is never probed again, so after its crash an executor it held
# is DEAD this close to the end of its grace, and deleted this soon after DEAD: neither waits out a probe's timeout.
GONE_GATEWAY_BOUND = 1.0
# The heartbeat timeout of a gateway about to be restarted: its watch must not find it gone before the restart.
RESTART_WINDOW = 60.0


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


def _key(env: dict[str, str]) -> str:
    """A new API key, made with the CLI (``--init``: on a fresh database)."""
    return subprocess.run([str(VENV_BIN / "relay"), "keys", "create", "--init"], env=env, check=True,
                          capture_output=True, text=True, timeout=60).stdout.strip()


def _app(relay: Relay, app: str, grace: float) -> None:
    """Create ``app`` with a grace of ``grace`` seconds."""
    with relay.api() as api:
        assert api.put(f"/v2/orgs/local/apps/{app}").status_code == 204
        assert api.patch(f"/v2/orgs/local/apps/{app}", json={"executorTimeoutSecs": grace}).status_code == 204


def _gateway(env: dict[str, str], data_dir: Path, key: str, log: str, *, identity: str | None = None) -> Relay:
    """A `relay gateway`, up, optionally under an explicit ``identity`` (``RELAY_GATEWAY_ID``; the default is the
    host name, RELAY_PORT and the data dir). A process started under an identity makes the earlier processes of that
    identity gone, so gateways side by side never share one."""
    env = env if identity is None else {**env, "RELAY_GATEWAY_ID": identity}
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
    key = _key(env)
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
    key = _key(env)
    app = "two-gateways"
    first = _gateway(env, tmp_path, key, "gateway-1.log", identity="first")
    second = _gateway({**env, "RELAY_PORT": str(free_port())}, tmp_path, key, "gateway-2.log", identity="second")
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


def test_gateway_killed_for_good_its_executor_is_dead_and_recovered_on_time(
    cluster: tuple[dict[str, str], Process], tmp_path: Path
) -> None:
    """A gateway SIGKILLed and never started again, with an executor that dies with it; a peer of the same app
    on another gateway lives on. The watch finds the gateway gone and disconnects the executor then; that verdict
    makes the gateway known gone, so the fence does not probe it again: DEAD comes one grace after the
    disconnect, and the recovery request (by the peer, once) and the deletion follow at once."""
    env, _worker = cluster
    address, app, grace = env["RELAY_TEMPORAL_ADDRESS"], "gone-gateway", 4
    key = _key(env)
    doomed = _gateway(env, tmp_path, key, "gateway-doomed.log", identity="doomed")
    survivor = _gateway({**env, "RELAY_PORT": str(free_port())}, tmp_path, key, "gateway-survivor.log",
                        identity="survivor")
    peer: RawPeer | None = None
    dead: RawPeer | None = None
    try:
        _app(survivor, app, grace)
        peer = RawPeer(survivor.ws_url, app, key, "peer")
        dead = RawPeer(doomed.ws_url, app, key, "dead")
        wait_until(lambda: registry(tmp_path, app) == {"peer": "HEALTHY", "dead": "HEALTHY"}, timeout=15,
                   what="both HEALTHY")
        for executor_id in ("peer", "dead"):
            wait_recorded(address, app, executor_id)
        state = lifecycle_state(address, app, "dead")
        assert isinstance(state, LifecycleState)
        doomed_queue = state.gateway_queue

        killed_at = time.time()
        doomed.process.kill()  # no `disconnected` from it: only its watch can tell
        dead.stop()  # the executor dies with it (and stops knocking on its port)
        wait_until(lambda: registry(tmp_path, app).get("dead") == "DISCONNECTED", timeout=2 * HEARTBEAT_TIMEOUT + 8,
                   what="DISCONNECTED when the watch found the gateway gone")
        wait_until(lambda: "dead" not in registry(tmp_path, app), timeout=grace + 20, what="recovered and deleted")

        rows = audit_rows(tmp_path, app, "dead")
        late, to_delete = _gone_gateway_figures(rows, grace, killed_at)
        watch_probes = _probes(address, gateway_workflow_id(doomed_queue))
        fence_probes = _probes(address, lifecycle_workflow_id("local", app, "dead")).count(doomed_queue)
        print(f"probes of the killed gateway: {len(watch_probes)} by its watch, {fence_probes} by the fence")
        assert [r.operation for r in rows] == [
            "executor.healthy", "executor.disconnected", "executor.dead", "executor.recovery.dispatched",
            "executor.recovery.succeeded", "executor.deleted"], [r.operation for r in rows]
        assert _one(rows, "executor.recovery.succeeded").details["candidate"] == "peer"
        assert [r["executor_ids"] for r in peer.requests_of("recovery")] == [["dead"]]
        assert registry(tmp_path, app) == {"peer": "HEALTHY"}
        # The watch's verdict took one probe (the one that confirmed its missed heartbeats), no second one.
        assert len(watch_probes) <= 1, f"the watch probed the gone gateway {len(watch_probes)} times"

        # Timing last, so a late DEAD does not hide the checks above.
        assert abs(late) <= GONE_GATEWAY_BOUND, f"DEAD {late:+.2f}s off one grace after the disconnect"
        assert 0 <= to_delete <= GONE_GATEWAY_BOUND, f"deleted {to_delete:.2f}s after DEAD"
        assert fence_probes == 0, f"the fence probed the gateway known gone {fence_probes} times"
    finally:
        for p in (peer, dead):
            if p is not None:
                p.stop()
        survivor.process.stop()
        doomed.process.stop()


def test_a_connection_taken_in_after_its_gateway_was_swept_is_disconnected(
    cluster: tuple[dict[str, str], Process], tmp_path: Path
) -> None:
    """The order a lagging worker can leave: a ``connected`` lands, its gateway dies, and its watch finds it gone and
    sweeps the registry's rows on it before the lifecycle workflow has taken the connection in (here: no worker
    runs meanwhile, and the watch's verdict is written as its activity writes it, the registry then holding no row
    on that gateway). The workflow then records the executor HEALTHY on a gateway known gone, where nothing else
    would ever disconnect it; the record says so, the workflow is told, and the executor is DEAD one grace later."""
    env, worker = cluster
    address, app, grace = env["RELAY_TEMPORAL_ADDRESS"], "late-record", 2
    key = _key(env)
    gateway = _gateway(env, tmp_path, key, "gateway.log")
    late: Process | None = None
    client: RawClient | None = None
    try:
        _app(gateway, app, grace)
        worker.stop()  # nothing is taken in from here until the late worker starts
        client = RawClient(f"{gateway.ws_url}websocket/{app}/{key}")
        client.handshake("late-1")
        wait_until(lambda: _signalled(address, lifecycle_workflow_id("local", app, "late-1")), timeout=15,
                   what="the connected signal landed")
        [(queue, _identity, _gone)] = _gateway_rows(tmp_path)
        gateway.process.kill()
        client.close()

        store = Store(make_engine(f"sqlite:///{tmp_path / 'relay.db'}"))
        try:
            assert store.gateways.mark_gone(queue, gateways.WATCH)
            assert store.executors_on_gateway(queue) == []  # what the sweep found: nothing to disconnect
        finally:
            store.engine.dispose()
        asyncio.run(_terminate(address, gateway_workflow_id(queue)))  # its verdict given, the watch has ended

        late = Process([str(VENV_BIN / "relay"), "worker"], env=env, log=tmp_path / "worker-late.log")
        wait_until(lambda: registry(tmp_path, app).get("late-1") == "DEAD", timeout=grace + 30,
                   what="DEAD: recorded on a gateway known gone, then disconnected")
        rows = audit_rows(tmp_path, app, "late-1")
        assert [r.operation for r in rows][:3] == ["executor.healthy", "executor.disconnected", "executor.dead"], [
            r.operation for r in rows]
        disconnected, dead = _one(rows, "executor.disconnected").emit_time, _one(rows, "executor.dead").emit_time
        assert grace - 0.1 <= dead - disconnected <= grace + GONE_GATEWAY_BOUND, dead - disconnected
        assert "recorded on gateway" in (tmp_path / "worker-late.log").read_text()
    finally:
        if client is not None:
            client.close()
        if late is not None:
            late.stop()
        gateway.process.stop()


def test_a_moved_executor_is_named_on_its_new_gateway_once_its_connected_lands_and_still_dies_with_it(
    cluster: tuple[dict[str, str], Process], tmp_path: Path
) -> None:
    """A HEALTHY executor whose gateway is SIGKILLed reconnects to another: the registry names the new gateway and
    socket once the ``connected`` landed, before the lifecycle workflow takes it in (no worker runs meanwhile; the
    workflow's own write is audited, the gateway's is not). That gateway SIGKILLed in turn, its watch's sweep finds
    the row there: the executor is disconnected and DEAD one grace later."""
    env, worker = cluster
    address, app, grace = env["RELAY_TEMPORAL_ADDRESS"], "moved-early", 2
    key = _key(env)
    first = _gateway(env, tmp_path, key, "gateway-1.log", identity="first")
    second = _gateway({**env, "RELAY_PORT": str(free_port())}, tmp_path, key, "gateway-2.log", identity="second")
    late: Process | None = None
    clients: list[RawClient] = []
    store = Store(make_engine(f"sqlite:///{tmp_path / 'relay.db'}"))
    try:
        _app(first, app, grace)
        clients.append(RawClient(f"{first.ws_url}websocket/{app}/{key}"))
        clients[-1].handshake("mover")
        wait_recorded(address, app, "mover")
        queues = {identity: queue for queue, identity, _gone in _gateway_rows(tmp_path)}
        row = store.registry_row("local", app, "mover")
        assert row is not None and (row.status, row.gateway_queue) == (ExecutorStatus.HEALTHY, queues["first"])

        worker.stop()  # nothing is taken in from here until the late worker starts
        first.process.kill()
        clients[-1].close()
        clients.append(RawClient(f"{second.ws_url}websocket/{app}/{key}"))
        clients[-1].handshake("mover")

        def moved() -> bool:
            row = store.registry_row("local", app, "mover")
            return row is not None and row.gateway_queue == queues["second"]

        wait_until(moved, timeout=15, what="the registry naming the second gateway")
        row = store.registry_row("local", app, "mover")
        assert row is not None and row.status == ExecutorStatus.HEALTHY and row.connection_id != ""
        assert [r.operation for r in audit_rows(tmp_path, app, "mover")] == ["executor.healthy"]

        second.process.kill()
        clients[-1].close()
        late = Process([str(VENV_BIN / "relay"), "worker"], env=env, log=tmp_path / "worker-late.log")
        wait_until(lambda: registry(tmp_path, app).get("mover") == "DEAD", timeout=grace + 6 * HEARTBEAT_TIMEOUT + 30,
                   what="DEAD: its second gateway found gone, the grace run out")
        rows = audit_rows(tmp_path, app, "mover")
        assert [r.operation for r in rows][:4] == [
            "executor.healthy", "executor.superseded", "executor.disconnected", "executor.dead"], [
            r.operation for r in rows]
        assert _one(rows, "executor.disconnected").details["connection_id"] == row.connection_id
        disconnected, dead = _one(rows, "executor.disconnected").emit_time, _one(rows, "executor.dead").emit_time
        assert grace - 0.1 <= dead - disconnected <= grace + GONE_GATEWAY_BOUND, dead - disconnected
    finally:
        store.engine.dispose()
        for client in clients:
            client.close()
        if late is not None:
            late.stop()
        second.process.stop()
        first.process.stop()


def _signalled(address: str, workflow_id: str) -> bool:
    """Whether the workflow exists with a signal in its history (a signal-with-start landed)."""
    async def look() -> bool:
        client = await connect(address, "default")
        try:
            return any([e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
                        async for e in client.get_workflow_handle(workflow_id).fetch_history_events()])
        except RPCError:
            return False

    return asyncio.run(look())


async def _terminate(address: str, workflow_id: str) -> None:
    client = await connect(address, "default")
    with contextlib.suppress(RPCError):  # ended already
        await client.get_workflow_handle(workflow_id).terminate(reason="test: its verdict was given")


def _one(rows: list[AuditRow], operation: str) -> AuditRow:
    found = [r for r in rows if r.operation == operation]
    assert len(found) == 1, (operation, [r.operation for r in rows])
    return found[0]


def _gone_gateway_figures(rows: list[AuditRow], grace: float, killed_at: float) -> tuple[float, float]:
    """DEAD's distance from one grace after the disconnect, and the deletion's delay after DEAD; printed at once
    (shown with ``-s``) with the watch's own delay, so the figures are there even when a check fails."""
    disconnected, dead = _one(rows, "executor.disconnected").emit_time, _one(rows, "executor.dead").emit_time
    late, to_delete = dead - (disconnected + grace), _one(rows, "executor.deleted").emit_time - dead
    print(f"\nwatch: DISCONNECTED {disconnected - killed_at:.2f}s after the kill; DEAD {late:+.2f}s from one grace "
          f"after it; deleted {to_delete:.2f}s after DEAD")
    return late, to_delete


def _probes(address: str, workflow_id: str) -> list[str]:
    """The task queue of every ``probe_gateway`` activity the workflow's latest run scheduled."""
    async def probes() -> list[str]:
        client = await connect(address, "default")
        handle = client.get_workflow_handle(workflow_id)
        return [e.activity_task_scheduled_event_attributes.task_queue.name
                async for e in handle.fetch_history_events()
                if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
                and e.activity_task_scheduled_event_attributes.activity_type.name == Activity.PROBE_GATEWAY]

    return asyncio.run(probes())


def _gateway_rows(data_dir: Path) -> list[tuple[str, str, str | None]]:
    """(queue, identity, gone_reason or None) of every gateway process recorded, oldest first."""
    with contextlib.closing(sqlite3.connect(data_dir / "relay.db", timeout=10)) as db:
        return [(q, i, r if gone else None) for q, i, gone, r in db.execute(
            "SELECT queue, identity, gone_at, gone_reason FROM gatewayprocess ORDER BY started_at")]


def test_a_restarted_gateway_makes_its_predecessor_gone_and_a_stopped_one_retires(
    cluster: tuple[dict[str, str], Process], tmp_path: Path
) -> None:
    """SIGKILLed and started again on the same port and data dir (the same identity): the new process records the
    old one gone at once. Then SIGTERM: it records itself retired, and its watch ends without probing it."""
    env, _worker = cluster
    key = _key(env)
    # The first process's watch gets a heartbeat timeout far longer than a restart takes (a loaded machine took
    # over 4 s to start the second), so it is the restart that makes the first gone, not the watch.
    first = _gateway({**env, "RELAY_GATEWAY_HEARTBEAT_TIMEOUT_SECS": str(RESTART_WINDOW)}, tmp_path, key,
                     "gateway-1.log")
    try:
        [(first_queue, identity, gone)] = _gateway_rows(tmp_path)
        assert gone is None and f":{env['RELAY_PORT']}:" in identity
        first.process.kill()
    finally:
        first.process.stop()

    second = _gateway(env, tmp_path, key, "gateway-2.log")
    try:
        rows = _gateway_rows(tmp_path)
        assert [(q, i) for q, i, _ in rows][0] == (first_queue, identity) and len(rows) == 2, rows
        (_, _, first_gone), (second_queue, second_identity, second_gone) = rows
        assert first_gone is not None and first_gone.startswith("restarted") and second_queue in first_gone
        assert (second_identity, second_gone) == (identity, None)
    finally:
        assert second.process.stop() == 0, second.process.output()[-2000:]
    assert _gateway_rows(tmp_path)[1][2] == "retired"

    watch = gateway_workflow_id(second_queue)
    wait_until(lambda: _watch_ended(env["RELAY_TEMPORAL_ADDRESS"], watch), timeout=HEARTBEAT_TIMEOUT + 10,
               what="the retired gateway's watch ended")
    assert _probes(env["RELAY_TEMPORAL_ADDRESS"], watch) == [], "the watch probed a gateway known retired"


def _watch_ended(address: str, workflow_id: str) -> bool:
    async def ended() -> bool:
        client = await connect(address, "default")
        description = await client.get_workflow_handle(workflow_id).describe()
        return description.status is not None and description.status != WorkflowExecutionStatus.RUNNING

    return asyncio.run(ended())
