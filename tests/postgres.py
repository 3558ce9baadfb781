"""A private PostgreSQL cluster for tests, from Debian's `postgresql` binaries (installed by `make test`).

``initdb`` into a temp dir, then the ``postgres`` binary itself (no ``pg_ctl``, so the PID is the server's) on a free
port, its unix socket in that dir, trust auth, one database per test. ``stop()`` and ``start()`` end it and bring it
back by PID on the same port and data: a database outage as Relay sees one.

PostgreSQL refuses to run as root; as root the cluster runs as the ``postgres`` user the Debian package creates (or
``nobody``), and its temp dir is that user's. The dir is not under pytest's ``tmp_path``: that tree is mode 0700 for
root, so another user could not reach into it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from tests.support import Relay, free_port, running_relay, wait_until

SUPERUSER = "relay"
# Durability is not under test and an outage is a clean (fast) shutdown: skip the fsyncs, for speed.
SERVER_SETTINGS = ("fsync=off", "synchronous_commit=off", "full_page_writes=off", "listen_addresses=127.0.0.1")


def pg_bin() -> Path:
    """The newest installed version's binaries (/usr/lib/postgresql/<version>/bin)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    if not found:
        pytest.fail("PostgreSQL is missing: `make test` installs the Debian package postgresql")
    return Path(found[-1]).parent


def _server_user() -> pwd.struct_passwd | None:
    """Whom to run the server as: None (ourselves) unless we are root, which PostgreSQL refuses."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    pytest.fail("running as root with neither a postgres nor a nobody user to run PostgreSQL as")


class PostgresCluster:
    """One initialised cluster; ``start()``/``stop()`` as often as a test likes, always on the same port."""

    def __init__(self, root: Path, *, bin_dir: Path, user: pwd.struct_passwd | None) -> None:
        self.root, self.bin, self.user = root, bin_dir, user
        self.data, self.socket_dir, self.log = root / "data", root / "sock", root / "postgres.log"
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def _run_as(self) -> dict[str, Any]:
        """Popen arguments that drop to the server user (it execs the binary directly: no wrapper process)."""
        if self.user is None:
            return {}
        return {"user": self.user.pw_uid, "group": self.user.pw_gid, "extra_groups": []}

    def _env(self) -> dict[str, str]:
        return {"PATH": f"{self.bin}:/usr/bin:/bin", "LC_ALL": "C", "HOME": str(self.root)}

    def init(self) -> None:
        self.socket_dir.mkdir()
        if self.user is not None:
            for path in (self.root, self.socket_dir):
                os.chown(path, self.user.pw_uid, self.user.pw_gid)
        subprocess.run([str(self.bin / "initdb"), "-D", str(self.data), "-U", SUPERUSER, "-A", "trust", "-E", "UTF8",
                        "--locale=C", "--no-sync", "--no-instructions"],
                       env=self._env(), check=True, capture_output=True, **self._run_as())

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, *, timeout: float = 30) -> None:
        """Start the server on its port and data, and wait until it accepts connections."""
        assert not self.running, "already running"
        args = [str(self.bin / "postgres"), "-D", str(self.data), "-p", str(self.port), "-k", str(self.socket_dir)]
        for setting in SERVER_SETTINGS:
            args += ["-c", setting]
        with open(self.log, "ab") as out:
            self.process = subprocess.Popen(args, env=self._env(), stdout=out, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True, **self._run_as())
        try:
            wait_until(self._accepts, timeout=timeout, interval=0.05, what="PostgreSQL to accept connections")
        except AssertionError:
            self.stop()
            raise AssertionError(self.log.read_text(errors="replace")[-3000:]) from None

    def _accepts(self) -> bool:
        if not self.running:
            raise AssertionError("postgres exited: " + self.log.read_text(errors="replace")[-3000:])
        try:
            with psycopg.connect(**self.params("postgres"), connect_timeout=1):
                return True
        except psycopg.OperationalError:  # not listening yet, or "the database system is starting up"
            return False

    def stop(self, *, timeout: float = 30) -> None:
        """Fast shutdown by PID (SIGINT): sessions are ended, as a stopped server ends them. (SIGTERM, the smart
        shutdown, would wait for Relay's pooled connections to close by themselves.) SIGKILL if it lingers."""
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):  # its backends, if any outlived it
            os.killpg(process.pid, signal.SIGKILL)

    def params(self, database: str) -> dict[str, Any]:
        return {"host": "127.0.0.1", "port": self.port, "user": SUPERUSER, "dbname": database}

    def url(self, database: str) -> str:
        """The SQLAlchemy URL Relay takes in ``RELAY_DATABASE_URL``."""
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, prefix: str = "relay") -> str:
        """A new, empty database; returns its URL."""
        name = f"{prefix}_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(**self.params("postgres"), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)


@contextlib.contextmanager
def postgres_cluster() -> Iterator[PostgresCluster]:
    """A started private cluster, stopped by PID and removed at the end."""
    root = Path(tempfile.mkdtemp(prefix="relay-pg-"))
    cluster = PostgresCluster(root, bin_dir=pg_bin(), user=_server_user())
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def relay_on_postgres(cluster: PostgresCluster, data_dir: Path, **overrides: str) -> Iterator[Relay]:
    """`relay dev` with its store in a new database of ``cluster`` (Temporal stays on its own SQLite in
    ``data_dir``), stopped by PID at the end; it must exit cleanly, whatever the database went through."""
    with running_relay(data_dir, RELAY_DATABASE_URL=cluster.create_database(), **overrides) as started:
        yield started
