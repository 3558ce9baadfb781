"""Every DBOS SDK end to end: real Python, TypeScript, Go and Java executors (``tests/sdk.py``; built by `make
test`) against `relay dev`, each proven the same way. Each test runs once per SDK (``--sdk NAME`` picks some:
`make test-sdk SDK=go`); the rest of tests/e2e runs Python executors through everything else. TypeScript and
Java keep their system database on a private PostgreSQL cluster (they support no other), Python and Go on SQLite.

Shortened timings: ping wait 2 s, a server ping every 0.5 s, a 3 s grace between DISCONNECTED and DEAD. The
connect storm runs on Relay's defaults instead: what it holds up is each client's own pong timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.bench.common import Generator
from tests.postgres import PostgresCluster, postgres_cluster
from tests.retention import app_result, pause_schedule, trigger_round
from tests.sdk import SDKS, Sdk, SystemDatabase, steps_by_pid
from tests.support import Process, Relay, audit_rows_at, running_relay, wait_recorded, wait_until

pytestmark = pytest.mark.e2e

PING_WAIT = 2.0
GRACE = 3
STEPS = 20
GC_BATCH_SIZE = 1234  # not a default, so the test sees the setting reach the wire
MINUTE_MS = 60_000


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``sdk``: each SDK of the per-language suite, or those named by ``--sdk``."""
    if "sdk" in metafunc.fixturenames:
        chosen = metafunc.config.getoption("sdk") or list(SDKS)
        metafunc.parametrize("sdk", [SDKS[name] for name in chosen], ids=lambda s: str(s.name))


@pytest.fixture(scope="module")
def cluster() -> Iterator[PostgresCluster]:
    with postgres_cluster() as started:
        yield started


@pytest.fixture(scope="module")
def fast(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Relay]:
    """`relay dev` with short liveness timings; retention rounds only when a test triggers one."""
    data_dir = tmp_path_factory.mktemp("sdk-relay")
    with running_relay(data_dir, RELAY_EXECUTOR_PING_WAIT_SECS=str(PING_WAIT), RELAY_SERVER_PING_INTERVAL_SECS="0.5",
                       RELAY_RETENTION_GC_BATCH_SIZE=str(GC_BATCH_SIZE)) as relay:
        pause_schedule(relay.temporal_address)
        yield relay


def _system_database(sdk: Sdk, tmp: Path, request: pytest.FixtureRequest) -> SystemDatabase:
    cluster = request.getfixturevalue("cluster") if sdk.postgres_only else None
    return sdk.system_database(tmp, cluster)


def _configure(relay: Relay, app: str, **settings: int | None) -> None:
    """Register the app before its first executor connects, with a short grace unless told otherwise."""
    with relay.api() as client:
        assert client.put(f"/v2/orgs/local/apps/{app}").status_code == 204
        settings = {"executorTimeoutSecs": GRACE, **settings}
        assert client.patch(f"/v2/orgs/local/apps/{app}", json=settings).status_code == 204


def _listed(relay: Relay, app: str) -> list[dict[str, Any]]:
    with relay.api() as client:
        response = client.get(f"/v2/orgs/local/apps/{app}/executors")
    response.raise_for_status()
    listed: list[dict[str, Any]] = response.json()
    return listed


def _operations(relay: Relay, app: str, executor_id: str, prefix: str = "executor.") -> list[str]:
    return [row.operation for row in audit_rows_at(relay.db_url, app, executor_id)
            if row.operation.startswith(prefix)]


@contextlib.contextmanager
def _stopped_at_end(processes: list[Process]) -> Iterator[None]:
    try:
        yield
    finally:
        for process in processes:
            if process.popen.poll() is None:  # a SIGSTOPped one would not act on SIGTERM
                with contextlib.suppress(ProcessLookupError):
                    os.kill(process.pid, signal.SIGCONT)
            process.stop()


def _start_pair(sdk: Sdk, relay: Relay, tmp: Path, app: str, sys_db: SystemDatabase, started: list[Process],
                **a_extra: str) -> tuple[Process, str, Process, str]:
    """A, then (once A is HEALTHY, so it has created or migrated the system database) B; both HEALTHY."""
    a = sdk.start(relay, tmp, "a", app, sys_db, EXECUTOR_METADATA=json.dumps({"role": "a"}), **a_extra)
    started.append(a)
    wait_until(lambda: list(relay.executors(app).values()) == ["HEALTHY"], timeout=60, what="A HEALTHY")
    [a_id] = relay.executors(app)
    b = sdk.start(relay, tmp, "b", app, sys_db, EXECUTOR_METADATA=json.dumps({"role": "b"}))
    started.append(b)
    wait_until(lambda: sorted(relay.executors(app).values()) == ["HEALTHY", "HEALTHY"], timeout=60,
               what="B HEALTHY")
    b_id = next(e for e in relay.executors(app) if e != a_id)
    return a, a_id, b, b_id


def test_executors_are_listed_healthy_with_their_fields(sdk: Sdk, fast: Relay, tmp_path: Path,
                                                        request: pytest.FixtureRequest) -> None:
    app, started = f"{sdk.name}-fields", list[Process]()
    _configure(fast, app)
    with _stopped_at_end(started):
        _, a_id, _, b_id = _start_pair(sdk, fast, tmp_path, app, _system_database(sdk, tmp_path, request), started)
        listed = {e["executorId"]: e for e in _listed(fast, app)}
        assert set(listed) == {a_id, b_id}
        for executor_id, role in ((a_id, "a"), (b_id, "b")):
            entry = listed[executor_id]
            assert entry["status"] == "HEALTHY"
            assert entry["language"] == sdk.language
            assert entry["dbosVersion"] == sdk.version
            assert entry["appVersion"] == "v1"
            assert entry["hostname"] == socket.gethostname()
            assert entry["executorMetadata"] == {"role": role}
        # A conductor key makes the executor id a fresh random UUID per process.
        assert len(a_id) == 36 and len(b_id) == 36 and a_id != b_id


def test_sigkilled_executor_is_recovered_by_its_peer(sdk: Sdk, fast: Relay, tmp_path: Path,
                                                     request: pytest.FixtureRequest) -> None:
    app, workflow_id, started = f"{sdk.name}-recovery", f"{sdk.name}-twenty-steps", list[Process]()
    sys_db = _system_database(sdk, tmp_path, request)
    _configure(fast, app)
    go = tmp_path / "go"
    with _stopped_at_end(started):
        a, a_id, b, b_id = _start_pair(sdk, fast, tmp_path, app, sys_db, started, START_WORKFLOW=workflow_id,
                                       START_WORKFLOW_WHEN=str(go), STEP_SECONDS="0.3")
        wait_recorded(fast.temporal_address, app, a_id)
        go.touch()
        # Saved, not just logged: a step logs its line before DBOS checkpoints it, so a kill in between is fair.
        wait_until(lambda: sys_db.checkpointed_steps(workflow_id) >= 5, timeout=30, what="A checkpointed 5 steps")
        a.kill()
        killed_at, killed_wall = time.monotonic(), time.time()
        done_by_a = sys_db.checkpointed_steps(workflow_id)
        assert sys_db.status(workflow_id) == "PENDING"

        disconnected_at = wait_until(lambda: fast.executors(app).get(a_id) == "DISCONNECTED", timeout=1,
                                     interval=0.02, what="A DISCONNECTED")
        dead_at = wait_until(lambda: fast.executors(app).get(a_id) in ("DEAD", None), timeout=GRACE + 7,
                             interval=0.05, what="A DEAD")
        assert GRACE - 0.5 <= dead_at - disconnected_at <= GRACE + 2.0
        success_at = wait_until(lambda: sys_db.status(workflow_id) == "SUCCESS", timeout=60, interval=0.05,
                                what="SUCCESS")
        wait_until(lambda: a_id not in fast.executors(app), timeout=10, what="A's record deleted")
        assert fast.executors(app) == {b_id: "HEALTHY"}

        # Every step ran exactly once across the two executors: none A had checkpointed ran again on B.
        steps = steps_by_pid(tmp_path / "steps.log")
        by_a, by_b = steps.get(a.pid, []), steps.get(b.pid, [])
        assert by_b, "B ran no step"
        assert done_by_a >= 5
        assert not set(range(done_by_a)) & set(by_b), f"steps checkpointed by A ran again on B: {by_a} {by_b}"
        assert sorted(set(by_a) | set(by_b)) == list(range(STEPS)), (by_a, by_b)
        assert len(by_b) == len(set(by_b)), by_b
        assert sys_db.checkpointed_steps(workflow_id) == STEPS

        assert _operations(fast, app, a_id) == [
            "executor.healthy", "executor.disconnected", "executor.dead", "executor.recovery.dispatched",
            "executor.recovery.succeeded", "executor.deleted"]
        print(f"\n{sdk.name}: SIGKILL→DISCONNECTED {disconnected_at - killed_at:.2f}s, "
              f"→DEAD {dead_at - killed_at:.2f}s (grace {GRACE}s), →SUCCESS on the peer {success_at - killed_at:.2f}s; "
              "audited: " + ", ".join(f"{r.operation.removeprefix('executor.')} {r.emit_time - killed_wall:.2f}s"
                                      for r in audit_rows_at(fast.db_url, app, a_id)
                                      if r.operation in ("executor.recovery.succeeded", "executor.deleted")))


def test_sigstopped_executor_disconnects_at_ping_wait_then_reconnects(sdk: Sdk, fast: Relay, tmp_path: Path,
                                                                      request: pytest.FixtureRequest) -> None:
    app, started = f"{sdk.name}-sigstop", list[Process]()
    _configure(fast, app, executorTimeoutSecs=60)
    with _stopped_at_end(started):
        executor = sdk.start(fast, tmp_path, "a", app, _system_database(sdk, tmp_path, request))
        started.append(executor)
        wait_until(lambda: list(fast.executors(app).values()) == ["HEALTHY"], timeout=60, what="HEALTHY")
        [executor_id] = fast.executors(app)
        wait_recorded(fast.temporal_address, app, executor_id)
        os.kill(executor.pid, signal.SIGSTOP)
        stopped = time.monotonic()  # its last frame (a pong) is at most one server ping interval (0.5 s) earlier
        seen = wait_until(lambda: fast.executors(app).get(executor_id) == "DISCONNECTED", timeout=PING_WAIT + 3,
                          interval=0.02, what="DISCONNECTED")
        assert PING_WAIT - 1.0 <= seen - stopped <= PING_WAIT + 1.0, seen - stopped
        os.kill(executor.pid, signal.SIGCONT)
        resumed = time.monotonic()
        back = wait_until(lambda: fast.executors(app).get(executor_id) == "HEALTHY", timeout=15, interval=0.05,
                          what="HEALTHY again")
        assert _operations(fast, app, executor_id) == [
            "executor.healthy", "executor.disconnected", "executor.reconnected"]
        print(f"\n{sdk.name}: SIGSTOP→DISCONNECTED {seen - stopped:.2f}s, SIGCONT→HEALTHY {back - resumed:.2f}s")


def test_retention_collects_old_finished_workflows_and_times_out_old_pending_ones(
        sdk: Sdk, fast: Relay, tmp_path: Path, request: pytest.FixtureRequest) -> None:
    app, sys_db = f"{sdk.name}-retention", _system_database(sdk, tmp_path, request)
    _configure(fast, app, gcTimeThresholdMs=MINUTE_MS, globalTimeoutMs=MINUTE_MS)
    old, new = ["old-1", "old-2", "old-3"], ["new-1", "new-2"]
    started = [sdk.start(fast, tmp_path, "a", app, sys_db, FINISHED_WORKFLOWS=",".join(old + new),
                         PENDING_WORKFLOWS="stuck-old,stuck-new")]
    with _stopped_at_end(started):
        expected = {**dict.fromkeys(old + new, "SUCCESS"), "stuck-old": "PENDING", "stuck-new": "PENDING"}
        wait_until(lambda: sys_db.statuses() == expected, timeout=60, what="workflows created")
        wait_until(lambda: list(fast.executors(app).values()) == ["HEALTHY"], timeout=30, what="HEALTHY")
        [executor_id] = fast.executors(app)
        # Ten minutes old against a one-minute threshold; the others are seconds old. A threshold read as seconds
        # (1000x too long) collects nothing; one read as microseconds (1000x too short) collects everything.
        sys_db.backdate([*old, "stuck-old"], by_ms=10 * MINUTE_MS)

        trigger_round(fast.temporal_address)
        result = app_result(fast.temporal_address, app)
        assert (result.outcome, result.executor_id) == ("SUCCEEDED", executor_id), result
        # Python and TypeScript answer "started" and work in the background; Go and Java answer when done.
        after = {**dict.fromkeys(new, "SUCCESS"), "stuck-old": "CANCELLED", "stuck-new": "PENDING"}
        wait_until(lambda: sys_db.statuses() == after, timeout=30, what=f"retention done: {after}")

        # The exact cutoffs on the wire, to the millisecond: the round's clock minus each threshold.
        rows = [r for r in audit_rows_at(fast.db_url, app) if r.operation.startswith("retention.")]
        assert [(r.operation, r.executor_id) for r in rows] == [
            ("retention.dispatched", executor_id), ("retention.succeeded", executor_id)]
        body, clock = rows[0].details["body"], rows[0].details["clock_epoch_ms"]
        assert isinstance(clock, int)
        assert body == {"gc_cutoff_epoch_ms": clock - MINUTE_MS, "gc_rows_threshold": 1_000_000,
                        "gc_batch_size": GC_BATCH_SIZE, "timeout_cutoff_epoch_ms": clock - MINUTE_MS}


# -- a connect storm: every SDK's client holds on ---------------------------------------------------------------

STORM_APP = "storm"
STORM_WAVE = 150  # fake executors connected, then dropped, again and again
STORM_WAVES = 10  # at least, however long a wave takes on a loaded machine: the gateway is kept busy
SDK_PING_EVERY = timedelta(seconds=20)  # every SDK's client pings this often (PROTOCOL.md, "Keepalive")


@pytest.mark.concurrent  # outcomes only (no client drops a socket): its own relay, alongside another test
def test_every_sdk_is_held_through_a_connect_storm(tmp_path_factory: pytest.TempPathFactory,
                                                   request: pytest.FixtureRequest) -> None:
    """Real executors of each SDK chosen stay connected for a ping interval plus the longest of their own pong
    timeouts (so each client's timeout window passes whole at least once, wherever its first ping falls) while
    fake executors connect and drop on the same gateway as fast as it lets them: Relay answers their pings promptly
    however busy it is, so no client drops its socket (Go and Java drop one whose pong is late even while messages
    flow). The gateway runs Relay's default liveness timings here."""
    chosen = [SDKS[name] for name in (request.config.getoption("sdk") or list(SDKS))]
    hold = SDK_PING_EVERY + max(sdk.pong_timeout for sdk in chosen)
    data_dir = tmp_path_factory.mktemp("storm-relay")
    with running_relay(data_dir) as relay:
        started: list[Process] = []
        generator = Generator("storm-loadgen", data_dir)
        try:
            with _stopped_at_end(started):
                held: dict[str, str] = {}  # executor id -> its SDK
                logs: dict[str, Process] = {}  # SDK -> its executor, whose output a failure shows
                for sdk in chosen:
                    app, tmp = f"held-{sdk.name}", data_dir / sdk.name
                    tmp.mkdir()
                    _configure(relay, app, executorTimeoutSecs=60)
                    started.append(logs.setdefault(sdk.name, sdk.start(relay, tmp, "executor", app,
                                                                       _system_database(sdk, tmp, request))))
                    wait_until(lambda: list(relay.executors(app).values()) == ["HEALTHY"], timeout=60,  # noqa: B023
                               what=f"{sdk.name} HEALTHY")
                    [executor_id] = relay.executors(app)
                    held[executor_id] = sdk.name
                _configure(relay, STORM_APP, executorTimeoutSecs=3600)

                began, waves, connected = time.monotonic(), 0, 0
                while time.monotonic() - began < hold.total_seconds() or waves < STORM_WAVES:
                    reply = generator.call("connect", url=f"{relay.ws_url}websocket/{STORM_APP}/{relay.key}",
                                           prefix=f"storm-{waves % 4}-", start=0, count=STORM_WAVE, timeout=60)
                    connected += reply["connected"]
                    generator.call("close", prefix=f"storm-{waves % 4}-", start=0, count=STORM_WAVE, mode="abort")
                    waves += 1
                    for sdk in chosen:
                        statuses = relay.executors(f"held-{sdk.name}")
                        assert list(statuses.values()) == ["HEALTHY"], _dropped(relay, sdk.name, statuses,
                                                                                 logs[sdk.name])
                elapsed = time.monotonic() - began

                for executor_id, name in held.items():
                    assert _operations(relay, f"held-{name}", executor_id) == ["executor.healthy"], name
                for process in started:
                    assert process.popen.poll() is None, process.output()[-2000:]
                assert connected >= 0.9 * waves * STORM_WAVE, (connected, waves)  # the handshakes went through
                print(f"\nconnect storm: {connected} handshakes in {elapsed:.0f}s ({connected / elapsed:.0f}/s); "
                      f"held: {sorted(held.values())} for {hold.total_seconds():.0f}s")
        finally:
            generator.stop()



def _dropped(relay: Relay, name: str, statuses: dict[str, str], executor: Process) -> str:
    """What a failure of the storm test shows: which side gave up, in the executor's words and in Relay's."""
    ids = list(statuses)
    relay_lines = [line for line in relay.process.output().splitlines()
                   if any(i in line for i in ids) or "relay.contact" in line or " WARNING " in line]
    return (f"{name}: {statuses}\n-- its executor's log, last lines:\n{executor.output()[-2500:]}\n"
            f"-- Relay's lines about it:\n" + "\n".join(relay_lines[-20:]))


@pytest.mark.concurrent  # outcomes only: beside another test (tests/tiers.py)
def test_workflow_management_through_each_sdk(sdk: Sdk, fast: Relay, tmp_path: Path,
                                              request: pytest.FixtureRequest) -> None:
    """The Conductor console's reads and a cancel, answered by this SDK's executor: its replies (field names,
    omitted nulls, string numbers) map onto the upstream schemas."""
    app, sys_db = f"{sdk.name}-manage", _system_database(sdk, tmp_path, request)
    _configure(fast, app, executorTimeoutSecs=60)
    started = [sdk.start(fast, tmp_path, "a", app, sys_db, FINISHED_WORKFLOWS="done-1,done-2",
                         PENDING_WORKFLOWS="stuck-1")]
    with _stopped_at_end(started), fast.api() as api:
        base = f"/v2/orgs/local/apps/{app}"
        wait_until(lambda: sys_db.statuses() == {"done-1": "SUCCESS", "done-2": "SUCCESS", "stuck-1": "PENDING"},
                   timeout=60, what="workflows created")
        wait_until(lambda: list(fast.executors(app).values()) == ["HEALTHY"], timeout=60, what="HEALTHY")
        [executor_id] = fast.executors(app)

        listed = api.get(f"{base}/workflows", params={"sortDesc": True})
        assert listed.status_code == 200, listed.text
        by_id = {w["workflowId"]: w for w in listed.json()}
        assert {i: w["status"] for i, w in by_id.items()} == {"done-1": "SUCCESS", "done-2": "SUCCESS",
                                                              "stuck-1": "PENDING"}
        assert by_id["done-1"]["workflowName"] == "finishes" or by_id["done-1"]["workflowName"].endswith("finishes")
        assert by_id["stuck-1"]["appVersion"] == "v1"
        assert by_id["stuck-1"]["executorId"] == executor_id
        created = by_id["done-1"]["createdAt"]
        assert isinstance(created, str) and created.startswith(str(time.gmtime().tm_year)), created

        got = api.get(f"{base}/workflows/done-2")
        assert got.status_code == 200, got.text
        assert (got.json()["workflowId"], got.json()["status"]) == ("done-2", "SUCCESS")
        assert api.get(f"{base}/workflows/no-such-workflow").status_code == 404
        pending = api.post(f"{base}/workflows/search", json={"status": ["PENDING"]})
        assert pending.status_code == 200, pending.text
        assert [w["workflowId"] for w in pending.json()] == ["stuck-1"]
        versions = api.get(f"{base}/versions")
        assert versions.status_code == 200, versions.text

        cancelled = api.post(f"{base}/workflows/stuck-1/cancel", json={})
        assert cancelled.status_code == 204, cancelled.text
        wait_until(lambda: sys_db.status("stuck-1") == "CANCELLED", timeout=45, what="stuck-1 CANCELLED")
        [row] = [r for r in audit_rows_at(fast.db_url, app) if r.operation == "workflow.cancel"]
        assert (row.executor_id, row.status) == (executor_id, "success")
