"""Requests answered by ``protocol.handle`` with the real operations table, on a real DBOS 3.4 (``conftest``)."""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest
from dbos import DBOS, SetWorkflowID, WorkflowStatus

from relay_dbos.operations import Operations
from relay_dbos.protocol import UNKNOWN_TYPE
from relay_dbos.retention import Retention
from tests import dbos_app
from tests.conftest import DbosEnv
from tests.support import CLIENT_DIR, Asker, wait_until

ALL_TYPES = {
    "executor_info", "recovery", "exist_pending_workflows", "retention", "list_workflows", "list_queued_workflows",
    "get_workflow", "list_steps", "cancel", "resume", "delete", "fork_workflow", "fork_from_failure",
    "rewind_workflow", "get_metrics", "alert", "export_workflow", "import_workflow", "list_schedules",
    "get_schedule", "pause_schedule", "resume_schedule", "backfill_schedule", "trigger_schedule",
    "get_workflow_events", "get_workflow_notifications", "get_workflow_streams", "get_workflow_aggregates",
    "get_step_aggregates", "list_application_versions", "set_latest_application_version", "list_queues",
    "get_queue",
}
UNSUPPORTED = ["get_metrics", "export_workflow", "import_workflow", "get_workflow_aggregates", "get_step_aggregates",
               "get_workflow_notifications", "get_workflow_streams"]
WORKFLOW_FIELDS = {
    "WorkflowUUID", "Status", "WorkflowName", "WorkflowClassName", "WorkflowConfigName", "AuthenticatedUser",
    "AssumedRole", "AuthenticatedRoles", "Input", "Output", "Error", "CreatedAt", "UpdatedAt", "QueueName",
    "ApplicationVersion", "ExecutorID", "WorkflowTimeoutMS", "WorkflowDeadlineEpochMS", "DeduplicationID",
    "Priority", "QueuePartitionKey", "ForkedFrom", "WasForkedFrom", "ParentWorkflowID", "DequeuedAt",
    "DelayUntilEpochMS", "CompletedAt", "Attributes", "ScheduleName", "ApplicationName",
}


def _status(workflow_id: str) -> WorkflowStatus:
    found = DBOS.get_workflow_status(workflow_id)
    assert found is not None, f"workflow {workflow_id} does not exist"
    return found


def _finished(workflow_id: str, status: str = "SUCCESS", timeout: float = 15.0) -> WorkflowStatus:
    """The workflow once it has ``status`` (polled: a resumed, forked or recovered one runs from a queue)."""
    return wait_until(lambda: (s if (s := DBOS.get_workflow_status(workflow_id)) and s.status == status else None),
                      timeout=timeout, what=f"workflow {workflow_id} reaching {status}")


def _run(workflow: Callable[..., Any], *args: Any) -> str:
    """Runs a workflow to its end under a new id; the id."""
    workflow_id = f"wf-{uuid.uuid4()}"
    with SetWorkflowID(workflow_id), contextlib.suppress(ValueError):  # ``failing`` fails: its status says so
        workflow(*args)
    return workflow_id


def _steps(workflow_id: str) -> list[dict[str, Any]]:
    return [dict(step) for step in DBOS.list_workflow_steps(workflow_id)]


# -- every request type ------------------------------------------------------------------------------------------------


def test_the_table_answers_the_33_request_types(asker: Asker) -> None:
    assert set(asker.table) == ALL_TYPES
    assert len(asker.table) == 33


@pytest.mark.parametrize("kind", sorted(ALL_TYPES))
def test_every_type_answers_with_its_type_request_id_and_error_message(asker: Asker, kind: str) -> None:
    reply = asker.ask(kind)  # no field but the two: answered, whether it can be acted on or not
    assert "error_message" in reply
    if reply["error_message"] is not None:
        assert isinstance(reply["error_message"], str) and reply["error_message"]
        for name, value in asker.table[kind].failed.items():  # a failed request's reply has the type's fields
            assert reply[name] == value


# -- the executor ------------------------------------------------------------------------------------------------------


def test_executor_info(asker: Asker, dbos_env: DbosEnv) -> None:
    reply = asker.ok("executor_info")
    assert reply["executor_id"] == DBOS.executor_id == dbos_env.executor_id
    assert reply["application_version"] == dbos_app.VERSION
    assert reply["hostname"] == socket.gethostname()
    assert reply["language"] == "python"
    assert reply["dbos_version"] == "3.4.0" == version("dbos")
    assert reply["executor_metadata"] == {"zone": "test-a", "rack": 7}


def test_executor_info_without_metadata(make_asker: Callable[..., Asker]) -> None:
    assert make_asker().ok("executor_info")["executor_metadata"] is None


# -- workflows ---------------------------------------------------------------------------------------------------------


def test_list_workflows_replies_in_pascal_case_with_epoch_ms_digits(asker: Asker, dbos_env: DbosEnv) -> None:
    workflow_id = _run(dbos_app.greet, "world")
    reply = asker.ok("list_workflows", body={"workflow_uuids": [workflow_id]})
    [listed] = reply["output"]
    assert set(listed) == WORKFLOW_FIELDS
    status = _status(workflow_id)
    assert listed["WorkflowUUID"] == workflow_id
    assert listed["Status"] == "SUCCESS"
    assert listed["WorkflowName"] == "greet"
    assert listed["ExecutorID"] == dbos_env.executor_id
    assert listed["ApplicationVersion"] == dbos_app.VERSION
    assert listed["ApplicationName"] == dbos_app.APP_NAME
    assert "world" in listed["Input"]
    assert listed["Output"].startswith("hello world ")
    assert listed["Error"] is None
    for name in ("CreatedAt", "UpdatedAt", "CompletedAt"):
        assert isinstance(listed[name], str) and listed[name].isdigit(), (name, listed[name])
    assert int(listed["CreatedAt"]) == status.created_at
    assert int(listed["CompletedAt"]) == status.completed_at
    assert listed["WasForkedFrom"] is False
    for name, value in listed.items():  # the protocol's fields are text (or null), the one flag aside
        assert value is None or isinstance(value, str) or name == "WasForkedFrom", (name, value)


def test_list_workflows_filters_sorts_and_pages(asker: Asker) -> None:
    prefix = f"page-{uuid.uuid4()}-"
    ids = []
    for n in range(3):
        with SetWorkflowID(f"{prefix}{n}"):
            dbos_app.greet(str(n))
        ids.append(f"{prefix}{n}")
    listed = asker.ok("list_workflows", body={"workflow_id_prefix": prefix})["output"]
    assert [w["WorkflowUUID"] for w in listed] == ids
    newest = asker.ok("list_workflows", body={"workflow_id_prefix": prefix, "sort_desc": True, "limit": 2,
                                              "load_input": False, "load_output": False})["output"]
    assert [w["WorkflowUUID"] for w in newest] == [ids[2], ids[1]]
    assert all(w["Input"] is None and w["Output"] is None for w in newest)
    paged = asker.ok("list_workflows", body={"workflow_id_prefix": prefix, "offset": 1, "limit": 1})["output"]
    assert [w["WorkflowUUID"] for w in paged] == [ids[1]]
    assert asker.ok("list_workflows", body={"workflow_id_prefix": prefix, "status": "ERROR"})["output"] == []


def test_get_workflow(asker: Asker) -> None:
    workflow_id = _run(dbos_app.failing)
    reply = asker.ok("get_workflow", workflow_id=workflow_id)
    assert reply["output"]["WorkflowUUID"] == workflow_id
    assert reply["output"]["Status"] == "ERROR"
    assert "broken" in reply["output"]["Error"]
    assert reply["output"]["CreatedAt"] == str(_status(workflow_id).created_at)
    assert asker.ok("get_workflow", workflow_id=f"missing-{uuid.uuid4()}")["output"] is None


def test_list_queued_workflows_and_queues(asker: Asker) -> None:
    parked = DBOS.retrieve_queue(dbos_app.PARKED_QUEUE)
    assert parked is not None
    workflow_id = f"parked-{uuid.uuid4()}"
    with SetWorkflowID(workflow_id):
        parked.enqueue(dbos_app.greet, "later")
    try:
        listed = asker.ok("list_queued_workflows", body={"queue_name": dbos_app.PARKED_QUEUE})["output"]
        assert workflow_id in [w["WorkflowUUID"] for w in listed]
        assert {w["Status"] for w in listed} == {"ENQUEUED"}
        queues = {q["name"]: q for q in asker.ok("list_queues")["output"]}
        assert {dbos_app.WORK_QUEUE, dbos_app.PARKED_QUEUE} <= set(queues)
        assert queues[dbos_app.WORK_QUEUE]["worker_concurrency"] == 4
        work = asker.ok("get_queue", name=dbos_app.WORK_QUEUE)["output"]
        assert work == queues[dbos_app.WORK_QUEUE]
        assert asker.ok("get_queue", name=f"missing-{uuid.uuid4()}")["output"] is None
    finally:
        DBOS.cancel_workflows([workflow_id])


def test_list_steps(asker: Asker) -> None:
    workflow_id = _run(dbos_app.caught_failure)
    steps = asker.ok("list_steps", workflow_id=workflow_id)["output"]
    assert [(s["function_id"], s["function_name"]) for s in steps] == [(1, "token"), (2, "broken"), (3, "token")]
    assert steps[0]["error"] is None and steps[1]["output"] is None
    assert "broken" in steps[1]["error"]
    assert str(uuid.UUID(steps[0]["output"])) == steps[0]["output"]
    for step in steps:
        assert step["started_at_epoch_ms"].isdigit() and step["completed_at_epoch_ms"].isdigit()
    assert [s["function_id"] for s in asker.ok("list_steps", workflow_id=workflow_id, limit=1, offset=1)["output"]] \
        == [2]
    assert all(s["output"] is None for s in asker.ok("list_steps", workflow_id=workflow_id,
                                                     load_output=False)["output"])


def test_get_workflow_events(asker: Asker) -> None:
    workflow_id = _run(dbos_app.with_event, "colour", "blue")
    assert asker.ok("get_workflow_events", workflow_id=workflow_id)["events"] == [{"key": "colour", "value": "blue"}]


def test_cancel_then_resume(asker: Asker, dbos_env: DbosEnv) -> None:
    first, second = dbos_env.start_waiter(), dbos_env.start_waiter()
    assert _status(first).status == "PENDING"
    assert asker.ok("cancel", workflow_id=first)["success"] is True
    assert _status(first).status == "CANCELLED"
    assert _status(second).status == "PENDING"
    assert asker.ok("cancel", workflow_ids=[second])["success"] is True
    assert _status(second).status == "CANCELLED"
    for workflow_id in (first, second):
        dbos_env.release(workflow_id)  # the message the resumed execution will find
    assert asker.ok("resume", workflow_ids=[first, second])["success"] is True
    assert _finished(first).output == "released"
    assert _finished(second).output == "released"


def test_delete(asker: Asker) -> None:
    kept, first, second = _run(dbos_app.greet, "a"), _run(dbos_app.greet, "b"), _run(dbos_app.greet, "c")
    assert asker.ok("delete", workflow_id=first)["success"] is True
    assert DBOS.get_workflow_status(first) is None
    assert asker.ok("delete", workflow_ids=[second])["success"] is True
    assert DBOS.get_workflow_status(second) is None
    assert [w.workflow_id for w in DBOS.list_workflows(workflow_ids=[first, second, kept])] == [kept]
    assert asker.ok("list_steps", workflow_id=first)["output"] == []


def _copied_steps(original: str | list[dict[str, Any]], fork: str) -> list[int]:
    """The steps of ``fork`` copied from ``original`` (a workflow, or its steps as they were) rather than run again:
    those with the same output and error (each execution of ``token`` and ``broken`` yields a new uuid)."""
    steps = _steps(original) if isinstance(original, str) else original
    before = {s["function_id"]: (str(s["output"]), str(s["error"])) for s in steps}
    return [s["function_id"] for s in _steps(fork) if before.get(s["function_id"]) == (str(s["output"]),
                                                                                         str(s["error"]))]


def test_fork_workflow(asker: Asker) -> None:
    original = _run(dbos_app.caught_failure)
    new_id = f"fork-{uuid.uuid4()}"
    reply = asker.ok("fork_workflow", body={"workflow_id": original, "start_step": 2, "new_workflow_id": new_id})
    assert reply["new_workflow_id"] == new_id
    forked = _finished(new_id)
    assert forked.forked_from == original
    assert _copied_steps(original, new_id) == [1]
    assert _status(original).was_forked_from is True
    listed = asker.ok("list_workflows", body={"forked_from": original})["output"]
    assert [w["WorkflowUUID"] for w in listed] == [new_id]
    # Without a new id, one is drawn.
    drawn = asker.ok("fork_workflow", body={"workflow_id": original, "start_step": 1})["new_workflow_id"]
    assert str(uuid.UUID(drawn)) == drawn
    _finished(drawn)
    assert _copied_steps(original, drawn) == []


@pytest.mark.parametrize(("mode", "start"), [({"from_last_failure": True}, 2), ({"from_last_step": True}, 3),
                                             ({"from_step": 1}, 1), ({"from_step_name": "token"}, 3)])
def test_fork_from_failure(asker: Asker, mode: dict[str, Any], start: int) -> None:
    """``caught_failure``'s steps: 1 succeeds, 2 fails, 3 succeeds; a fork from step N copies the steps before N."""
    original = _run(dbos_app.caught_failure)
    reply = asker.ok("fork_from_failure", body={"workflow_ids": [original], **mode})
    [fork] = reply["forked_workflow_ids"]
    assert _finished(fork).forked_from == original
    assert _copied_steps(original, fork) == list(range(1, start))


def test_fork_from_failure_of_a_failed_workflow(asker: Asker) -> None:
    first, second = _run(dbos_app.failing), _run(dbos_app.failing)
    assert _status(first).status == "ERROR"
    forks = asker.ok("fork_from_failure", body={"workflow_ids": [first, second], "from_last_failure": True})
    assert len(forks["forked_workflow_ids"]) == 2
    for original, fork in zip([first, second], forks["forked_workflow_ids"], strict=True):
        assert _finished(fork, "ERROR").forked_from == original  # step 2 fails again
        assert _copied_steps(original, fork) == [1]


@pytest.mark.parametrize("modes", [{}, {"from_last_failure": True, "from_last_step": True},
                                   {"from_last_failure": False}])
def test_fork_from_failure_needs_exactly_one_mode(asker: Asker, modes: dict[str, Any]) -> None:
    reply = asker.ask("fork_from_failure", body={"workflow_ids": ["x"], **modes})
    assert "exactly one of" in reply["error_message"]
    assert reply["forked_workflow_ids"] is None


def test_a_failed_operation_replies_with_its_traceback(asker: Asker) -> None:
    missing = f"missing-{uuid.uuid4()}"
    reply = asker.ask("fork_workflow", body={"workflow_id": missing, "start_step": 1})
    assert reply["new_workflow_id"] is None
    assert reply["error_message"].startswith("Exception encountered when forking a workflow: Traceback")
    assert missing in reply["error_message"]


# -- recovery ----------------------------------------------------------------------------------------------------------


class DeadExecutors:
    """Processes of the same application (``python -m tests.dbos_app``) that each start waiters under an executor id
    of their own and are then SIGKILLed: their workflows stay PENDING, owned by a dead executor."""

    def __init__(self, env: DbosEnv, directory: Path) -> None:
        self.env, self.directory = env, directory
        self.children: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, executor_id: str, count: int) -> Path:
        ids_file, log = self.directory / f"{executor_id}.ids", self.directory / f"{executor_id}.log"
        with log.open("wb") as out:
            child = subprocess.Popen([sys.executable, "-m", "tests.dbos_app", self.env.url, executor_id, str(count),
                                      str(ids_file)], cwd=CLIENT_DIR, stdin=subprocess.PIPE, stdout=out, stderr=out)
        self.children.append((child, log))
        return ids_file

    def workflows(self, ids_file: Path) -> list[str]:
        """The child's workflow ids, once it has started them (it is then killed)."""
        child, log = next((c, log) for c, log in self.children if log.stem == ids_file.stem)

        def ready() -> list[str] | None:
            if child.poll() is not None:
                raise AssertionError(f"the dead executor exited early: {log.read_text()[-2000:]}")
            return ids_file.read_text().split() if ids_file.exists() else None

        ids = wait_until(ready, timeout=30, what=f"{ids_file.stem} starting its workflows")
        self.kill(child)
        return ids

    @staticmethod
    def kill(child: subprocess.Popen[bytes]) -> None:
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
        child.wait(10)
        if child.stdin is not None:
            child.stdin.close()

    def close(self) -> None:
        for child, _ in self.children:
            self.kill(child)


@pytest.fixture
def dead_executors(dbos_env: DbosEnv, tmp_path: Path) -> Iterator[DeadExecutors]:
    dead = DeadExecutors(dbos_env, tmp_path)
    yield dead
    dead.close()


def test_recovery_re_enqueues_exactly_the_dead_executors_pending_workflows(
        asker: Asker, dbos_env: DbosEnv, dead_executors: DeadExecutors) -> None:
    dead_a, dead_b = f"dead-a-{uuid.uuid4()}", f"dead-b-{uuid.uuid4()}"
    files = dead_executors.start(dead_a, 2), dead_executors.start(dead_b, 1)
    of_a, of_b = dead_executors.workflows(files[0]), dead_executors.workflows(files[1])
    own = dbos_env.start_waiter()
    for workflow_id, owner in [*((w, dead_a) for w in of_a), *((w, dead_b) for w in of_b)]:
        status = _status(workflow_id)
        assert (status.status, status.executor_id, status.app_version) == ("PENDING", owner, dbos_app.VERSION)
    assert asker.ok("exist_pending_workflows", executor_id=dead_a, application_version="v1")["exist"] is True

    assert asker.ok("recovery", executor_ids=[dead_a])["success"] is True

    assert asker.ok("exist_pending_workflows", executor_id=dead_a, application_version="v1")["exist"] is False
    for workflow_id in of_a:  # back on a queue, then run here: the message lets them finish
        assert _status(workflow_id).status in ("ENQUEUED", "PENDING")
        DBOS.send(workflow_id, "recovered", "never")
    for workflow_id in of_a:
        finished = _finished(workflow_id)
        assert (finished.output, finished.executor_id) == ("recovered", dbos_env.executor_id)
    # Another dead executor's workflows are not touched, nor this executor's (a re-enqueued workflow would be on
    # DBOS's internal queue now, and dequeued again: PENDING, but with a queue).
    for workflow_id, owner in [*((w, dead_b) for w in of_b), (own, dbos_env.executor_id)]:
        status = _status(workflow_id)
        assert (status.status, status.executor_id, status.queue_name) == ("PENDING", owner, None)
    assert asker.ok("exist_pending_workflows", executor_id=dead_b, application_version="v1")["exist"] is True

    # A second request for the same id finds nothing and still succeeds.
    assert asker.ok("recovery", executor_ids=[dead_a])["success"] is True
    assert {_status(w).status for w in of_a} == {"SUCCESS"}

    # Both ids in one request: the one recovered already finds nothing, the other's workflows come back.
    assert asker.ok("recovery", executor_ids=[dead_a, dead_b])["success"] is True
    for workflow_id in of_b:
        DBOS.send(workflow_id, "recovered", "never")
        assert _finished(workflow_id).executor_id == dbos_env.executor_id
    dbos_env.release(own)
    assert _finished(own).output == "released"


def test_exist_pending_workflows(asker: Asker, dbos_env: DbosEnv) -> None:
    pending = dbos_env.start_waiter()
    try:
        mine = {"executor_id": dbos_env.executor_id, "application_version": dbos_app.VERSION}
        assert asker.ok("exist_pending_workflows", **mine)["exist"] is True
        assert asker.ok("exist_pending_workflows", **{**mine, "executor_id": "another-id"})["exist"] is False
        assert asker.ok("exist_pending_workflows", **{**mine, "application_version": "v0"})["exist"] is False
    finally:
        dbos_env.release(pending)
    _finished(pending)


@pytest.mark.parametrize("ids", [[5], "dead", [None]])
def test_recovery_needs_a_list_of_ids(asker: Asker, ids: Any) -> None:
    reply = asker.ask("recovery", executor_ids=ids)
    assert reply["success"] is False
    assert "executor_ids" in reply["error_message"]


# -- versions, schedules -----------------------------------------------------------------------------------------------


def test_application_versions(asker: Asker) -> None:
    versions = asker.ok("list_application_versions")["output"]
    assert dbos_app.VERSION in [v["version_name"] for v in versions]
    assert set(versions[0]) == {"version_id", "version_name", "version_timestamp", "created_at"}
    assert asker.ok("set_latest_application_version", version_name=dbos_app.VERSION)["success"] is True
    assert DBOS.list_application_versions()[0]["version_name"] == dbos_app.VERSION


def test_schedules_when_there_are_none(asker: Asker) -> None:
    assert asker.ok("list_schedules", body={"schedule_name_prefix": "none-such-"})["output"] == []
    assert asker.ok("get_schedule", schedule_name="none-such")["output"] is None


@pytest.fixture
def schedule() -> Iterator[str]:
    name = f"nightly-{uuid.uuid4()}"
    DBOS.create_schedule(schedule_name=name, workflow_fn=dbos_app.tick, schedule="0 0 * * *",
                         context={"region": "eu"})
    yield name
    DBOS.delete_schedule(name)


def test_schedules(asker: Asker, make_asker: Callable[..., Asker], schedule: str) -> None:
    [listed] = asker.ok("list_schedules", body={"schedule_name_prefix": schedule})["output"]
    assert listed["schedule_name"] == schedule
    assert (listed["workflow_name"], listed["schedule"], listed["status"]) == ("tick", "0 0 * * *", "ACTIVE")
    assert "eu" in listed["context"]
    assert asker.ok("get_schedule", schedule_name=schedule)["output"] == listed
    assert asker.ok("get_schedule", schedule_name=schedule, load_context=False)["output"]["context"] is None
    assert make_asker(metadata_only=True).ok("get_schedule", schedule_name=schedule)["output"]["context"] is None

    assert asker.ok("pause_schedule", schedule_name=schedule)["success"] is True
    assert asker.ok("get_schedule", schedule_name=schedule)["output"]["status"] == "PAUSED"
    assert asker.ok("list_schedules", body={"schedule_name_prefix": schedule, "status": "ACTIVE"})["output"] == []
    assert asker.ok("resume_schedule", schedule_name=schedule)["success"] is True
    assert asker.ok("get_schedule", schedule_name=schedule)["output"]["status"] == "ACTIVE"

    triggered = asker.ok("trigger_schedule", schedule_name=schedule)["workflow_id"]
    assert _finished(triggered).name == "tick"
    backfilled = asker.ok("backfill_schedule", schedule_name=schedule, start="2026-01-01T00:00:00+00:00",
                          end="2026-01-03T12:00:00+00:00")["workflow_ids"]
    assert len(backfilled) == 2  # the midnights of the 2nd and the 3rd (the window's ends are excluded)
    assert sorted(DBOS.get_event(w, "scheduled_at", timeout_seconds=15) for w in backfilled) == [
        "2026-01-02T00:00:00+00:00", "2026-01-03T00:00:00+00:00"]
    assert asker.ok("list_schedules", body={"workflow_name": "tick", "schedule_name_prefix": schedule})["output"] \
        == [listed]


def test_triggering_a_missing_schedule_fails(asker: Asker) -> None:
    reply = asker.ask("trigger_schedule", schedule_name="none-such")
    assert reply["workflow_id"] is None
    assert reply["error_message"].startswith("Exception encountered when triggering a schedule: Traceback")


def test_rewind_workflow(asker: Asker) -> None:
    workflow_id = _run(dbos_app.caught_failure)
    before = _steps(workflow_id)
    assert asker.ok("rewind_workflow", body={"workflow_id": workflow_id, "start_step": 3})["success"] is True

    def run_again() -> list[dict[str, Any]] | None:
        steps = _steps(workflow_id)
        done = _status(workflow_id).status == "SUCCESS" and len(steps) == 3
        return steps if done and steps[2]["output"] != before[2]["output"] else None

    wait_until(run_again, timeout=15, what="the rewound workflow running again")
    assert _copied_steps(before, workflow_id) == [1, 2]  # steps 1 and 2 kept, step 3 run again


# -- what dbos 3.4 cannot do -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", UNSUPPORTED)
def test_unsupported_operations_say_so(asker: Asker, kind: str) -> None:
    reply = asker.ask(kind, workflow_id="w", body={}, serialized_workflow="x")
    assert reply["unsupported"] is True
    assert kind in reply["error_message"]
    assert "3.4.0" in reply["error_message"]
    for name, value in asker.table[kind].failed.items():
        assert reply[name] == value


# -- alerts, unknown and malformed requests ----------------------------------------------------------------------------


def test_alert_calls_the_handler(asker: Asker) -> None:
    assert asker.ok("alert", name="disk", message="full", metadata={"host": "a"})["success"] is True
    assert asker.ok("alert", name="cpu", message="hot")["success"] is True
    assert asker.alerts == [("disk", "full", {"host": "a"}), ("cpu", "hot", {})]
    reply = asker.ask("alert", name="disk")
    assert reply["success"] is False and "'message' is required" in reply["error_message"]
    assert len(asker.alerts) == 2


def test_alert_without_a_handler_is_logged(dbos_env: DbosEnv, caplog: pytest.LogCaptureFixture) -> None:
    table = Operations(metadata=None, on_alert=None, metadata_only=False,
                       retention=Retention(stopping=threading.Event())).table()
    with caplog.at_level(logging.INFO, logger="relay_dbos"):
        assert Asker(table).ok("alert", name="disk", message="full")["success"] is True
    assert "Alert: disk | Message: full" in caplog.text


def test_an_unknown_type(asker: Asker) -> None:
    reply = asker.ask("no_such_type", workflow_id="w")
    assert reply == {"type": "no_such_type", "request_id": reply["request_id"], "error_message": UNKNOWN_TYPE}
    assert UNKNOWN_TYPE == "Unknown message type"


@pytest.mark.parametrize(("frame", "kind", "request_id", "error"), [
    ("not json", "", "", "not JSON"),
    (b"\xff\xfe", "", "", "not JSON"),
    ("[" * 100_000, "", "", "not JSON"),
    ('[{"type": "executor_info", "request_id": "r"}]', "", "", "not a JSON object"),
    ('"executor_info"', "", "", "not a JSON object"),
    ("null", "", "", "not a JSON object"),
    ('{"type": "get_workflow", "workflow_id": "w"}', "get_workflow", "", "'request_id' must be"),
    ('{"request_id": "r1"}', "", "r1", "'type' and 'request_id' must be strings"),
    ('{"type": 5, "request_id": "r1"}', "", "r1", "must be strings"),
    ('{"type": "get_workflow", "request_id": 7}', "get_workflow", "", "must be strings"),
])
def test_malformed_frames_are_answered_not_raised(asker: Asker, frame: str | bytes, kind: str, request_id: str,
                                                   error: str) -> None:
    reply = asker.raw(frame)
    assert (reply["type"], reply["request_id"]) == (kind, request_id)
    assert reply["error_message"].startswith("malformed message")
    assert error in reply["error_message"]


@pytest.mark.parametrize(("kind", "fields", "error"), [
    ("get_workflow", {}, "field 'workflow_id' is required"),
    ("get_workflow", {"workflow_id": None}, "field 'workflow_id' is required"),
    ("get_workflow", {"workflow_id": 5}, "field 'workflow_id' must be a string, not int"),
    ("get_workflow", {"workflow_id": ["w"]}, "field 'workflow_id' must be a string, not list"),
    ("list_workflows", {}, "field 'body' must be an object"),
    ("list_workflows", {"body": []}, "field 'body' must be an object"),
    ("list_workflows", {"body": {"limit": True}}, "field 'limit' must be an integer, not a boolean"),
    ("list_workflows", {"body": {"limit": "10"}}, "field 'limit' must be an integer, not str"),
    ("list_workflows", {"body": {"limit": 1.5}}, "field 'limit' must be an integer, not float"),
    ("list_workflows", {"body": {"status": 3}}, "field 'status' must be a string or a list, not int"),
    ("list_workflows", {"body": {"sort_desc": "yes"}}, "field 'sort_desc' must be a boolean, not str"),
    ("cancel", {"workflow_ids": ["a", 2]}, "field 'workflow_ids' must be a list of strings"),
    ("cancel", {"workflow_ids": "a"}, "field 'workflow_ids' must be a list, not str"),
    ("cancel", {}, "field 'workflow_id' is required"),
    ("fork_workflow", {"body": {"workflow_id": "w"}}, "field 'start_step' is required"),
    ("fork_workflow", {"body": {"workflow_id": "w", "start_step": True}}, "'start_step' must be an integer"),
    ("retention", {"body": {"gc_cutoff_epoch_ms": "1"}}, "field 'gc_cutoff_epoch_ms' must be an integer"),
    ("alert", {"name": "n", "message": "m", "metadata": []}, "field 'metadata' must be an object"),
    ("fork_from_failure", {"body": {"workflow_ids": [1], "from_step": 1}}, "must be a list of strings"),
    ("backfill_schedule", {"schedule_name": "s", "start": "yesterday", "end": "now"}, "backfill_schedule request"),
])
def test_bad_fields_are_answered_with_an_error(asker: Asker, kind: str, fields: dict[str, Any], error: str) -> None:
    reply = asker.ask(kind, **fields)
    assert error in reply["error_message"], reply["error_message"]
    assert reply["error_message"].startswith(f"{kind} request")
    for name, value in asker.table[kind].failed.items():
        assert reply[name] == value


# -- metadata-only mode ------------------------------------------------------------------------------------------------


def test_metadata_only_mode(make_asker: Callable[..., Asker]) -> None:
    asker = make_asker(metadata_only=True)
    failed = _run(dbos_app.failing)
    with_event = _run(dbos_app.with_event, "secret", "value")
    reply = asker.ask("get_workflow_events", workflow_id=with_event)
    assert "metadata-only" in reply["error_message"]
    assert reply["events"] is None
    for kind in ("get_workflow_notifications", "get_workflow_streams", "export_workflow", "import_workflow"):
        assert "metadata-only" in asker.ask(kind, workflow_id=with_event)["error_message"]
    listed = asker.ok("list_workflows", body={"workflow_uuids": [failed, with_event], "load_input": True,
                                              "load_output": True})["output"]
    assert {w["WorkflowUUID"] for w in listed} == {failed, with_event}
    for workflow in listed:
        assert (workflow["Input"], workflow["Output"], workflow["Error"]) == (None, None, None)
        assert workflow["CreatedAt"].isdigit()  # the metadata is there
    got = asker.ok("get_workflow", workflow_id=failed)["output"]
    assert (got["Status"], got["Input"], got["Error"]) == ("ERROR", None, None)
    steps = asker.ok("list_steps", workflow_id=failed, load_output=True)["output"]
    assert [(s["function_name"], s["output"], s["error"]) for s in steps] == [("token", None, None),
                                                                             ("broken", None, None)]


def test_metadata_only_mode_withholds_a_failures_details(make_asker: Callable[..., Asker]) -> None:
    missing = f"missing-{uuid.uuid4()}"
    reply = make_asker(metadata_only=True).ask("fork_workflow", body={"workflow_id": missing, "start_step": 1})
    assert reply["error_message"].startswith("Exception encountered when forking a workflow: ")
    assert "details withheld in metadata-only mode" in reply["error_message"]
    assert "Traceback" not in reply["error_message"] and missing not in reply["error_message"]
