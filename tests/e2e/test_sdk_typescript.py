"""TypeScript executors end to end: real `@dbos-inc/dbos-sdk@5.2.11` executors (tests/executors/typescript, installed
by `make test` / `make test-sdk SDK=typescript`) against `relay dev`, their system database on a private PostgreSQL
cluster (the TypeScript SDK supports no other). Shortened timings: ping wait 2 s, server ping every 0.5 s, a 3 s
grace between DISCONNECTED and DEAD."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.postgres import PostgresCluster, postgres_cluster
from tests.support import Process, Relay, relay_env, start_relay, wait_recorded, wait_until

pytestmark = pytest.mark.e2e

EXECUTOR_DIR = Path(__file__).parents[1] / "executors" / "typescript"
SDK_VERSION = "5.2.11"
PING_WAIT = 2.0
GRACE = 3
STEPS = 20


@pytest.fixture(scope="module")
def cluster() -> Iterator[PostgresCluster]:
    with postgres_cluster() as started:
        yield started


@pytest.fixture(scope="module")
def fast(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Relay]:
    data_dir = tmp_path_factory.mktemp("ts-relay")
    env = relay_env(data_dir, RELAY_EXECUTOR_PING_WAIT_SECS=str(PING_WAIT), RELAY_SERVER_PING_INTERVAL_SECS="0.5")
    relay = start_relay(data_dir, env)
    try:
        yield relay
    finally:
        code = relay.process.stop()
        assert code == 0, relay.process.output()[-3000:]


def _node() -> str:
    node = shutil.which("node")
    if node is None or not (EXECUTOR_DIR / "node_modules" / ".installed").exists():
        pytest.fail("the TypeScript executor is not installed: `make test-sdk SDK=typescript` installs it")
    return node


def _register(relay: Relay, app: str, *, grace: int = GRACE) -> None:
    """Register the app before its first executor connects, with a short grace."""
    with relay.api() as client:
        assert client.put(f"/v2/orgs/local/apps/{app}").status_code == 204
        assert client.patch(f"/v2/orgs/local/apps/{app}", json={"executorTimeoutSecs": grace}).status_code == 204
        assert client.get(f"/v2/orgs/local/apps/{app}").json()["executorTimeoutSecs"] == grace


def _system_database(cluster: PostgresCluster) -> dict[str, Any]:
    """A new, empty database for the app's DBOS system database; returns its psycopg parameters."""
    url = cluster.create_database("dbos")
    return cluster.params(url.rsplit("/", 1)[1])


def _pg_url(params: dict[str, Any]) -> str:
    return f"postgresql://{params['user']}@{params['host']}:{params['port']}/{params['dbname']}"


def _executor(relay: Relay, tmp: Path, name: str, app: str, sys_db: dict[str, Any], **extra: str) -> Process:
    node = _node()
    env = {"PATH": f"{Path(node).parent}:/usr/bin:/bin", "HOME": str(tmp), "RELAY_URL": relay.ws_url,
           "RELAY_KEY": relay.key, "APP_NAME": app, "APP_VERSION": "v1", "SYS_DB_URL": _pg_url(sys_db),
           "STEP_LOG": str(tmp / "steps.log"), **extra}
    return Process([node, "executor.js"], env=env, log=tmp / f"{name}.log", cwd=EXECUTOR_DIR)


def _query(sys_db: dict[str, Any], query: str, *args: object) -> list[tuple[object, ...]]:
    """Rows of one query against the DBOS system database (its tables are in schema ``dbos``); none while the
    schema does not exist yet."""
    try:
        with psycopg.connect(**sys_db, connect_timeout=5) as conn:
            return list(conn.execute(query, args).fetchall())
    except psycopg.errors.UndefinedTable:
        return []


def _workflow_status(sys_db: dict[str, Any], workflow_id: str) -> str | None:
    rows = _query(sys_db, "SELECT status FROM dbos.workflow_status WHERE workflow_uuid = %s", workflow_id)
    return None if not rows else str(rows[0][0])


def _checkpointed_steps(sys_db: dict[str, Any], workflow_id: str) -> list[int]:
    """Function ids of the workflow's checkpointed steps, in order."""
    rows = _query(sys_db, "SELECT function_id FROM dbos.operation_outputs WHERE workflow_uuid = %s "
                  "AND function_name = 'step' ORDER BY function_id", workflow_id)
    return [int(str(r[0])) for r in rows]


def _steps_by_pid(log: Path) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    if log.exists():
        for line in log.read_text().splitlines():
            pid, step = line.split()
            out.setdefault(int(pid), []).append(int(step))
    return out


def _listed(relay: Relay, app: str) -> list[dict[str, Any]]:
    with relay.api() as client:
        response = client.get(f"/v2/orgs/local/apps/{app}/executors")
    response.raise_for_status()
    listed: list[dict[str, Any]] = response.json()
    return listed


@contextlib.contextmanager
def _stopped_at_end(*processes: list[Process]) -> Iterator[None]:
    try:
        yield
    finally:
        for group in processes:
            for process in group:
                if process.popen.poll() is None:  # a SIGSTOPped one would not act on SIGTERM
                    os.kill(process.pid, signal.SIGCONT)
                process.stop()


def _start_pair(relay: Relay, tmp: Path, app: str, sys_db: dict[str, Any], started: list[Process],
                **a_extra: str) -> tuple[Process, str, Process, str]:
    """A, then (once A is HEALTHY and has migrated the system database) B; both HEALTHY."""
    a = _executor(relay, tmp, "a", app, sys_db, EXECUTOR_METADATA=json.dumps({"role": "a"}), **a_extra)
    started.append(a)
    wait_until(lambda: list(relay.executors(app).values()) == ["HEALTHY"], timeout=60, what="A HEALTHY")
    [a_id] = relay.executors(app)
    b = _executor(relay, tmp, "b", app, sys_db, EXECUTOR_METADATA=json.dumps({"role": "b"}))
    started.append(b)
    wait_until(lambda: sorted(relay.executors(app).values()) == ["HEALTHY", "HEALTHY"], timeout=60,
               what="B HEALTHY")
    b_id = next(e for e in relay.executors(app) if e != a_id)
    return a, a_id, b, b_id


def test_typescript_executors_are_listed_healthy_with_their_fields(fast: Relay, cluster: PostgresCluster,
                                                                   tmp_path: Path) -> None:
    app, started = "ts-fields", list[Process]()
    _register(fast, app)
    with _stopped_at_end(started):
        _, a_id, _, b_id = _start_pair(fast, tmp_path, app, _system_database(cluster), started)
        listed = {e["executorId"]: e for e in _listed(fast, app)}
        assert set(listed) == {a_id, b_id}
        for executor_id, role in ((a_id, "a"), (b_id, "b")):
            entry = listed[executor_id]
            assert entry["status"] == "HEALTHY"
            assert entry["language"] == "typescript"
            assert entry["dbosVersion"] == SDK_VERSION
            assert entry["appVersion"] == "v1"
            assert entry["hostname"] == socket.gethostname()
            assert entry["executorMetadata"] == {"role": role}
        # A conductor key makes the executor id a fresh random UUID per process.
        assert len(a_id) == 36 and len(b_id) == 36 and a_id != b_id


def test_sigkilled_typescript_executor_is_recovered_by_its_peer(fast: Relay, cluster: PostgresCluster,
                                                                tmp_path: Path) -> None:
    app, workflow_id, started = "ts-recovery", "ts-twenty-steps", list[Process]()
    sys_db = _system_database(cluster)
    _register(fast, app)
    go = tmp_path / "go"
    with _stopped_at_end(started):
        a, a_id, b, b_id = _start_pair(fast, tmp_path, app, sys_db, started, START_WORKFLOW=workflow_id,
                                       START_WORKFLOW_WHEN=str(go), STEP_SECONDS="0.3")
        wait_recorded(fast.temporal_address, app, a_id)
        go.touch()
        # Saved, not just logged: a step logs its line before DBOS checkpoints it, so a kill in between is fair.
        wait_until(lambda: len(_checkpointed_steps(sys_db, workflow_id)) >= 5, timeout=30,
                   what="A checkpointed 5 steps")
        a.kill()
        killed_at = time.monotonic()
        done_by_a = _checkpointed_steps(sys_db, workflow_id)
        assert _workflow_status(sys_db, workflow_id) == "PENDING"

        disconnected_at = wait_until(lambda: fast.executors(app).get(a_id) == "DISCONNECTED", timeout=1,
                                     interval=0.02, what="A DISCONNECTED")
        dead_at = wait_until(lambda: fast.executors(app).get(a_id) in ("DEAD", None), timeout=GRACE + 7,
                             interval=0.05, what="A DEAD")
        assert GRACE - 0.5 <= dead_at - disconnected_at <= GRACE + 2.0
        success_at = wait_until(lambda: _workflow_status(sys_db, workflow_id) == "SUCCESS", timeout=60,
                                interval=0.05, what="SUCCESS")
        wait_until(lambda: a_id not in fast.executors(app), timeout=10, what="A's record deleted")
        assert fast.executors(app) == {b_id: "HEALTHY"}

        # Every step ran exactly once across the two executors: none A had checkpointed ran again on B.
        steps = _steps_by_pid(tmp_path / "steps.log")
        by_a, by_b = steps.get(a.pid, []), steps.get(b.pid, [])
        assert by_b, "B ran no step"
        assert len(done_by_a) >= 5
        checkpointed_by_a = set(range(len(done_by_a)))  # the workflow runs its steps in order
        assert not checkpointed_by_a & set(by_b), f"steps checkpointed by A ran again on B: {by_a} {by_b}"
        assert sorted(set(by_a) | set(by_b)) == list(range(STEPS)), (by_a, by_b)
        assert len(by_b) == len(set(by_b)), by_b
        assert len(_checkpointed_steps(sys_db, workflow_id)) == STEPS

        ops = [op for op, ex in fast.audit(app) if ex == a_id]
        assert ops == ["executor.healthy", "executor.disconnected", "executor.dead", "executor.recovery.dispatched",
                       "executor.recovery.succeeded", "executor.deleted"], ops
        print(f"\nTypeScript: SIGKILL→DISCONNECTED {disconnected_at - killed_at:.2f}s, "
              f"→DEAD {dead_at - killed_at:.2f}s (grace {GRACE}s), →SUCCESS on the peer {success_at - killed_at:.2f}s")


def test_sigstopped_typescript_executor_disconnects_at_ping_wait_then_reconnects(
        fast: Relay, cluster: PostgresCluster, tmp_path: Path) -> None:
    app, started = "ts-sigstop", list[Process]()
    _register(fast, app, grace=60)
    with _stopped_at_end(started):
        executor = _executor(fast, tmp_path, "a", app, _system_database(cluster))
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
        ops = [op for op, ex in fast.audit(app) if ex == executor_id]
        assert ops == ["executor.healthy", "executor.disconnected", "executor.reconnected"], ops
        print(f"\nTypeScript: SIGSTOP→DISCONNECTED {seen - stopped:.2f}s, SIGCONT→HEALTHY {back - resumed:.2f}s")
