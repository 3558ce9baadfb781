"""The DBOS application the client's tests run, in the test process (``conftest.dbos_env``) and in the short-lived
"dead executor" processes of the recovery tests (``python -m tests.dbos_app``).

DBOS requires every workflow and step to be registered before ``DBOS.launch()``, so they are all declared here, at
import, with explicit names: the test process and its children register the same ones, and a workflow a child
started can be recovered and run by the test process.
"""

from __future__ import annotations

import contextlib
import sys
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from dbos import DBOS, DBOSConfig

APP_NAME = "relay-client-tests"
VERSION = "v1"
WORK_QUEUE = "work"  # listened to by the test process
PARKED_QUEUE = "parked"  # listened to by no process: what is enqueued on it stays ENQUEUED
WAIT_SECONDS = 20  # the longest a waiter waits for its message (every test sends it long before)


def config(db_url: str, executor_id: str) -> DBOSConfig:
    return {"name": APP_NAME, "system_database_url": db_url, "application_version": VERSION,
            "executor_id": executor_id, "notification_listener_polling_interval_sec": 0.02}


def launch(db_url: str, executor_id: str) -> None:
    DBOS(config=config(db_url, executor_id))
    DBOS.listen_queues([WORK_QUEUE])
    DBOS.launch()


@DBOS.step(name="token")
def token() -> str:
    """A value no other execution of the step returns: a step that was run again is told from a copied one."""
    return str(uuid.uuid4())


@DBOS.step(name="broken")
def broken() -> None:
    raise ValueError(f"broken {uuid.uuid4()}")


@DBOS.workflow(name="greet")
def greet(name: str) -> str:
    return f"hello {name} {token()}"


@DBOS.workflow(name="caught_failure")
def caught_failure() -> str:
    """Step 1 succeeds, step 2 fails (caught), step 3 succeeds: the last failed step is not the last step."""
    first = token()
    with contextlib.suppress(ValueError):
        broken()
    return first + token()


@DBOS.workflow(name="failing")
def failing() -> None:
    """Step 1 succeeds, step 2 fails the workflow (ERROR)."""
    token()
    broken()


@DBOS.workflow(name="waiter")
def waiter(topic: str) -> object:
    """PENDING until a message on ``topic`` is sent to it."""
    return DBOS.recv(topic, timeout_seconds=WAIT_SECONDS)


@DBOS.workflow(name="with_event")
def with_event(key: str, value: str) -> None:
    DBOS.set_event(key, value)


@DBOS.workflow(name="tick")
def tick(scheduled_at: datetime, context: Any) -> None:
    """The workflow of the tests' schedules."""
    DBOS.set_event("scheduled_at", scheduled_at.isoformat())


def main() -> None:
    """A dead executor in the making: ``python -m tests.dbos_app DB_URL EXECUTOR_ID COUNT IDS_FILE`` launches DBOS
    with that executor id, starts COUNT waiters (PENDING, owned by that id), writes their ids to IDS_FILE (one a
    line; the file appears whole) and waits to be killed."""
    db_url, executor_id, count, ids_file = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
    launch(db_url, executor_id)
    ids = [DBOS.start_workflow(waiter, "never").workflow_id for _ in range(count)]
    partial = ids_file.with_suffix(".partial")
    partial.write_text("".join(f"{i}\n" for i in ids))
    partial.rename(ids_file)
    sys.stdin.read()  # until SIGKILL (or the test's end closes stdin)


if __name__ == "__main__":
    main()
