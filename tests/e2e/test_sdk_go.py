"""Go executors end to end: real `github.com/dbos-inc/dbos-transact-golang` v1.5.0 executors (tests/executors/go,
built by `make test` / `make test-sdk SDK=go`) against `relay dev`, sharing a SQLite system database (the SDK's
pure-Go modernc.org/sqlite driver). Shortened timings: ping wait 2 s, server ping every 0.5 s, a 3 s grace between
DISCONNECTED and DEAD."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import Process, Relay, relay_env, start_relay, wait_recorded, wait_until

pytestmark = pytest.mark.e2e

EXECUTOR_BIN = Path(__file__).parents[1] / "executors" / "go" / "bin" / "executor"
SDK_VERSION = "v1.5.0"
PING_WAIT = 2.0
GRACE = 3
STEPS = 20


@pytest.fixture(scope="module")
def fast(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Relay]:
    data_dir = tmp_path_factory.mktemp("go-relay")
    env = relay_env(data_dir, RELAY_EXECUTOR_PING_WAIT_SECS=str(PING_WAIT), RELAY_SERVER_PING_INTERVAL_SECS="0.5")
    relay = start_relay(data_dir, env)
    try:
        yield relay
    finally:
        code = relay.process.stop()
        assert code == 0, relay.process.output()[-3000:]


def _binary() -> Path:
    if not EXECUTOR_BIN.exists():
        pytest.fail("the Go executor is not built: `make test-sdk SDK=go` builds it")
    return EXECUTOR_BIN


def _register(relay: Relay, app: str, *, grace: int = GRACE) -> None:
    """Register the app before its first executor connects, with a short grace."""
    with relay.api() as client:
        assert client.put(f"/v2/orgs/local/apps/{app}").status_code == 204
        assert client.patch(f"/v2/orgs/local/apps/{app}", json={"executorTimeoutSecs": grace}).status_code == 204
        assert client.get(f"/v2/orgs/local/apps/{app}").json()["executorTimeoutSecs"] == grace


def _executor(relay: Relay, tmp: Path, name: str, app: str, sys_db: Path, **extra: str) -> Process:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp), "RELAY_URL": relay.ws_url, "RELAY_KEY": relay.key,
           "APP_NAME": app, "APP_VERSION": "v1", "SYS_DB": str(sys_db), "STEP_LOG": str(tmp / "steps.log"), **extra}
    return Process([str(_binary())], env=env, log=tmp / f"{name}.log")


def _query(sys_db: Path, query: str, *args: object) -> list[tuple[Any, ...]]:
    """Rows of one query against the SQLite system database; none while it or its tables do not exist yet."""
    if not sys_db.exists():
        return []
    try:
        with contextlib.closing(sqlite3.connect(sys_db, timeout=10)) as db:
            return list(db.execute(query, args).fetchall())
    except sqlite3.OperationalError as e:
        if "no such table" in str(e):
            return []
        raise


def _workflow_status(sys_db: Path, workflow_id: str) -> str | None:
    rows = _query(sys_db, "SELECT status FROM workflow_status WHERE workflow_uuid = ?", workflow_id)
    return None if not rows else str(rows[0][0])


def _checkpointed_steps(sys_db: Path, workflow_id: str) -> set[int]:
    """The app's step numbers (its steps are named ``step-N``) checkpointed for the workflow."""
    rows = _query(sys_db, "SELECT function_name FROM operation_outputs WHERE workflow_uuid = ? "
                  "AND function_name LIKE 'step-%'", workflow_id)
    return {int(str(r[0]).removeprefix("step-")) for r in rows}


def _steps_by_executor(log: Path) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    if log.exists():
        for line in log.read_text().splitlines():
            executor_id, step = line.split()
            out.setdefault(executor_id, []).append(int(step))
    return out


def _listed(relay: Relay, app: str) -> list[dict[str, Any]]:
    with relay.api() as client:
        response = client.get(f"/v2/orgs/local/apps/{app}/executors")
    response.raise_for_status()
    listed: list[dict[str, Any]] = response.json()
    return listed


@contextlib.contextmanager
def _stopped_at_end(processes: list[Process]) -> Iterator[None]:
    try:
        yield
    finally:
        for process in processes:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, signal.SIGCONT)
            process.stop()


def _start_pair(relay: Relay, tmp: Path, app: str, sys_db: Path, started: list[Process],
                **a_extra: str) -> tuple[Process, str, Process, str]:
    """A, then (once A is HEALTHY, so it has created the brand-new SQLite system database) B; both HEALTHY."""
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


def test_go_executors_are_listed_healthy_with_their_fields(fast: Relay, tmp_path: Path) -> None:
    app, started = "go-fields", list[Process]()
    _register(fast, app)
    with _stopped_at_end(started):
        _, a_id, _, b_id = _start_pair(fast, tmp_path, app, tmp_path / "sys.sqlite", started)
        listed = {e["executorId"]: e for e in _listed(fast, app)}
        assert set(listed) == {a_id, b_id}
        for executor_id, role in ((a_id, "a"), (b_id, "b")):
            entry = listed[executor_id]
            assert entry["status"] == "HEALTHY"
            assert entry["language"] == "go"
            assert entry["dbosVersion"] == SDK_VERSION
            assert entry["appVersion"] == "v1"
            assert entry["hostname"] == socket.gethostname()
            assert entry["executorMetadata"] == {"role": role}
        # A conductor key makes the executor id a fresh random UUID per process.
        assert len(a_id) == 36 and len(b_id) == 36 and a_id != b_id


def test_sigkilled_go_executor_is_recovered_by_its_peer(fast: Relay, tmp_path: Path) -> None:
    app, workflow_id, started = "go-recovery", "go-twenty-steps", list[Process]()
    sys_db = tmp_path / "sys.sqlite"
    _register(fast, app)
    go = tmp_path / "go"
    with _stopped_at_end(started):
        a, a_id, b, b_id = _start_pair(fast, tmp_path, app, sys_db, started, START_WORKFLOW=workflow_id,
                                       START_WORKFLOW_WHEN=str(go), STEP_SECONDS="0.3")
        wait_recorded(fast.temporal_address, app, a_id)
        go.touch()
        # Checkpointed, not just logged: a step logs its line before DBOS records its output, so a kill between
        # the two leaves a logged step that rightly runs again on the peer.
        wait_until(lambda: len(_checkpointed_steps(sys_db, workflow_id)) >= 5, timeout=30, interval=0.02,
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
        steps = _steps_by_executor(tmp_path / "steps.log")
        by_a, by_b = steps.get(a_id, []), steps.get(b_id, [])
        assert set(steps) <= {a_id, b_id}, steps
        assert by_b, "B ran no step"
        assert len(done_by_a) >= 5
        assert done_by_a == set(range(len(done_by_a))), done_by_a  # the workflow runs its steps in order
        assert not done_by_a & set(by_b), f"steps checkpointed by A ran again on B: {by_a} {by_b}"
        assert sorted(set(by_a) | set(by_b)) == list(range(STEPS)), (by_a, by_b)
        assert len(by_b) == len(set(by_b)), by_b
        assert _checkpointed_steps(sys_db, workflow_id) == set(range(STEPS))

        ops = [op for op, ex in fast.audit(app) if ex == a_id]
        assert ops == ["executor.healthy", "executor.disconnected", "executor.dead", "executor.recovery.dispatched",
                       "executor.recovery.succeeded", "executor.deleted"], ops
        print(f"\nGo: SIGKILL→DISCONNECTED {disconnected_at - killed_at:.2f}s, →DEAD {dead_at - killed_at:.2f}s "
              f"(grace {GRACE}s), →SUCCESS on the peer {success_at - killed_at:.2f}s")


def test_sigstopped_go_executor_disconnects_at_ping_wait_then_reconnects(fast: Relay, tmp_path: Path) -> None:
    app, started = "go-sigstop", list[Process]()
    _register(fast, app, grace=60)
    with _stopped_at_end(started):
        executor = _executor(fast, tmp_path, "a", app, tmp_path / "sys.sqlite")
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
        # The Go client redials at once when its read fails; only a failed dial waits (1 s doubling to 30 s, ±50 %
        # jitter). Bounded well under its 30 s cap.
        back = wait_until(lambda: fast.executors(app).get(executor_id) == "HEALTHY", timeout=15, interval=0.05,
                          what="HEALTHY again")
        ops = [op for op, ex in fast.audit(app) if ex == executor_id]
        assert ops == ["executor.healthy", "executor.disconnected", "executor.reconnected"], ops
        print(f"\nGo: SIGSTOP→DISCONNECTED {seen - stopped:.2f}s, SIGCONT→HEALTHY {back - resumed:.2f}s")
