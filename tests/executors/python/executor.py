"""A real DBOS executor on the current Python SDK (dbos 3.4.0), connected through Relay's own client
(``relay_dbos``, clients/python), for the end-to-end tests: run by its own venv's interpreter (`make test` builds
tests/executors/python/.venv).

The environment is the other executors' (``tests/sdk.py``): RELAY_URL, RELAY_KEY, APP_NAME, APP_VERSION, SYS_DB (a
SQLite path) or SYS_DB_URL (PostgreSQL), STEP_LOG, STEP_SECONDS, EXECUTOR_METADATA, START_WORKFLOW /
START_WORKFLOW_WHEN, FINISHED_WORKFLOWS, PENDING_WORKFLOWS, GATED_WORKFLOWS / GATE_DIR, QUEUED_WORKFLOWS,
THREE_STEPS, SCHEDULE; and RELAY_PING_SECS / RELAY_PONG_TIMEOUT_SECS, the client's keepalive (20 s and 15 s
unless set), EXECUTOR_ID (a fixed id; a new UUID per process unless set).
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timedelta
from typing import Any

import relay_dbos
from dbos import DBOS, SetWorkflowID

database = (f"sqlite:///{os.environ['SYS_DB']}" if os.environ.get("SYS_DB")
            else os.environ["SYS_DB_URL"].replace("postgresql://", "postgresql+psycopg://", 1))
DBOS(config={
    "name": os.environ["APP_NAME"],
    "system_database_url": database,
    "application_version": os.environ.get("APP_VERSION", "v1"),
    "executor_id": relay_dbos.executor_id(os.environ.get("EXECUTOR_ID") or None),
})

STEPS = 20


@DBOS.step()
def step(i: int) -> int:
    time.sleep(float(os.environ.get("STEP_SECONDS", "0.3")))
    with open(os.environ["STEP_LOG"], "a") as log:
        log.write(f"{os.getpid()} {i}\n")
    return i


@DBOS.workflow()
def twenty_steps() -> int:
    return sum(step(i) for i in range(STEPS))


@DBOS.workflow()
def finishes() -> str:
    DBOS.set_event("answer", 42)
    return "done"


@DBOS.workflow()
def waits() -> None:
    DBOS.sleep(3600)


@DBOS.step()
def gate_open(workflow_id: str) -> bool:
    return os.path.exists(os.path.join(os.environ["GATE_DIR"], workflow_id))


@DBOS.workflow()
def gated() -> str:
    """Polls its gate file (each look a checkpointed step): cancelled meanwhile it stays so; resumed, it goes on."""
    workflow_id = DBOS.workflow_id
    assert workflow_id is not None
    while not gate_open(workflow_id):
        DBOS.sleep(0.2)
    return "opened"


@DBOS.step()
def logged_step(i: int) -> int:
    with open(os.environ["STEP_LOG"], "a") as log:
        log.write(f"{os.getpid()} {DBOS.workflow_id} {i}\n")
    return i


@DBOS.workflow()
def three_steps() -> int:
    return sum(logged_step(i) for i in range(3))


@DBOS.workflow()
def scheduled(when: datetime, context: Any) -> None:
    DBOS.logger.info(f"scheduled for {when.isoformat()}")


def _ids(name: str) -> list[str]:
    return [i for i in os.environ.get(name, "").split(",") if i]


def _seconds(name: str, default: float) -> timedelta:
    return timedelta(seconds=float(os.environ.get(name) or default))


if __name__ == "__main__":
    DBOS.launch()
    relay = relay_dbos.connect(os.environ["RELAY_URL"], os.environ["RELAY_KEY"],
                               executor_metadata=json.loads(os.environ.get("EXECUTOR_METADATA") or "null"),
                               ping_interval=_seconds("RELAY_PING_SECS", 20),
                               pong_timeout=_seconds("RELAY_PONG_TIMEOUT_SECS", 15))
    for finished_id in _ids("FINISHED_WORKFLOWS"):
        with SetWorkflowID(finished_id):
            finishes()
    for pending_id in _ids("PENDING_WORKFLOWS"):
        with SetWorkflowID(pending_id):
            DBOS.start_workflow(waits)
    for gated_id in _ids("GATED_WORKFLOWS"):
        with SetWorkflowID(gated_id):
            DBOS.start_workflow(gated)
    serial = DBOS.register_queue("serial", global_concurrency=1)
    for queued_id in _ids("QUEUED_WORKFLOWS"):
        with SetWorkflowID(queued_id):
            serial.enqueue(gated)
    for three_id in _ids("THREE_STEPS"):
        with SetWorkflowID(three_id):
            three_steps()
    if os.environ.get("SCHEDULE"):
        DBOS.create_schedule(schedule_name=os.environ["SCHEDULE"], workflow_fn=scheduled, schedule="0 0 * * * *")
    workflow_id = os.environ.get("START_WORKFLOW")
    if workflow_id:
        while not os.path.exists(os.environ["START_WORKFLOW_WHEN"]):
            time.sleep(0.05)
        with SetWorkflowID(workflow_id):
            DBOS.start_workflow(twenty_steps)
    while True:
        time.sleep(1)
