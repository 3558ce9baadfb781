"""Real DBOS executors of every SDK, for the end-to-end tests: how to start each one, and its system database.

Every executor app (``tests/executor_app.py`` for Python, ``tests/executors/<language>/`` for the others, built by
``make test``) reads the same environment: RELAY_URL, RELAY_KEY, APP_NAME, APP_VERSION, its system database
(SYS_DB, a SQLite path, or SYS_DB_URL, a PostgreSQL URL), STEP_LOG (each step of ``twenty_steps`` appends
``"<pid> <step>"``), STEP_SECONDS, EXECUTOR_METADATA, START_WORKFLOW / START_WORKFLOW_WHEN, and for
retention FINISHED_WORKFLOWS and PENDING_WORKFLOWS. The SDK's own tables are the same in each but live in schema
``dbos`` on PostgreSQL.
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.postgres import PostgresCluster
from tests.support import VENV_BIN, Process, Relay

TESTS = Path(__file__).parent
EXECUTORS = TESTS / "executors"


@dataclass(frozen=True)
class SystemDatabase:
    """One app's DBOS system database: a SQLite file or a PostgreSQL database (``params`` for psycopg)."""

    path: Path | None = None
    params: dict[str, Any] | None = None

    @property
    def env(self) -> dict[str, str]:
        if self.path is not None:
            return {"SYS_DB": str(self.path)}
        assert self.params is not None
        p = self.params
        return {"SYS_DB_URL": f"postgresql://{p['user']}@{p['host']}:{p['port']}/{p['dbname']}"}

    def query(self, sql: str, *args: object) -> list[tuple[Any, ...]]:
        """Rows of ``sql`` (tables unqualified, ``?`` placeholders); none while the SDK has not created them."""
        if self.path is not None:
            if not self.path.exists():
                return []
            try:
                with contextlib.closing(sqlite3.connect(self.path, timeout=10)) as db, db:
                    return list(db.execute(sql, args).fetchall())
            except sqlite3.OperationalError as e:
                if "no such table" in str(e):
                    return []
                raise
        assert self.params is not None
        try:
            with psycopg.connect(**self.params, connect_timeout=5, options="-c search_path=dbos") as conn:
                cursor = conn.execute(sql.replace("%", "%%").replace("?", "%s"), args)
                return list(cursor.fetchall()) if cursor.description else []
        except psycopg.errors.UndefinedTable:
            return []

    def statuses(self) -> dict[str, str]:
        return {str(i): str(s) for i, s in self.query("SELECT workflow_uuid, status FROM workflow_status")}

    def status(self, workflow_id: str) -> str | None:
        return self.statuses().get(workflow_id)

    def checkpointed_steps(self, workflow_id: str) -> int:
        """How many of the workflow's steps are checkpointed (each app names them ``step`` or ``step-N``)."""
        rows = self.query("SELECT count(*) FROM operation_outputs WHERE workflow_uuid = ? "
                          "AND function_name LIKE 'step%'", workflow_id)
        return int(rows[0][0]) if rows else 0

    def backdate(self, workflow_ids: list[str], *, by_ms: int) -> None:
        """Make workflows older: the SDKs compare ``completed_at`` or ``created_at`` (GC) and ``created_at``
        (the global timeout), all epoch milliseconds."""
        if self.path is not None:
            columns = {str(r[1]) for r in self.query("PRAGMA table_info(workflow_status)")}
        else:
            columns = {str(r[0]) for r in self.query(
                "SELECT column_name FROM information_schema.columns WHERE table_schema = 'dbos' "
                "AND table_name = 'workflow_status'")}
        moved = [c for c in ("created_at", "updated_at", "completed_at") if c in columns]
        assert "created_at" in moved, columns
        assignments = ", ".join(f"{c} = {c} - ?" for c in moved)
        for workflow_id in workflow_ids:
            self.query(f"UPDATE workflow_status SET {assignments} WHERE workflow_uuid = ?",
                       *([by_ms] * len(moved)), workflow_id)


@dataclass(frozen=True)
class Sdk:
    """One DBOS SDK's executor app, named as `make test-sdk SDK=<name>` names it."""

    name: str
    version: str  # its dbos_version, as the executor reports it
    postgres_only: bool  # its system database: PostgreSQL only, or a SQLite file
    pong_timeout: timedelta  # how long its client waits for the pong to its own ping before dropping the socket
    command: Callable[[], list[str]]
    cwd: Path | None = None
    language: str = ""  # the ``language`` it reports in executor_info: its name unless said

    def __post_init__(self) -> None:
        if not self.language:
            object.__setattr__(self, "language", self.name)

    def system_database(self, tmp: Path, cluster: PostgresCluster | None) -> SystemDatabase:
        """A new, empty system database for one app."""
        if not self.postgres_only:
            return SystemDatabase(path=tmp / f"{self.name}-sys.sqlite")
        assert cluster is not None, f"{self.name} needs PostgreSQL"
        url = cluster.create_database("dbos")
        return SystemDatabase(params=cluster.params(url.rsplit("/", 1)[1]))

    def start(self, relay: Relay, tmp: Path, name: str, app: str, sys_db: SystemDatabase, **extra: str) -> Process:
        """Start one executor of ``app`` (the caller stops it); its output goes to ``tmp/<name>.log``."""
        command = self.command()
        env = {"PATH": f"{Path(command[0]).parent}:/usr/bin:/bin", "HOME": str(tmp), "RELAY_URL": relay.ws_url,
               "RELAY_KEY": relay.key, "APP_NAME": app, "APP_VERSION": "v1", "STEP_LOG": str(tmp / "steps.log"),
               **sys_db.env, **extra}
        return Process(command, env=env, log=tmp / f"{name}.log", cwd=self.cwd)


def _installed(path: Path, make: str) -> None:
    if not path.exists():
        pytest.fail(f"{path.relative_to(TESTS.parent)} is missing: `make test-sdk SDK={make}` builds it")


def _python() -> list[str]:
    return [str(VENV_BIN / "python"), str(TESTS / "executor_app.py")]


def _python_current() -> list[str]:
    python = EXECUTORS / "python" / ".venv" / "bin" / "python"
    _installed(EXECUTORS / "python" / ".venv" / ".installed", "python-current")
    return [str(python), str(EXECUTORS / "python" / "executor.py")]


def _node(name: str) -> Callable[[], list[str]]:
    """The TypeScript executor in tests/executors/<name> (``executor.js``, run from there)."""
    def command() -> list[str]:
        node = shutil.which("node")
        if node is None:
            pytest.fail("node is not on PATH: the TypeScript executor needs Node >= 20")
        _installed(EXECUTORS / name / "node_modules" / ".installed", name)
        return [node, "executor.js"]
    return command


def _go(name: str) -> Callable[[], list[str]]:
    """The Go executor built in tests/executors/<name>/bin."""
    def command() -> list[str]:
        binary = EXECUTORS / name / "bin" / "executor"
        _installed(binary, name)
        return [str(binary)]
    return command


def _java() -> list[str]:
    java, jar = shutil.which("java"), EXECUTORS / "java" / "target" / "executor.jar"
    if java is None:
        pytest.fail("java is not on PATH: the Java executor needs JDK 17")
    _installed(jar, "java")
    return [java, "-jar", str(jar)]


# Pong timeouts as read in each SDK's conductor client: Python's, TypeScript's and Java's 15 s (TypeScript counts
# any message as life), Go's 30 s read deadline extended by pongs only.
SDKS = {
    "python": Sdk("python", "3.2.0", postgres_only=False, pong_timeout=timedelta(seconds=15),
                  command=_python),
    # The current release, through Relay's own client (clients/python): its keepalive is the client's.
    "python-current": Sdk("python-current", "3.4.0", postgres_only=False, pong_timeout=timedelta(seconds=15),
                          command=_python_current, language="python"),
    "typescript": Sdk("typescript", "5.2.11", postgres_only=True, pong_timeout=timedelta(seconds=15),
                      command=_node("typescript"), cwd=EXECUTORS / "typescript"),
    "go": Sdk("go", "v1.6.0", postgres_only=False, pong_timeout=timedelta(seconds=30), command=_go("go")),
    "java": Sdk("java", "1.1.0-m6", postgres_only=True, pong_timeout=timedelta(seconds=15),
                command=_java),
    # The current TypeScript and Go releases, through Relay's own clients (clients/typescript, clients/go).
    "typescript-current": Sdk("typescript-current", "5.3.0", postgres_only=True, pong_timeout=timedelta(seconds=15),
                              command=_node("typescript-current"), cwd=EXECUTORS / "typescript-current",
                              language="typescript"),
    "go-current": Sdk("go-current", "v1.9.0", postgres_only=False, pong_timeout=timedelta(seconds=15),
                      command=_go("go-current"), language="go"),
}


def steps_by_pid(log: Path) -> dict[int, list[int]]:
    """What each executor process ran, from the apps' shared STEP_LOG."""
    out: dict[int, list[int]] = {}
    if log.exists():
        for line in log.read_text().splitlines():
            pid, step = line.split()
            out.setdefault(int(pid), []).append(int(step))
    return out
