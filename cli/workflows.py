"""The workflow-management half of the ``relay`` command: ``workflows``, ``queues``, ``schedules`` and ``versions``.

Each command is one call to ``/v2/orgs/{org}/apps/{app}/...``, the upstream Conductor API, which Relay answers
through one of the app's executors; the client, ``--url``/``--api-key``/``--org``/``-o`` and the errors are
``cli.admin``'s. Flags take dbos-ctl's names (``dbos workflow list|get|steps|cancel|resume|fork``) where it has the
option, except that ``-o`` is the output format here, so ``--offset`` has no short form.

``workflows list`` calls listWorkflows when its filters fit that operation's query (one status, one name) and
searchWorkflows when they do not (``--user``, times, versions, queues, several statuses). ``cancel``, ``resume``
and ``delete`` take one id or several: one goes to the single-workflow route, several to the bulk one.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from datetime import datetime
from typing import Any

from cli import workflow_tables as show
from cli.common import api_of, app_path, command, emit, fail, instant, iso, path_part, say
from cli.tables import Json
from core.settings import Settings
from core.units import utcnow

Render = Callable[[Any, datetime], str]
LIST_DEFAULT_LIMIT = 10  # dbos-ctl's: a screenful; --limit asks for more



def _show(args: argparse.Namespace, data: Json, render: Render) -> None:
    now = utcnow()
    emit(args, data, lambda value: render(value, now))



def _given(**fields: Any) -> dict[str, Json]:
    """The fields that were given: an absent flag leaves the upstream default in force."""
    return {k: v for k, v in fields.items() if v is not None and v is not False}


# -- workflows ------------------------------------------------------------------------------------------------------


def list_request(args: argparse.Namespace) -> tuple[str, str, dict[str, Json] | None, dict[str, Json] | None]:
    """``(method, path, query, body)`` of ``workflows list``: listWorkflows's query when the filters fit it (at
    most one status and one name, nothing else), otherwise a WorkflowSearchBody."""
    page = _given(limit=args.limit, offset=args.offset, sortDesc=args.sort_desc, loadInput=args.load_input,
                  loadOutput=args.load_output)
    search_only = _given(user=args.user, appVersion=args.application_version, queueName=args.queue_name,
                         queuesOnly=args.queues_only, executorId=args.executor_id,
                         workflowIdPrefix=args.workflow_id_prefix, startTime=args.start_time and iso(args.start_time),
                         endTime=args.end_time and iso(args.end_time))
    statuses, names = args.status or [], args.name or []
    if not search_only and len(statuses) <= 1 and len(names) <= 1:
        query = _given(status=next(iter(statuses), None), workflowName=next(iter(names), None))
        return "GET", app_path(args) + "/workflows", {**query, **page}, None
    body = _given(status=statuses or None, workflowName=names or None)
    return "POST", app_path(args) + "/workflows/search", None, {**body, **search_only, **page}


def _workflows_list(args: argparse.Namespace, settings: Settings) -> None:
    method, path, query, body = list_request(args)
    _show(args, api_of(args, settings).call(method, path, params=query, body=body), show.workflows_table)


def _workflow(args: argparse.Namespace, suffix: str = "") -> str:
    return f"{app_path(args)}/workflows{path_part(args.workflow_id)}{suffix}"


def _workflows_get(args: argparse.Namespace, settings: Settings) -> None:
    _show(args, api_of(args, settings).call("GET", _workflow(args)), show.workflow_card)


def _workflows_steps(args: argparse.Namespace, settings: Settings) -> None:
    query = _given(limit=args.limit, offset=args.offset)
    _show(args, api_of(args, settings).call("GET", _workflow(args, "/steps"), params=query), show.steps_table)


def _ids(args: argparse.Namespace) -> list[str]:
    return list(dict.fromkeys(args.workflow_ids))  # a repeated id is one workflow


def _workflows_cancel(args: argparse.Namespace, settings: Settings) -> None:
    ids, options = _ids(args), _given(cancelChildren=args.cancel_children)
    api, workflows = api_of(args, settings), f"{app_path(args)}/workflows"
    if len(ids) == 1:
        api.call("POST", f"{workflows}{path_part(ids[0])}/cancel", body=options or None)
    else:
        api.call("POST", f"{workflows}/bulk-cancel", body={"workflowIds": ids, **options})
    say(args, *(f"cancelled {i}" for i in ids))


def _workflows_resume(args: argparse.Namespace, settings: Settings) -> None:
    ids, options = _ids(args), _given(queueName=args.queue_name)
    api, workflows = api_of(args, settings), f"{app_path(args)}/workflows"
    if len(ids) == 1:
        api.call("POST", f"{workflows}{path_part(ids[0])}/resume", body=options or None)
    else:
        api.call("POST", f"{workflows}/bulk-resume", body={"workflowIds": ids, **options})
    say(args, *(f"resumed {i}" for i in ids))


def _workflows_delete(args: argparse.Namespace, settings: Settings) -> None:
    ids = _ids(args)
    if len(ids) == 1:
        api_of(args, settings).call("DELETE", f"{app_path(args)}/workflows{path_part(ids[0])}",
                                  params=_given(deleteChildren=args.delete_children))
    else:
        api_of(args, settings).call("POST", f"{app_path(args)}/workflows/bulk-delete",
                                  body={"workflowIds": ids, **_given(deleteChildren=args.delete_children)})
    say(args, *(f"deleted {i}" for i in ids))


def _workflows_fork(args: argparse.Namespace, settings: Settings) -> None:
    body = _given(startStep=args.step, newWorkflowId=args.forked_workflow_id, appVersion=args.application_version,
                  queueName=args.queue_name, queuePartitionKey=args.queue_partition_key)
    forked = api_of(args, settings).call("POST", _workflow(args, "/fork"), body=body)
    emit(args, forked, lambda f: f"forked {args.workflow_id} as {f['workflowId']}")


# -- queues, schedules, versions ------------------------------------------------------------------------------------


def _queues_list(args: argparse.Namespace, settings: Settings) -> None:
    _show(args, api_of(args, settings).call("GET", app_path(args) + "/queues"), show.queues_table)


def _queues_get(args: argparse.Namespace, settings: Settings) -> None:
    queue = api_of(args, settings).call("GET", f"{app_path(args)}/queues{path_part(args.queue_name)}")
    _show(args, queue, show.queue_card)


def _schedule(args: argparse.Namespace, suffix: str = "") -> str:
    return f"{app_path(args)}/schedules{path_part(args.schedule_name)}{suffix}"


def _schedules_list(args: argparse.Namespace, settings: Settings) -> None:
    query = _given(status=args.status, workflowName=args.name, scheduleNamePrefix=args.schedule_name_prefix,
                   loadContext=args.load_context)
    _show(args, api_of(args, settings).call("GET", app_path(args) + "/schedules", params=query), show.schedules_table)


def _schedules_get(args: argparse.Namespace, settings: Settings) -> None:
    _show(args, api_of(args, settings).call("GET", _schedule(args)), show.schedule_card)


def _schedules_pause(args: argparse.Namespace, settings: Settings) -> None:
    api_of(args, settings).call("POST", _schedule(args, "/pause"))
    say(args, f"paused {args.schedule_name}")


def _schedules_resume(args: argparse.Namespace, settings: Settings) -> None:
    api_of(args, settings).call("POST", _schedule(args, "/resume"))
    say(args, f"resumed {args.schedule_name}")


def _schedules_trigger(args: argparse.Namespace, settings: Settings) -> None:
    started = api_of(args, settings).call("POST", _schedule(args, "/trigger"))
    emit(args, started, lambda s: f"triggered {args.schedule_name}: workflow {s['workflowId']}")


def _schedules_backfill(args: argparse.Namespace, settings: Settings) -> None:
    if args.end_time <= args.start_time:
        fail("--end-time must be after --start-time")
    body = {"startTime": iso(args.start_time), "endTime": iso(args.end_time)}
    started = api_of(args, settings).call("POST", _schedule(args, "/backfill"), body=body)
    emit(args, started, lambda s: "\n".join([f"backfilled {args.schedule_name}: {len(s['workflowIds'])} workflows",
                                               *s["workflowIds"]]))


def _versions_list(args: argparse.Namespace, settings: Settings) -> None:
    _show(args, api_of(args, settings).call("GET", app_path(args) + "/versions"), show.versions_table)


def _versions_set_latest(args: argparse.Namespace, settings: Settings) -> None:
    api_of(args, settings).call("PATCH", app_path(args) + "/versions/latest", body={"versionName": args.version_name})
    say(args, f"latest version of {args.app}: {args.version_name}")


# -- the parser -----------------------------------------------------------------------------------------------------


def _group(sub: Any, name: str, help: str) -> Any:
    return sub.add_parser(name, help=help).add_subparsers(dest=f"{name}_command", required=True)



def _statuses(text: str) -> str:
    """Workflow and schedule statuses are upper case in the API (``SUCCESS``, ``PAUSED``): any case is taken."""
    return text.strip().upper()


def _page(p: argparse.ArgumentParser, *, limit: int | None = None) -> None:
    p.add_argument("--limit", "-l", type=int, default=limit,
                   help="at most this many" + (f" (default {limit})" if limit else ""))
    p.add_argument("--offset", type=int, help="skip this many (dbos-ctl's -o is -o json here)")


def _workflow_commands(sub: Any) -> None:
    group = _group(sub, "workflows", "an application's workflows, through its executors")
    ls = command(group, "list", _workflows_list, "list workflows, oldest first unless --sort-desc")
    _page(ls, limit=LIST_DEFAULT_LIMIT)
    ls.add_argument("--status", "-S", action="append", type=_statuses,
                    help="PENDING, ENQUEUED, SUCCESS, ERROR, CANCELLED, ..., in any case (repeatable)")
    ls.add_argument("--name", "-n", action="append", help="workflow name (repeatable)")
    ls.add_argument("--user", "-u", action="append", help="run by this user (repeatable)")
    ls.add_argument("--start-time", "-t", type=instant, help="created at or after: ISO 8601, or 1h for an hour ago")
    ls.add_argument("--end-time", "-e", type=instant, help="created before: ISO 8601, or a duration ago")
    ls.add_argument("--application-version", "-v", action="append", help="of this application version (repeatable)")
    ls.add_argument("--queue-name", "-q", action="append", help="on this queue (repeatable)")
    ls.add_argument("--queues-only", action="store_true",
                    help="only workflows still on a queue (as dbos workflow queue list)")
    ls.add_argument("--executor-id", action="append", help="run by this executor (repeatable)")
    ls.add_argument("--workflow-id-prefix", action="append", help="whose id starts with this (repeatable)")
    ls.add_argument("--sort-desc", "-d", action="store_true", help="newest first")
    ls.add_argument("--load-input", action="store_true", help="include each workflow's input")
    ls.add_argument("--load-output", action="store_true", help="include each workflow's output")

    command(group, "get", _workflows_get, "show one workflow", "workflow_id")
    _page(command(group, "steps", _workflows_steps, "list a workflow's steps", "workflow_id"))
    cancel = command(group, "cancel", _workflows_cancel, "cancel workflows (several ids: one bulk request)",
                      variadic="workflow_ids")
    cancel.add_argument("--cancel-children", action="store_true", help="cancel their child workflows too")
    resume = command(group, "resume", _workflows_resume, "resume workflows (several ids: one bulk request)",
                      variadic="workflow_ids")
    resume.add_argument("--queue-name", "-q", help="enqueue them on this queue")
    delete = command(group, "delete", _workflows_delete, "delete workflows (several ids: one bulk request)",
                      variadic="workflow_ids")
    delete.add_argument("--delete-children", action="store_true", help="delete their child workflows too")
    fork = command(group, "fork", _workflows_fork, "run a workflow again under a new id, from a step",
                    "workflow_id")
    fork.add_argument("--step", "-S", type=int, help="restart from this step (default: the start)")
    fork.add_argument("--forked-workflow-id", "-f", help="the new workflow's id")
    fork.add_argument("--application-version", "-v", help="run it on this application version")
    fork.add_argument("--queue-name", "-q", help="enqueue it on this queue")
    fork.add_argument("--queue-partition-key", help="with this partition key")


def add_commands(sub: Any) -> None:
    """Add ``workflows``, ``queues``, ``schedules`` and ``versions`` to the ``relay`` command's ``sub``."""
    _workflow_commands(sub)

    queues = _group(sub, "queues", "an application's queues")
    command(queues, "list", _queues_list, "list queues")
    command(queues, "get", _queues_get, "show one queue", "queue_name")

    schedules = _group(sub, "schedules", "an application's workflow schedules")
    ls = command(schedules, "list", _schedules_list, "list schedules")
    ls.add_argument("--status", "-S", type=_statuses, help="ACTIVE or PAUSED, in any case")
    ls.add_argument("--name", "-n", help="of this workflow")
    ls.add_argument("--schedule-name-prefix", help="whose name starts with this")
    ls.add_argument("--load-context", action="store_true", help="include each schedule's context")
    command(schedules, "get", _schedules_get, "show one schedule", "schedule_name")
    command(schedules, "pause", _schedules_pause, "pause a schedule", "schedule_name")
    command(schedules, "resume", _schedules_resume, "resume a paused schedule", "schedule_name")
    command(schedules, "trigger", _schedules_trigger, "start the scheduled workflow now", "schedule_name")
    backfill = command(schedules, "backfill", _schedules_backfill, "run the times a schedule missed",
                        "schedule_name")
    backfill.add_argument("--start-time", "-t", type=instant, required=True, help="ISO 8601, or 1h for an hour ago")
    backfill.add_argument("--end-time", "-e", type=instant, required=True, help="ISO 8601, or a duration ago")

    versions = _group(sub, "versions", "an application's versions")
    command(versions, "list", _versions_list, "list application versions")
    command(versions, "set-latest", _versions_set_latest, "make a version the latest", "version_name")
