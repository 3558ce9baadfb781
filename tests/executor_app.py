"""A real DBOS executor (dbos==3.2.0) for end-to-end tests, run as a subprocess.

Environment: RELAY_URL, RELAY_KEY (RELAY_URL empty: no conductor at all; the executor id is then DBOS__VMID, or
DBOS's "local"), APP_NAME, SYS_DB (sqlite path), APP_VERSION, STEP_LOG (file that
each step appends "<pid> <step>" to), STEP_SECONDS, EXECUTOR_METADATA (a JSON object sent in executor_info),
METADATA_ONLY ("1": the conductor client's metadata-only mode), START_WORKFLOW (a workflow id to start once
the file START_WORKFLOW_WHEN exists), and STEPS_FAST_WHEN (a file: once it exists, steps no longer wait
STEP_SECONDS, so a test ends a long workflow when it has seen what it needed to).

For retention tests: FINISHED_WORKFLOWS (comma-separated workflow ids run to completion at launch) and
PENDING_WORKFLOWS (comma-separated workflow ids started at launch that wait, PENDING, for an hour).

For workflow management tests: GATED_WORKFLOWS (ids started at launch, each waiting until the file
GATE_DIR/<id> exists, then finishing), QUEUED_WORKFLOWS (the same, enqueued on the queue ``serial`` of
concurrency 1, so all but the first wait ENQUEUED), THREE_STEPS (ids run to completion at launch: three steps,
each logged to STEP_LOG as "<pid> <workflow id> <step>"), BIG_WORKFLOWS (ids run at launch with an input and an
output of BIG_BYTES characters each) and SCHEDULE (a schedule of that name, hourly, for ``scheduled``).

For autoscaling tests: SCALED_QUEUE ("<name>:<worker_concurrency>", registered so), SCALED_WORKFLOWS (ids enqueued on
it, gated as GATED_WORKFLOWS are, so all but worker_concurrency of them wait ENQUEUED) and PARTITIONED_QUEUE (a queue
of that name with a partition limit).

For the console's tests: HOSTILE_WORKFLOWS (ids run to completion at launch, of a workflow whose name and output are
markup that would run a script if a page took it as markup).
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime
from typing import Any

from dbos import DBOS

CONDUCTED = bool(os.environ["RELAY_URL"])
DBOS(config={
    "name": os.environ["APP_NAME"],
    "system_database_url": f"sqlite:///{os.environ['SYS_DB']}",
    "application_version": os.environ.get("APP_VERSION", "v1"),
    **({
        "conductor_url": os.environ["RELAY_URL"],
        "conductor_key": os.environ["RELAY_KEY"],
        "conductor_executor_metadata": json.loads(os.environ.get("EXECUTOR_METADATA") or "null"),
        "conductor_metadata_only_mode": os.environ.get("METADATA_ONLY") == "1",
    } if CONDUCTED else {}),
})

STEPS = 20


@DBOS.step()
def step(i: int) -> int:
    fast_when = os.environ.get("STEPS_FAST_WHEN")
    if not (fast_when and os.path.exists(fast_when)):
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
def big(payload: str) -> str:
    return payload[::-1]


# Application data a page must show as text, never as markup (tests/e2e/test_console.py): a workflow's name, and
# its output (its input, echoed).
HOSTILE_NAME = '<img src=x onerror="window.__xss = 1">'


@DBOS.workflow(name=HOSTILE_NAME)
def hostile(text: str) -> str:
    return text


@DBOS.workflow()
def scheduled(when: datetime, context: Any) -> None:
    DBOS.logger.info(f"scheduled for {when.isoformat()}")


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
    for gated_id in _ids("GATED_WORKFLOWS"):
        with SetWorkflowID(gated_id):
            DBOS.start_workflow(gated)
    serial = DBOS.register_queue("serial", global_concurrency=1)
    for queued_id in _ids("QUEUED_WORKFLOWS"):
        with SetWorkflowID(queued_id):
            serial.enqueue(gated)
    if os.environ.get("SCALED_QUEUE"):
        scaled_name, worker_concurrency = os.environ["SCALED_QUEUE"].rsplit(":", 1)
        scaled = DBOS.register_queue(scaled_name, worker_concurrency=int(worker_concurrency))
        for scaled_id in _ids("SCALED_WORKFLOWS"):
            with SetWorkflowID(scaled_id):
                scaled.enqueue(gated)
    if os.environ.get("PARTITIONED_QUEUE"):
        DBOS.register_queue(os.environ["PARTITIONED_QUEUE"], partition_concurrency=1)
    for three_id in _ids("THREE_STEPS"):
        with SetWorkflowID(three_id):
            three_steps()
    for big_id in _ids("BIG_WORKFLOWS"):
        with SetWorkflowID(big_id):
            big("x" * int(os.environ.get("BIG_BYTES", "600000")))
    for hostile_id in _ids("HOSTILE_WORKFLOWS"):
        with SetWorkflowID(hostile_id):
            hostile(HOSTILE_NAME)
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
