"""Every request type Relay sends, answered on DBOS's public API (``DBOS.*``), with the reply fields dbos 3.2.0's
built-in conductor client sends.

How each is answered on dbos 3.3/3.4 (the closing table of the client's README says the same):

- public calls: ``list_workflows``, ``list_queued_workflows``, ``get_workflow``, ``exist_pending_workflows``,
  ``list_steps``, ``cancel``, ``resume``, ``delete``, ``fork_workflow``, ``rewind_workflow``, ``list_schedules``,
  ``get_schedule``, ``pause_schedule``, ``resume_schedule``, ``backfill_schedule``, ``trigger_schedule``,
  ``get_workflow_events``, ``list_application_versions``, ``set_latest_application_version``, ``list_queues``,
  ``get_queue``; ``executor_info`` and ``alert`` need no SDK call beyond ``DBOS.executor_id`` and
  ``DBOS.application_version``;
- the one private call, ``recovery`` (``recovery.recover``);
- this client's own, on public calls: ``retention`` (``retention.py``) and ``fork_from_failure`` (the start step
  read from the listed steps, then ``fork_workflow``);
- unsupported (``Unsupported``, which Relay answers with 501): ``get_metrics``, ``export_workflow``,
  ``import_workflow``, ``get_workflow_aggregates``, ``get_step_aggregates`` (dbos 3.4 moved them out of its MIT
  package), ``get_workflow_notifications`` and ``get_workflow_streams`` (no public call lists a workflow's
  notifications, or the keys of its streams).
"""

from __future__ import annotations

import json
import logging
import socket
import uuid
from collections.abc import Callable
from datetime import datetime
from importlib.metadata import version
from typing import Any

from dbos import DBOS, Queue, SetWorkflowID, StepInfo, WorkflowSchedule, WorkflowStatus

from relay_dbos import recovery
from relay_dbos.protocol import BadRequest, Operation, Request, Unsupported
from relay_dbos.retention import Retention

log = logging.getLogger("relay_dbos")

AlertHandler = Callable[[str, str, dict[str, str]], None]
STR_OR_LIST = (str, list)
OPT_INT = int


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def workflow_output(w: WorkflowStatus) -> dict[str, Any]:
    """A workflow as ``list_workflows`` replies carry it: PascalCase, every value text (epoch ms as digits)."""
    return {
        "WorkflowUUID": w.workflow_id, "Status": w.status, "WorkflowName": w.name,
        "WorkflowClassName": w.class_name, "WorkflowConfigName": w.config_name,
        "AuthenticatedUser": w.authenticated_user, "AssumedRole": w.assumed_role,
        "AuthenticatedRoles": _text(w.authenticated_roles), "Input": _text(w.input), "Output": _text(w.output),
        "Error": _text(w.error), "CreatedAt": _text(w.created_at), "UpdatedAt": _text(w.updated_at),
        "QueueName": w.queue_name, "ApplicationVersion": w.app_version, "ExecutorID": w.executor_id,
        "WorkflowTimeoutMS": _text(w.workflow_timeout_ms),
        "WorkflowDeadlineEpochMS": _text(w.workflow_deadline_epoch_ms),
        "DeduplicationID": w.deduplication_id, "Priority": _text(w.priority),
        "QueuePartitionKey": w.queue_partition_key, "ForkedFrom": w.forked_from, "WasForkedFrom": w.was_forked_from,
        "ParentWorkflowID": w.parent_workflow_id, "DequeuedAt": _text(w.dequeued_at),
        "DelayUntilEpochMS": _text(w.delay_until_epoch_ms), "CompletedAt": _text(w.completed_at),
        # JSON rather than str(), so the attributes can be read back.
        "Attributes": None if w.attributes is None else json.dumps(w.attributes, default=str),
        "ScheduleName": w.schedule_name, "ApplicationName": w.application_name,
    }


def step_output(s: StepInfo) -> dict[str, Any]:
    return {"function_id": s["function_id"], "function_name": s["function_name"], "output": _text(s["output"]),
            "error": _text(s["error"]), "child_workflow_id": s["child_workflow_id"],
            "started_at_epoch_ms": _text(s["started_at_epoch_ms"]),
            "completed_at_epoch_ms": _text(s["completed_at_epoch_ms"])}


def schedule_output(s: WorkflowSchedule, *, load_context: bool) -> dict[str, Any]:
    return {"schedule_id": s["schedule_id"], "schedule_name": s["schedule_name"],
            "workflow_name": s["workflow_name"], "workflow_class_name": s["workflow_class_name"],
            "schedule": s["schedule"], "status": s["status"],
            "context": _text(s["context"]) if load_context else None, "last_fired_at": s.get("last_fired_at"),
            "automatic_backfill": s.get("automatic_backfill", False), "cron_timezone": s.get("cron_timezone"),
            "queue_name": s.get("queue_name"), "application_name": s.get("application_name")}


def queue_output(q: Queue) -> dict[str, Any]:
    """A queue from its public properties (each a read of the queue's row: ``list_queues`` is an operator's
    occasional request)."""
    limiter, partition_limiter = q.limiter, q.partition_limiter
    partition_concurrency, partition_worker_concurrency = q.partition_concurrency, q.partition_worker_concurrency
    return {
        "name": q.name, "concurrency": q.global_concurrency, "worker_concurrency": q.worker_concurrency,
        "rate_limit_max": limiter["limit"] if limiter else None,
        "rate_limit_period_sec": limiter["period"] if limiter else None,
        # Every queue is a priority queue; any per-partition limit makes it partitioned (as dbos 3.2.0 reports).
        "priority_enabled": True,
        "partition_queue": any(v is not None for v in (partition_concurrency, partition_worker_concurrency,
                                                       partition_limiter)),
        "polling_interval_sec": q.polling_interval_sec, "application_name": q.application_name,
        "partition_concurrency": partition_concurrency, "partition_worker_concurrency": partition_worker_concurrency,
        "partition_rate_limit_max": partition_limiter["limit"] if partition_limiter else None,
        "partition_rate_limit_period_sec": partition_limiter["period"] if partition_limiter else None,
    }


def _ids(request: Request) -> list[str]:
    """``workflow_ids`` when given (a bulk action), else the one ``workflow_id``."""
    ids = request.get("workflow_ids", list)
    if ids:
        if not all(isinstance(i, str) for i in ids):
            raise BadRequest(f"{request.kind} request: field 'workflow_ids' must be a list of strings")
        return list(ids)
    return [request.require("workflow_id", str)]


def _moved(operation: str) -> Unsupported:
    return Unsupported(f"{operation} is not available with dbos {version('dbos')}: DBOS moved it out of its "
                       "MIT-licensed package in 3.3/3.4, and relay-dbos has no public call to do it with")


class Operations:
    """The answers of one executor process. ``metadata`` goes out in ``executor_info``; ``on_alert`` takes Relay's
    alerts (logged when absent); ``metadata_only`` withholds inputs, outputs and schedule contexts."""

    def __init__(self, *, metadata: dict[str, Any] | None, on_alert: AlertHandler | None,
                 metadata_only: bool, retention: Retention) -> None:
        self.metadata = metadata
        self.on_alert = on_alert
        self.metadata_only = metadata_only
        self.retention = retention

    def table(self) -> dict[str, Operation]:
        ok = {"success": False}
        return {
            "executor_info": Operation(self.executor_info, {}, "Exception encountered when describing the executor"),
            "recovery": Operation(self.recovery, ok, "Exception encountered when recovering workflows"),
            "exist_pending_workflows": Operation(self.exist_pending_workflows, {"exist": False},
                                                 "Exception encountered when checking for pending workflows"),
            "retention": Operation(self.retention_round, ok, "Exception encountered when starting retention"),
            "list_workflows": Operation(self.list_workflows, {"output": []},
                                        "Exception encountered when listing workflows"),
            "list_queued_workflows": Operation(self.list_queued_workflows, {"output": []},
                                               "Exception encountered when listing queued workflows"),
            "get_workflow": Operation(self.get_workflow, {"output": None},
                                      "Exception encountered when getting a workflow"),
            "list_steps": Operation(self.list_steps, {"output": None}, "Exception encountered when listing steps"),
            "cancel": Operation(self.cancel, ok, "Exception encountered when cancelling workflow(s)"),
            "resume": Operation(self.resume, ok, "Exception encountered when resuming workflow(s)"),
            "delete": Operation(self.delete, ok, "Exception encountered when deleting workflow(s)"),
            "fork_workflow": Operation(self.fork_workflow, {"new_workflow_id": None},
                                       "Exception encountered when forking a workflow"),
            "fork_from_failure": Operation(self.fork_from_failure, {"forked_workflow_ids": None},
                                           "Exception encountered when bulk forking workflows"),
            "rewind_workflow": Operation(self.rewind_workflow, ok, "Exception encountered when rewinding workflow"),
            "get_metrics": Operation(self.moved("get_metrics"), {"metrics": []}, "get_metrics"),
            "alert": Operation(self.alert, ok, "Exception encountered when processing alert"),
            "export_workflow": Operation(self.moved("export_workflow"), {"serialized_workflow": None},
                                         "export_workflow"),
            "import_workflow": Operation(self.moved("import_workflow"), ok, "import_workflow"),
            "list_schedules": Operation(self.list_schedules, {"output": []},
                                        "Exception encountered when listing schedules"),
            "get_schedule": Operation(self.get_schedule, {"output": None},
                                      "Exception encountered when getting a schedule"),
            "pause_schedule": Operation(self.pause_schedule, ok, "Exception encountered when pausing a schedule"),
            "resume_schedule": Operation(self.resume_schedule, ok, "Exception encountered when resuming a schedule"),
            "backfill_schedule": Operation(self.backfill_schedule, {"workflow_ids": []},
                                           "Exception encountered when backfilling a schedule"),
            "trigger_schedule": Operation(self.trigger_schedule, {"workflow_id": None},
                                          "Exception encountered when triggering a schedule"),
            "get_workflow_events": Operation(self.get_workflow_events, {"events": None},
                                             "Exception encountered when getting a workflow's events"),
            "get_workflow_notifications": Operation(
                self.unlisted("get_workflow_notifications", "notifications"), {"notifications": None},
                "get_workflow_notifications"),
            "get_workflow_streams": Operation(self.unlisted("get_workflow_streams", "streams"), {"streams": None},
                                              "get_workflow_streams"),
            "get_workflow_aggregates": Operation(self.moved("get_workflow_aggregates"), {"output": []},
                                                 "get_workflow_aggregates"),
            "get_step_aggregates": Operation(self.moved("get_step_aggregates"), {"output": []},
                                             "get_step_aggregates"),
            "list_application_versions": Operation(self.list_application_versions, {"output": []},
                                                   "Exception encountered when listing application versions"),
            "set_latest_application_version": Operation(
                self.set_latest_application_version, ok,
                "Exception encountered when setting the latest application version"),
            "list_queues": Operation(self.list_queues, {"output": []}, "Exception encountered when listing queues"),
            "get_queue": Operation(self.get_queue, {"output": None}, "Exception encountered when getting a queue"),
        }

    # -- the executor and its recovery ------------------------------------------------------------------------

    def executor_info(self, request: Request) -> dict[str, Any]:
        return {"executor_id": DBOS.executor_id, "application_version": DBOS.application_version,
                "hostname": socket.gethostname(), "language": "python", "dbos_version": version("dbos"),
                "executor_metadata": self.metadata}

    def recovery(self, request: Request) -> dict[str, Any]:
        ids = request.require("executor_ids", list)
        if not all(isinstance(i, str) for i in ids):
            raise BadRequest("recovery request: field 'executor_ids' must be a list of strings")
        recovery.recover(ids)
        return {"success": True}

    def exist_pending_workflows(self, request: Request) -> dict[str, Any]:
        # The query recovery itself makes: PENDING, owned by that executor, of that version.
        found = DBOS.list_workflows(status="PENDING", executor_id=request.require("executor_id", str),
                                    app_version=request.require("application_version", str), limit=1,
                                    load_input=False, load_output=False)
        return {"exist": bool(found)}

    def retention_round(self, request: Request) -> dict[str, Any]:
        body = request.body()
        self.retention.start(gc_cutoff_epoch_ms=body.get("gc_cutoff_epoch_ms", int),
                             gc_rows_threshold=body.get("gc_rows_threshold", int),
                             gc_batch_size=body.get("gc_batch_size", int),
                             timeout_cutoff_epoch_ms=body.get("timeout_cutoff_epoch_ms", int))
        return {"success": True}  # started, not finished: as dbos 3.2.0 answers

    def alert(self, request: Request) -> dict[str, Any]:
        name, message = request.require("name", str), request.require("message", str)
        metadata = request.get("metadata", dict, {})
        if self.on_alert is not None:
            self.on_alert(name, message, metadata)
        else:
            log.info("Alert: %s | Message: %s | Metadata: %s", name, message, metadata)
        return {"success": True}

    # -- workflows --------------------------------------------------------------------------------------------

    def _listed(self, request: Request, *, queues_only: bool) -> list[WorkflowStatus]:
        b = request.body()
        load = not self.metadata_only
        return DBOS.list_workflows(
            workflow_ids=b.get("workflow_uuids", list), user=b.get("authenticated_user", STR_OR_LIST),
            start_time=b.get("start_time", str), end_time=b.get("end_time", str),
            completed_after=b.get("completed_after", str), completed_before=b.get("completed_before", str),
            dequeued_after=b.get("dequeued_after", str), dequeued_before=b.get("dequeued_before", str),
            status=b.get("status", STR_OR_LIST), app_version=b.get("application_version", STR_OR_LIST),
            application_name=b.get("application_name", STR_OR_LIST), forked_from=b.get("forked_from", STR_OR_LIST),
            parent_workflow_id=b.get("parent_workflow_id", STR_OR_LIST), name=b.get("workflow_name", STR_OR_LIST),
            queue_name=b.get("queue_name", STR_OR_LIST), limit=b.get("limit", OPT_INT),
            offset=b.get("offset", OPT_INT), sort_desc=b.get("sort_desc", bool, False),
            workflow_id_prefix=b.get("workflow_id_prefix", STR_OR_LIST),
            load_input=b.get("load_input", bool, True) and load, load_output=b.get("load_output", bool, True) and load,
            executor_id=b.get("executor_id", STR_OR_LIST), queues_only=queues_only or b.get("queues_only", bool, False),
            was_forked_from=b.get("was_forked_from", bool), has_parent=b.get("has_parent", bool),
            attributes=b.get("attributes", dict), schedule_name=b.get("schedule_name", STR_OR_LIST))

    def list_workflows(self, request: Request) -> dict[str, Any]:
        return {"output": [workflow_output(w) for w in self._listed(request, queues_only=False)]}

    def list_queued_workflows(self, request: Request) -> dict[str, Any]:
        return {"output": [workflow_output(w) for w in self._listed(request, queues_only=True)]}

    def get_workflow(self, request: Request) -> dict[str, Any]:
        load = not self.metadata_only
        found = DBOS.list_workflows(workflow_ids=[request.require("workflow_id", str)],
                                    load_input=request.get("load_input", bool, True) and load,
                                    load_output=request.get("load_output", bool, True) and load)
        return {"output": workflow_output(found[0]) if found else None}

    def list_steps(self, request: Request) -> dict[str, Any]:
        steps = DBOS.list_workflow_steps(request.require("workflow_id", str),
                                         load_output=request.get("load_output", bool, True) and not self.metadata_only,
                                         limit=request.get("limit", OPT_INT), offset=request.get("offset", OPT_INT))
        return {"output": [step_output(s) for s in steps]}

    def cancel(self, request: Request) -> dict[str, Any]:
        DBOS.cancel_workflows(_ids(request), cancel_children=request.get("cancel_children", bool, False))
        return {"success": True}

    def resume(self, request: Request) -> dict[str, Any]:
        DBOS.resume_workflows(_ids(request), queue_name=request.get("queue_name", str))
        return {"success": True}

    def delete(self, request: Request) -> dict[str, Any]:
        DBOS.delete_workflows(_ids(request), delete_children=request.get("delete_children", bool, False))
        return {"success": True}

    def fork_workflow(self, request: Request) -> dict[str, Any]:
        b = request.body()
        new_id = b.get("new_workflow_id", str) or str(uuid.uuid4())
        with SetWorkflowID(new_id):
            handle = DBOS.fork_workflow(b.require("workflow_id", str), b.require("start_step", int),
                                        application_version=b.get("application_version", str),
                                        queue_name=b.get("queue_name", str),
                                        queue_partition_key=b.get("queue_partition_key", str))
        return {"new_workflow_id": handle.get_workflow_id()}

    def fork_from_failure(self, request: Request) -> dict[str, Any]:
        """Each workflow forked from one of its steps, chosen as dbos 3.2.0 chose it: ``from_step`` as given; the
        last step that failed, else the last step (``from_last_failure``); the last step (``from_last_step``); the
        last step of that name (``from_step_name``, an error if a workflow has none). A workflow with no step starts
        again from step 1. Unlike 3.2.0's one transaction, each fork is its own call: an error part-way leaves the
        forks made before it."""
        b = request.body()
        ids = b.require("workflow_ids", list)
        modes = [b.get("from_last_failure", bool, False), b.get("from_last_step", bool, False),
                 b.get("from_step", int) is not None, b.get("from_step_name", str) is not None]
        if sum(modes) != 1:
            raise BadRequest("fork_from_failure request: exactly one of from_last_failure, from_last_step, "
                             "from_step, from_step_name")
        forked = []
        for workflow_id in ids:
            if not isinstance(workflow_id, str):
                raise BadRequest("fork_from_failure request: field 'workflow_ids' must be a list of strings")
            start = self._start_step(workflow_id, b)
            with SetWorkflowID(str(uuid.uuid4())):
                handle = DBOS.fork_workflow(workflow_id, start,
                                            application_version=b.get("application_version", str),
                                            queue_name=b.get("queue_name", str),
                                            queue_partition_key=b.get("queue_partition_key", str))
            forked.append(handle.get_workflow_id())
        return {"forked_workflow_ids": forked}

    @staticmethod
    def _start_step(workflow_id: str, b: Request) -> int:
        from_step: int | None = b.get("from_step", int)
        if from_step is not None:
            return from_step
        # DBOS reads a step's error only with its output: without them no step would look failed.
        last_failure = b.get("from_last_failure", bool, False)
        steps = DBOS.list_workflow_steps(workflow_id, load_output=last_failure)
        name: str | None = b.get("from_step_name", str)
        if name is not None:
            named = [s["function_id"] for s in steps if s["function_name"] == name]
            if not named:
                raise ValueError(f"Workflow {workflow_id} has no step named {name!r}")
            return max(named)
        if last_failure:
            failed = [s["function_id"] for s in steps if s["error"] is not None]
            if failed:
                return max(failed)
        return max((s["function_id"] for s in steps), default=1)

    def rewind_workflow(self, request: Request) -> dict[str, Any]:
        b = request.body()
        DBOS.rewind_workflow(b.require("workflow_id", str), start_step=b.get("start_step", int) or 1,
                             application_version=b.get("application_version", str),
                             queue_name=b.get("queue_name", str),
                             queue_partition_key=b.get("queue_partition_key", str))
        return {"success": True}

    def get_workflow_events(self, request: Request) -> dict[str, Any]:
        events = DBOS.get_all_events(request.require("workflow_id", str))
        return {"events": [{"key": k, "value": str(v)} for k, v in events.items()]}

    # -- schedules --------------------------------------------------------------------------------------------

    def list_schedules(self, request: Request) -> dict[str, Any]:
        b = request.body(required=False)
        load_context = b.get("load_context", bool, True) and not self.metadata_only
        schedules = DBOS.list_schedules(status=b.get("status", STR_OR_LIST),
                                        workflow_name=b.get("workflow_name", STR_OR_LIST),
                                        schedule_name_prefix=b.get("schedule_name_prefix", STR_OR_LIST),
                                        application_name=b.get("application_name", STR_OR_LIST))
        return {"output": [schedule_output(s, load_context=load_context) for s in schedules]}

    def get_schedule(self, request: Request) -> dict[str, Any]:
        found = DBOS.get_schedule(request.require("schedule_name", str))
        load_context = request.get("load_context", bool, True) and not self.metadata_only
        return {"output": None if found is None else schedule_output(found, load_context=load_context)}

    def pause_schedule(self, request: Request) -> dict[str, Any]:
        DBOS.pause_schedule(request.require("schedule_name", str))
        return {"success": True}

    def resume_schedule(self, request: Request) -> dict[str, Any]:
        DBOS.resume_schedule(request.require("schedule_name", str))
        return {"success": True}

    def backfill_schedule(self, request: Request) -> dict[str, Any]:
        try:
            start = datetime.fromisoformat(request.require("start", str))
            end = datetime.fromisoformat(request.require("end", str))
        except ValueError as err:
            raise BadRequest(f"backfill_schedule request: {err}") from None
        handles = DBOS.backfill_schedule(request.require("schedule_name", str), start, end)
        return {"workflow_ids": [h.get_workflow_id() for h in handles]}

    def trigger_schedule(self, request: Request) -> dict[str, Any]:
        return {"workflow_id": DBOS.trigger_schedule(request.require("schedule_name", str)).get_workflow_id()}

    # -- versions and queues ----------------------------------------------------------------------------------

    def list_application_versions(self, request: Request) -> dict[str, Any]:
        return {"output": [{"version_id": v["version_id"], "version_name": v["version_name"],
                            "version_timestamp": v["version_timestamp"], "created_at": v["created_at"]}
                           for v in DBOS.list_application_versions()]}

    def set_latest_application_version(self, request: Request) -> dict[str, Any]:
        DBOS.set_latest_application_version(request.require("version_name", str))
        return {"success": True}

    def list_queues(self, request: Request) -> dict[str, Any]:
        b = request.body(required=False)
        return {"output": [queue_output(q) for q in
                           DBOS.list_queues(application_name=b.get("application_name", STR_OR_LIST))]}

    def get_queue(self, request: Request) -> dict[str, Any]:
        found = DBOS.retrieve_queue(request.require("name", str))
        return {"output": None if found is None else queue_output(found)}

    # -- what this SDK release cannot do ----------------------------------------------------------------------

    @staticmethod
    def moved(operation: str) -> Callable[[Request], dict[str, Any]]:
        def refuse(request: Request) -> dict[str, Any]:
            raise _moved(operation)
        return refuse

    @staticmethod
    def unlisted(operation: str, what: str) -> Callable[[Request], dict[str, Any]]:
        def refuse(request: Request) -> dict[str, Any]:
            raise Unsupported(f"{operation} is not available with dbos {version('dbos')}: no public call lists a "
                              f"workflow's {what} (relay-dbos uses DBOS's public API only)")
        return refuse
