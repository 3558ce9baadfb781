"""A real DBOS executor (dbos==3.2.0) for end-to-end tests, run as a subprocess.

Environment: RELAY_URL, RELAY_KEY, APP_NAME, SYS_DB (sqlite path), APP_VERSION, STEP_LOG (file that
each step appends "<pid> <step>" to), STEP_SECONDS, EXECUTOR_METADATA (a JSON object sent in executor_info), and
START_WORKFLOW (a workflow id to start once the file START_WORKFLOW_WHEN exists).

For retention tests: FINISHED_WORKFLOWS (comma-separated workflow ids run to completion at launch) and
PENDING_WORKFLOWS (comma-separated workflow ids started at launch that wait, PENDING, for an hour).
"""

from __future__ import annotations

import json
import os
import time

from dbos import DBOS

DBOS(config={
    "name": os.environ["APP_NAME"],
    "system_database_url": f"sqlite:///{os.environ['SYS_DB']}",
    "application_version": os.environ.get("APP_VERSION", "v1"),
    "conductor_url": os.environ["RELAY_URL"],
    "conductor_key": os.environ["RELAY_KEY"],
    "conductor_executor_metadata": json.loads(os.environ.get("EXECUTOR_METADATA") or "null"),
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
    return "done"


@DBOS.workflow()
def waits() -> None:
    DBOS.sleep(3600)


def _ids(name: str) -> list[str]:
    return [i for i in os.environ.get(name, "").split(",") if i]


if __name__ == "__main__":
    DBOS.launch()
    from dbos import SetWorkflowID

    for finished_id in _ids("FINISHED_WORKFLOWS"):
        with SetWorkflowID(finished_id):
            finishes()
    for pending_id in _ids("PENDING_WORKFLOWS"):
        with SetWorkflowID(pending_id):
            DBOS.start_workflow(waits)
    workflow_id = os.environ.get("START_WORKFLOW")
    if workflow_id:
        while not os.path.exists(os.environ["START_WORKFLOW_WHEN"]):
            time.sleep(0.05)
        with SetWorkflowID(workflow_id):
            DBOS.start_workflow(twenty_steps)
    while True:
        time.sleep(1)
