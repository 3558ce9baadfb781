"""Fixtures of the client's tests: one real DBOS (the pinned 3.4) per session, launched on a SQLite file by the
first test that needs it and destroyed at the session's end; the operations table built on it."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from dbos import DBOS

import relay_dbos
from relay_dbos.operations import Operations
from relay_dbos.retention import Retention
from tests import dbos_app
from tests.support import Asker


@dataclass
class DbosEnv:
    """The launched DBOS: its SQLite file, and the waiters the tests started (released at the session's end)."""

    db: Path
    url: str
    executor_id: str
    waiters: list[tuple[str, str]] = field(default_factory=list)  # (workflow id, topic)

    def start_waiter(self, topic: str = "go") -> str:
        """A workflow of this executor that stays PENDING until ``release``."""
        workflow_id = DBOS.start_workflow(dbos_app.waiter, topic).workflow_id
        self.waiters.append((workflow_id, topic))
        return workflow_id

    def release(self, workflow_id: str, topic: str = "go") -> None:
        DBOS.send(workflow_id, "released", topic)


@pytest.fixture(scope="session")
def dbos_env() -> Iterator[DbosEnv]:
    # tmpfs when there is one: SQLite's fsyncs on a disk make each workflow ~50 ms slower.
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    directory = Path(tempfile.mkdtemp(prefix="relay-dbos-tests-", dir=shm))
    db = directory / "sys.sqlite"
    env = DbosEnv(db=db, url=f"sqlite:///{db}", executor_id=relay_dbos.executor_id())
    dbos_app.launch(env.url, env.executor_id)
    try:
        DBOS.register_queue(dbos_app.WORK_QUEUE, worker_concurrency=4)
        DBOS.register_queue(dbos_app.PARKED_QUEUE)
        yield env
    finally:
        for workflow_id, topic in env.waiters:  # a waiter blocks a DBOS thread until its message comes
            with contextlib.suppress(Exception):  # the session ends anyway
                env.release(workflow_id, topic)
        DBOS.destroy(workflow_completion_timeout_sec=5)  # the released waiters end first
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def make_asker(dbos_env: DbosEnv) -> Iterator[Callable[..., Asker]]:
    """Builds an ``Asker`` on the real operations table (``metadata_only`` as asked); the retention threads it
    starts are joined at the test's end."""
    retentions: list[Retention] = []
    stopping = threading.Event()

    def make(*, metadata_only: bool = False, metadata: dict[str, object] | None = None) -> Asker:
        retention = Retention(stopping=stopping)
        retentions.append(retention)
        asker = Asker(table={}, metadata_only=metadata_only)

        def on_alert(name: str, message: str, data: dict[str, str]) -> None:
            asker.alerts.append((name, message, data))

        asker.table = Operations(metadata=metadata, on_alert=on_alert, metadata_only=metadata_only,
                                 retention=retention).table()
        return asker

    yield make
    stopping.set()
    for retention in retentions:
        thread = retention._thread
        if thread is not None:
            thread.join(10)
            assert not thread.is_alive(), "a retention round did not end"


@pytest.fixture
def asker(make_asker: Callable[..., Asker]) -> Asker:
    asker: Asker = make_asker(metadata={"zone": "test-a", "rack": 7})
    return asker
