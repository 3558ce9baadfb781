"""The embedded Temporal: the CLI dev server from the venv's ``temporal`` binary, SQLite under the data dir."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import signal
import subprocess
from datetime import timedelta

from gateway.settings import Settings
from gateway.temporal import connect, venv_binary
from workflows.inputs import SEARCH_ATTRIBUTES

log = logging.getLogger("relay.dev")
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # If `relay dev` is SIGKILLed it cannot stop its child; the kernel then sends the child SIGTERM.
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def command(settings: Settings) -> list[str]:
    cmd = [
        str(venv_binary("temporal")), "server", "start-dev",
        "--db-filename", str(settings.data_dir / "temporal.db"),
        "--ip", "127.0.0.1",
        "--port", str(settings.temporal_port),
        "--ui-port", str(settings.temporal_ui_port),
        # WAL and synchronous=normal: about 3x the default throughput (DESIGN.md).
        "--sqlite-pragma", "journal_mode=wal",
        "--sqlite-pragma", "synchronous=normal",
        "--log-level", "warn",
    ]
    if settings.temporal_namespace != "default":
        cmd += ["--namespace", settings.temporal_namespace]
    for name, kind in SEARCH_ATTRIBUTES.items():
        cmd += ["--search-attribute", f"{name}={kind}"]
    return cmd


class TemporalDevServer:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    async def start(self, *, timeout: timedelta = timedelta(seconds=60)) -> None:
        self._spawn()
        await self._wait_ready(timeout)

    def _spawn(self) -> None:
        self._settings.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self._settings.data_dir / "temporal.log", "ab") as log_file:
            # Its own session: Ctrl-C in a terminal reaches `relay dev` only, which stops the gateway and worker
            # (they still need Temporal to report disconnects) before stopping Temporal.
            self._process = subprocess.Popen(command(self._settings), stdout=log_file, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent,
                                             start_new_session=True)

    async def _wait_ready(self, timeout: timedelta) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout.total_seconds()
        while True:
            if self._process is not None and self._process.poll() is not None:
                raise RuntimeError(f"temporal dev server exited with {self._process.returncode}; "
                                   f"see {self._settings.data_dir / 'temporal.log'}")
            try:
                await connect(self._settings.temporal_target, self._settings.temporal_namespace)
                return
            except RuntimeError:
                if loop.time() > deadline:
                    raise
                await asyncio.sleep(0.2)

    def stop(self, *, timeout: timedelta = timedelta(seconds=15)) -> None:
        if self._process is None or self._process.poll() is not None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout.total_seconds())
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
