"""Helpers for tests that start real processes: free ports, and processes stopped by their PID."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import ClientConnection, connect

VENV_BIN = Path(sys.executable).parent
# A test outside tests/e2e that starts a real process (`relay`, haproxy, several Pythons at once): it runs in
# `make test`'s e2e tier (two at a time: it asserts no timing), not in `make check`, the one-minute loop.
STARTS_PROCESSES = (pytest.mark.e2e, pytest.mark.concurrent)


def starts_processes(test: Any) -> Any:
    """Mark ``test`` as one that starts real processes (``STARTS_PROCESSES``)."""
    for mark in STARTS_PROCESSES:
        test = mark(test)
    return test


_handed_out: set[int] = set()


def free_port() -> int:
    """A port nothing listens on, below the kernel's ephemeral range: a port from ``bind(0)`` can be handed to
    some process's outgoing connection (Temporal's own, say) before the server meant for it binds it."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        port = random.randrange(10_000, max(low, 10_001))
        if port in _handed_out:  # given out already: its server may not have bound it yet
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            _handed_out.add(port)
            return port
    with socket.socket() as s:  # no luck below the range: fall back to the kernel's choice
        s.bind(("127.0.0.1", 0))
        chosen: int = s.getsockname()[1]
        return chosen


class LogRecords(logging.Handler):
    """A logging handler that keeps every record it is given, for tests about what is logged."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


class Process:
    """A child process with its output in a log file; ``stop()`` ends it (and its children) by PID."""

    def __init__(self, args: list[str], *, env: Mapping[str, str], log: Path, cwd: Path | None = None) -> None:
        self.log = log
        with open(log, "ab") as out:
            self.popen = subprocess.Popen(args, env=dict(env), stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, cwd=cwd, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def kill(self) -> None:
        """SIGKILL: a crash, as far as everyone else can tell."""
        os.kill(self.pid, signal.SIGKILL)
        self.popen.wait()

    def stop(self, timeout: float = 20) -> int | None:
        """SIGTERM the process, wait, then SIGKILL its whole session if it is still there."""
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):  # anything it started and left behind
            os.killpg(self.pid, signal.SIGKILL)
        return self.popen.returncode

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def wait_until(predicate: object, *, timeout: float, interval: float = 0.05, what: str = "condition") -> float:
    """Poll a zero-argument callable until it returns truthy; returns the monotonic time it did."""
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return time.monotonic()
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def relay_env(data_dir: Path, **overrides: str) -> dict[str, str]:
    """Environment for a `relay` subprocess on free ports and its own data dir."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    env.update({
        "RELAY_DATA_DIR": str(data_dir),
        "RELAY_PORT": str(free_port()),
        "RELAY_TEMPORAL_PORT": str(free_port()),
        "RELAY_TEMPORAL_UI_PORT": str(free_port()),
        # No retention round unless a test triggers one: a round mid-test adds audit rows and wire frames.
        "RELAY_RETENTION_INTERVAL_SECS": "2592000",
        # No metrics listener unless a test asks for one (tests/e2e/test_metrics.py): each would take a port.
        "RELAY_METRICS_PORT": "0",
        # No alert round unless a test asks for one (tests/e2e/test_alerts.py): a round adds audit rows and may send
        # `alert` frames to the test's executors.
        "RELAY_ALERT_INTERVAL_SECS": "2592000",
        # No orphan sweep unless a test asks for one (tests/e2e/test_orphans.py): one would recover the PENDING
        # workflows a test leaves under executor ids it has stopped.
        "RELAY_ORPHAN_SWEEP_INTERVAL_SECS": "0",
        # A stopped `relay gateway` closes its sockets at once unless a test asks for a drain (tests/e2e/test_drain.py):
        # the 5 s default would only make every stop slower.
        "RELAY_SHUTDOWN_DRAIN_SECS": "0",
    })
    env.update(overrides)
    return env


@dataclass
class Relay:
    process: Process
    url: str
    ws_url: str
    key: str
    data_dir: Path
    env: dict[str, str] = field(default_factory=dict)

    @property
    def temporal_address(self) -> str:
        return self.env.get("RELAY_TEMPORAL_ADDRESS") or f"127.0.0.1:{self.env['RELAY_TEMPORAL_PORT']}"

    @property
    def db_url(self) -> str:
        """Relay's database: ``RELAY_DATABASE_URL`` when set, else the SQLite file in its data dir."""
        return self.env.get("RELAY_DATABASE_URL") or f"sqlite:///{self.data_dir / 'relay.db'}"

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.key}"}, timeout=10)

    def executors(self, app: str) -> dict[str, str]:
        """The app's executors by status; none while its first registration has not landed (the API's 404)."""
        with self.api() as client:
            response = client.get(f"/v2/orgs/local/apps/{app}/executors")
        if response.status_code == 404:
            return {}
        response.raise_for_status()
        return {e["executorId"]: e["status"] for e in response.json()}

    def audit(self, app: str) -> list[tuple[str, str | None]]:
        """``(operation, executor_id)`` of the app's audit rows, oldest first, from whichever database it uses."""
        return [(row.operation, row.executor_id) for row in audit_rows_at(self.db_url, app)]


def start_relay(data_dir: Path, env: dict[str, str], log: str = "relay.log") -> Relay:
    """Start `relay dev` with ``env`` (see ``relay_env``) and wait until it serves; the caller stops it."""
    process = Process([str(VENV_BIN / "relay"), "dev"], env=env, log=data_dir / log)
    url = f"http://127.0.0.1:{env['RELAY_PORT']}"
    try:
        wait_until(lambda: healthy(url), timeout=60, what="relay dev /healthz")
    except AssertionError:
        process.stop()
        raise AssertionError(process.output()[-3000:]) from None
    key = (data_dir / "dev-key").read_text().strip()
    return Relay(process, url, f"ws://127.0.0.1:{env['RELAY_PORT']}/", key, data_dir, env)


@contextlib.contextmanager
def running_relay(data_dir: Path, env: dict[str, str] | None = None, /, *, log: str = "relay.log",
                  **overrides: str) -> Iterator[Relay]:
    """`relay dev` on ``data_dir`` for the block: on ``env`` (a ``relay_env`` kept for a restart on the same ports),
    else on free ports, either with ``overrides``; its output in ``log``. Stopped after the block, and it must exit
    cleanly."""
    started = start_relay(data_dir, {**(relay_env(data_dir) if env is None else env), **overrides}, log)
    try:
        yield started
    finally:
        stop_cleanly(started)


def stop_cleanly(relay: Relay) -> None:
    """SIGTERM ``relay``'s process, give it ``STOP_GRACE`` to exit, and require exit status 0 (the failure says how
    long it took)."""
    began = time.monotonic()
    code = relay.process.stop(timeout=STOP_GRACE)
    took = time.monotonic() - began
    assert code == 0, f"exit {code} {took:.1f} s after SIGTERM; {relay.process.output()[-3000:]}"


# How long a `relay dev` that served a whole test module or session gets to stop gracefully: its worker's activities
# in flight get 15 s (worker.build_worker), its gateway's signals in flight 10 s (Gateway.drain), side by side; on a
# loaded machine (the concurrent tier beside the timed one) one such stop took over 20 s.
STOP_GRACE = 45.0


@pytest.fixture(scope="session")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Relay]:
    """One `relay dev` for the whole test session, on free ports and a temp data dir."""
    with running_relay(tmp_path_factory.mktemp("relay")) as started:
        yield started


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def ready(url: str, *, timeout: float = 2) -> bool:
    """The gateway at ``url`` answers ``/readyz`` 200 (in contact with Temporal, its database answering)."""
    try:
        return httpx.get(f"{url}/readyz", timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def play_executor(relay: Relay, app: str, executor_id: str, *, version: str = "v1",
                  metadata: dict[str, str] | None = None, key: str | None = None) -> Iterator[ClientConnection]:
    """A raw WebSocket client playing an executor (on ``key``, else the relay's own): answers the server's
    ``executor_info``, then idles."""
    with connect(f"{relay.ws_url}websocket/{app}/{key or relay.key}") as ws:
        request = json.loads(ws.recv(timeout=10))
        assert request["type"] == "executor_info"
        ws.send(json.dumps({"type": "executor_info", "request_id": request["request_id"],
                            "executor_id": executor_id, "application_version": version, "hostname": "test",
                            "language": "python", "dbos_version": "3.2.0", "executor_metadata": metadata,
                            "error_message": None}))
        yield ws


def closed_with(ws: ClientConnection, *, within: float) -> int:
    """Wait up to ``within`` seconds for the server to close the socket; returns its close code."""
    deadline = time.monotonic() + within
    with contextlib.suppress(ConnectionClosed, TimeoutError):
        while time.monotonic() < deadline:
            ws.recv(timeout=max(deadline - time.monotonic(), 0.01))
    assert ws.close_code is not None, f"socket still open after {within}s"
    return ws.close_code


def start_temporal(data_dir: Path, *extra: str) -> tuple[Process, str]:
    """A Temporal dev server on its own (as `relay dev` would start it, with Relay's search attributes), for
    tests that run `relay worker` / `relay gateway` separately. Returns the process and its address."""
    from cli.devserver import command
    from core.settings import Settings

    port = free_port()
    settings = Settings(data_dir=data_dir, temporal_port=port, temporal_ui_port=free_port())
    process = Process([*command(settings), "--headless", *extra], env=os.environ, log=data_dir / "temporal.log")
    return process, f"127.0.0.1:{port}"


@dataclass
class Gateways:
    env: dict[str, str]  # the processes' environment (each gateway's own RELAY_PORT and RELAY_GATEWAY_ID added)
    key: str
    ports: list[int]
    processes: list[Process]


def start_gateways(data_dir: Path, processes: list[Process], *, count: int = 2, **overrides: str) -> Gateways:
    """A Temporal dev server, `relay worker`, a key, and ``count`` `relay gateway`s on free ports with fixed ids
    (``gateway-1``, ...), all on one database, each gateway ready; every process is appended to ``processes`` as it
    starts, for the caller to stop."""
    temporal, address = start_temporal(data_dir)
    processes.append(temporal)
    env = relay_env(data_dir, RELAY_TEMPORAL_ADDRESS=address, **overrides)
    processes.append(Process([str(VENV_BIN / "relay"), "worker"], env=env, log=data_dir / "worker.log"))
    key = subprocess.run([str(VENV_BIN / "relay"), "keys", "create", "--init"], env=env, check=True,
                         capture_output=True, text=True, timeout=60).stdout.strip()
    ports = [free_port() for _ in range(count)]
    gateways = []
    for n, port in enumerate(ports, 1):
        gateways.append(Process([str(VENV_BIN / "relay"), "gateway"], log=data_dir / f"gateway-{n}.log",
                                env={**env, "RELAY_PORT": str(port), "RELAY_GATEWAY_ID": f"gateway-{n}"}))
        processes.append(gateways[-1])
    for port in ports:
        wait_until(lambda port=port: ready(f"http://127.0.0.1:{port}"), timeout=60, what="gateway ready")
    return Gateways(env, key, ports, gateways)


# -- recovery under faults: real executors, raw peers, the audit trail with its details ---------------

EXECUTOR_APP = Path(__file__).with_name("executor_app.py")


def dbos_executor(ws_url: str, key: str, app: str, sys_db: Path, log: Path, **extra: str) -> Process:
    """A real ``dbos==3.2.0`` executor (tests/executor_app.py); ``extra`` is its environment (STEP_LOG, ...)."""
    env = {"PATH": str(VENV_BIN), "RELAY_URL": ws_url, "RELAY_KEY": key, "APP_NAME": app, "SYS_DB": str(sys_db),
           "APP_VERSION": "v1", "STEP_LOG": str(log.with_suffix(".steps")), **extra}
    return Process([sys.executable, str(EXECUTOR_APP)], env=env, log=log)


def workflow_status(sys_db: Path, workflow_id: str) -> str | None:
    """A workflow's status in a DBOS SQLite system database (None until the row exists)."""
    if not sys_db.exists():
        return None
    with contextlib.closing(sqlite3.connect(sys_db, timeout=10)) as db:
        row = db.execute("SELECT status FROM workflow_status WHERE workflow_uuid = ?", (workflow_id,)).fetchone()
    return None if row is None else str(row[0])


@dataclass(frozen=True)
class AuditRow:
    operation: str
    executor_id: str | None
    emit_time: float  # epoch seconds
    details: dict[str, object]
    status: str = "success"


def audit_rows(data_dir: Path, app: str, executor_id: str | None = None) -> list[AuditRow]:
    """The app's audit rows, oldest first, read from Relay's database (so it works while no gateway runs)."""
    from datetime import UTC, datetime

    with contextlib.closing(sqlite3.connect(data_dir / "relay.db", timeout=10)) as db:
        rows = db.execute("SELECT operation, executor_id, emit_time, details, status FROM auditlog WHERE app = ? "
                          "ORDER BY emit_time", (app,)).fetchall()
    out = [AuditRow(op, ex, datetime.fromisoformat(t).replace(tzinfo=UTC).timestamp(), json.loads(d or "{}"), st)
           for op, ex, t, d, st in rows]
    return [r for r in out if executor_id is None or r.executor_id == executor_id]


def registry(data_dir: Path, app: str) -> dict[str, str]:
    """Executor id → status, read from Relay's database (so it works while no gateway runs)."""
    with contextlib.closing(sqlite3.connect(data_dir / "relay.db", timeout=10)) as db:
        rows = db.execute("SELECT executor_id, status FROM executor WHERE app = ?", (app,)).fetchall()
    return {str(ex): str(status) for ex, status in rows}


def _read_db(url: str, query: Any) -> list[Any]:
    """Rows of one query against any database Relay runs on (a SQLAlchemy URL), through the model's column types,
    on a connection of its own that is closed at once (no pool left behind)."""
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as conn:
            return list(conn.execute(query).all())
    finally:
        engine.dispose()


def audit_rows_at(url: str, app: str, executor_id: str | None = None) -> list[AuditRow]:
    """``audit_rows``, from the database at ``url`` (SQLite or PostgreSQL)."""
    from sqlmodel import col, select

    from core.models import AuditLog

    query = select(AuditLog).where(AuditLog.app == app).order_by(col(AuditLog.emit_time))
    if executor_id is not None:
        query = query.where(AuditLog.executor_id == executor_id)
    rows = [row._mapping for row in _read_db(url, query)]
    return [AuditRow(r["operation"], r["executor_id"], r["emit_time"].timestamp(), r["details"] or {}, r["status"])
            for r in rows]


def registry_at(url: str, app: str) -> dict[str, str]:
    """``registry``, from the database at ``url`` (SQLite or PostgreSQL)."""
    from sqlmodel import select

    from core.models import Executor

    rows = _read_db(url, select(Executor.executor_id, Executor.status).where(Executor.app == app))
    return {str(ex): str(status) for ex, status in rows}


DROP = "drop"  # what a RawPeer's answer function returns to close the socket instead of answering


def healthy_answer(request: dict[str, object]) -> dict[str, object] | str | None:
    """A healthy peer's answers: ``recovery`` succeeds and nothing stays pending."""
    reply: dict[str, object] = {"type": request["type"], "request_id": request["request_id"], "error_message": None}
    if request["type"] == "recovery":
        reply["success"] = True
    elif request["type"] == "exist_pending_workflows":
        reply["exist"] = False
    else:
        reply["error_message"] = "Unknown message type"
    return reply


class RawPeer:
    """A protocol client playing an executor in a thread: it answers ``executor_info``, then every request with
    ``answer(request)`` (a reply; None: never answer; ``DROP``: close the socket), and reconnects with the same
    executor id whenever the socket drops (e.g. a gateway restart), until ``stop()``. The websockets client
    answers pings, so the gateway's liveness check never fires on it."""

    def __init__(self, ws_url: str, app: str, key: str, executor_id: str, *, version: str = "v1",
                 answer: object = healthy_answer, reconnect: bool = True) -> None:
        import threading

        assert callable(answer)
        self.url = f"{ws_url}websocket/{app}/{key}"
        self.executor_id, self.version, self._answer, self._reconnect = executor_id, version, answer, reconnect
        self.requests: list[dict[str, object]] = []
        self.handshakes = 0
        self._stop = threading.Event()
        self._ws: ClientConnection | None = None
        self._thread = threading.Thread(target=self._run, name=f"raw-peer-{executor_id}", daemon=True)
        self._thread.start()

    def requests_of(self, kind: str) -> list[dict[str, object]]:
        return [r for r in list(self.requests) if r["type"] == kind]

    def _run(self) -> None:
        from websockets.exceptions import ConnectionClosed, InvalidHandshake

        while not self._stop.is_set():
            try:
                with connect(self.url, open_timeout=5) as ws:
                    self._ws = ws
                    if self._serve(ws) == DROP and not self._reconnect:
                        return
            except (OSError, ConnectionClosed, InvalidHandshake, TimeoutError):
                pass
            self._stop.wait(0.2)

    def _serve(self, ws: ClientConnection) -> str | None:
        while not self._stop.is_set():
            try:
                request = json.loads(ws.recv(timeout=0.2))
            except TimeoutError:
                continue
            if request["type"] == "executor_info":
                ws.send(json.dumps({"type": "executor_info", "request_id": request["request_id"],
                                    "executor_id": self.executor_id, "application_version": self.version,
                                    "hostname": "raw-peer", "language": "python", "dbos_version": "3.2.0",
                                    "executor_metadata": None, "error_message": None}))
                self.handshakes += 1
                continue
            self.requests.append(request)
            reply = self._answer(request)
            if reply == DROP:
                ws.close()
                return DROP
            if reply is not None:
                ws.send(json.dumps(reply))
        return None

    def stop(self) -> None:
        """Close the socket normally (the gateway sees a disconnect at once) and end the thread."""
        self._stop.set()
        if self._ws is not None:
            with contextlib.suppress(Exception):
                self._ws.close()
        self._thread.join(10)


def lifecycle_state(temporal_address: str, app: str, executor_id: str, *, org: str = "local") -> object | None:
    """The executor's lifecycle workflow state (a ``LifecycleState``, by query); None if it cannot be read."""
    import asyncio

    from core.temporal import connect as temporal_connect
    from workflows.contracts.common import lifecycle_workflow_id
    from workflows.lifecycle import ExecutorLifecycleWorkflow

    async def query() -> object:
        client = await temporal_connect(temporal_address, "default")
        handle = client.get_workflow_handle(lifecycle_workflow_id(org, app, executor_id))
        return await handle.query(ExecutorLifecycleWorkflow.state)

    try:
        return asyncio.run(query())
    except Exception:
        return None


def wait_recorded(temporal_address: str, app: str, executor_id: str, *, timeout: float = 10) -> None:
    """Until the executor's lifecycle workflow has taken in its own HEALTHY record, not just the registry row.

    The registry row is written inside the ``record_status`` activity, before the workflow hears it completed; a
    ``disconnected`` handled before the workflow hears it makes the workflow record a spurious
    ``executor.reconnected`` and start a second grace (reported as a bug). Tests about other things disconnect
    an executor only once this holds.
    """
    def recorded() -> bool:
        state = lifecycle_state(temporal_address, app, executor_id)
        connection = getattr(state, "connection", None)
        return (getattr(state, "status", None) == "HEALTHY" and connection is not None
                and getattr(state, "recorded_connection_id", None) == connection.connection_id)

    wait_until(recorded, timeout=timeout, interval=0.1, what=f"{executor_id} HEALTHY in its workflow")
