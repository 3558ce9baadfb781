"""Helpers for tests that start real processes: free ports, and processes stopped by their PID."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from websockets.sync.client import ClientConnection, connect

VENV_BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


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
        with contextlib.suppress(ProcessLookupError):  # anything it started and left behind
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

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.key}"}, timeout=10)

    def executors(self, app: str) -> dict[str, str]:
        with self.api() as client:
            response = client.get(f"/v2/orgs/local/apps/{app}/executors")
        response.raise_for_status()
        return {e["executorId"]: e["status"] for e in response.json()}

    def audit(self, app: str) -> list[tuple[str, str | None]]:
        with sqlite3.connect(self.data_dir / "relay.db") as db:
            rows = db.execute("SELECT operation, executor_id FROM auditlog WHERE app = ? ORDER BY emit_time",
                              (app,)).fetchall()
        return [(op, ex) for op, ex in rows]


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
    return Relay(process, url, f"ws://127.0.0.1:{env['RELAY_PORT']}/", key, data_dir)


@pytest.fixture(scope="session")
def relay(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Relay]:
    """One `relay dev` for the whole test session, on free ports and a temp data dir."""
    data_dir = tmp_path_factory.mktemp("relay")
    started = start_relay(data_dir, relay_env(data_dir))
    try:
        yield started
    finally:
        code = started.process.stop()
        assert code == 0, started.process.output()[-3000:]


def healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


@contextlib.contextmanager
def play_executor(relay: Relay, app: str, executor_id: str, *, version: str = "v1",
                  metadata: dict[str, str] | None = None) -> Iterator[ClientConnection]:
    """A raw WebSocket client playing an executor: answers the server's ``executor_info``, then idles."""
    with connect(f"{relay.ws_url}websocket/{app}/{relay.key}") as ws:
        request = json.loads(ws.recv(timeout=10))
        assert request["type"] == "executor_info"
        ws.send(json.dumps({"type": "executor_info", "request_id": request["request_id"],
                            "executor_id": executor_id, "application_version": version, "hostname": "test",
                            "language": "python", "dbos_version": "3.2.0", "executor_metadata": metadata,
                            "error_message": None}))
        yield ws


def start_temporal(data_dir: Path, *extra: str) -> tuple[Process, str]:
    """A Temporal dev server on its own (as `relay dev` would start it, with Relay's search attributes), for
    tests that run `relay worker` / `relay gateway` separately. Returns the process and its address."""
    from gateway.devserver import command
    from gateway.settings import Settings

    port = free_port()
    settings = Settings(data_dir=data_dir, temporal_port=port, temporal_ui_port=free_port())
    process = Process([*command(settings), "--headless", *extra], env=os.environ, log=data_dir / "temporal.log")
    return process, f"127.0.0.1:{port}"
