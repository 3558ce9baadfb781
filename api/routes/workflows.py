"""REST routes for workflows (upstream listWorkflows ... importWorkflow, bulk operations, aggregates), carried to
an executor of the app (``gateway.management``) through ``api.managed``.

Reads go to any HEALTHY executor; resume and fork to one on the latest application version unless the request
names one. Every mutation is audited with the executor that served it and its outcome, failures included. An
unknown workflow id is a 404 for every operation on named workflows, whatever the SDK answers for it
(``Managed.require``).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query, Response
from fastapi.exceptions import RequestValidationError

from api import conductor as c
from api.managed import BULK_ERRORS, PREFIX, READ_ERRORS, WRITE_ERRORS, Managed, ManagedDep, capped
from api.schemas import MAX_JSON_INT
from core.errors import ForbiddenError, NotFoundError, RelayError
from gateway import Pick

router = APIRouter(prefix=PREFIX, tags=["Workflows"])

BULK_CONCURRENCY = 8  # per-id requests of a bulk action by filter in flight at once (executors answer serially)

WorkflowId = Annotated[str, Path(min_length=1)]


# -- reads -----------------------------------------------------------------------------------------------------


def workflows_response(reply: c.ListWorkflowsReply) -> Response:
    """A page of workflows, serialized once straight from the SDK's rows (``response_model`` documents it;
    FastAPI would validate every workflow again before serializing it)."""
    return Response(c.dump_workflows(reply.output), media_type="application/json")


@router.get("/workflows", operation_id="listWorkflows", summary="List workflows", responses=READ_ERRORS,
            response_model=list[c.Workflow])
async def list_workflows(
    m: ManagedDep,
    status: str | None = None,
    workflowName: str | None = None,
    limit: Annotated[int, Query(ge=1, le=c.MAX_PAGE, json_schema_extra=c.PAGE_EXTENDED)] = c.DEFAULT_PAGE,
    offset: Annotated[int, Query(ge=0, le=MAX_JSON_INT)] = 0,
    sortDesc: bool = False,
    loadInput: bool = False,
    loadOutput: bool = False,
) -> Response:
    """Inputs and outputs are loaded only when asked; at most ``limit`` workflows (default 100, at most 1000)."""
    body = c.list_body_of_query(status=status, workflow_name=workflowName, limit=limit, offset=offset,
                                sort_desc=sortDesc, load_input=loadInput, load_output=loadOutput)
    reply = await m.read("list_workflows", {"body": body}, c.ListWorkflowsReply)
    return workflows_response(reply)


@router.post("/workflows/search", operation_id="searchWorkflows", summary="Search workflows",
             responses=READ_ERRORS, response_model=list[c.Workflow])
async def search_workflows(
    m: ManagedDep, body: Annotated[c.WorkflowSearchBody, Body(default_factory=c.WorkflowSearchBody)],
) -> Response:
    reply = await m.read("list_workflows", {"body": c.list_body_of_search(body)}, c.ListWorkflowsReply)
    return workflows_response(reply)


@router.get("/workflows/{workflowId}", operation_id="getWorkflow", summary="Get workflow", responses=READ_ERRORS,
            response_model=c.Workflow)
async def get_workflow(m: ManagedDep, workflowId: WorkflowId) -> Response:
    reply = await m.read_workflow(workflowId, "get_workflow", {"workflow_id": workflowId, "load_input": True,
                                                               "load_output": True}, c.GetWorkflowReply,
                                  found=lambda r: r.output is not None)
    if reply.output is None:
        raise NotFoundError(f"workflow {workflowId!r} not found")
    return Response(c.dump_workflow(reply.output), media_type="application/json")


@router.get("/workflows/{workflowId}/steps", operation_id="listWorkflowSteps", summary="List workflow steps",
            responses=READ_ERRORS)
async def list_workflow_steps(
    m: ManagedDep, workflowId: WorkflowId,
    limit: Annotated[int | None, Query(ge=1, le=MAX_JSON_INT)] = None,
    offset: Annotated[int | None, Query(ge=0, le=MAX_JSON_INT)] = None,
) -> list[c.Step]:
    reply = await m.read_workflow(workflowId, "list_steps", {"workflow_id": workflowId, "load_output": True,
                                                             "limit": limit, "offset": offset}, c.ListStepsReply,
                                  found=lambda r: bool(r.output))
    if reply.output is None:
        raise NotFoundError(f"workflow {workflowId!r} not found")
    return [c.step_of(s) for s in reply.output]


@router.get("/workflows/{workflowId}/events", operation_id="listWorkflowEvents", summary="List workflow events",
            responses=READ_ERRORS)
async def list_workflow_events(m: ManagedDep, workflowId: WorkflowId) -> list[c.Event]:
    reply = await m.read_workflow(workflowId, "get_workflow_events", {"workflow_id": workflowId}, c.EventsReply,
                                  found=lambda r: bool(r.events))
    return [c.Event(key=e.key, value=e.value) for e in reply.events or []]


@router.get("/workflows/{workflowId}/notifications", operation_id="listWorkflowNotifications",
            summary="List workflow notifications", responses=READ_ERRORS)
async def list_workflow_notifications(m: ManagedDep, workflowId: WorkflowId) -> list[c.Notification]:
    reply = await m.read_workflow(workflowId, "get_workflow_notifications", {"workflow_id": workflowId},
                                  c.NotificationsReply, found=lambda r: bool(r.notifications))
    return [c.notification_of(n) for n in reply.notifications or []]


@router.get("/workflows/{workflowId}/streams", operation_id="listWorkflowStreams", summary="List workflow streams",
            responses=READ_ERRORS)
async def list_workflow_streams(m: ManagedDep, workflowId: WorkflowId) -> list[c.StreamEntry]:
    reply = await m.read_workflow(workflowId, "get_workflow_streams", {"workflow_id": workflowId}, c.StreamsReply,
                                  found=lambda r: bool(r.streams))
    return [c.StreamEntry(key=s.key, values=s.values) for s in reply.streams or []]


@router.get("/workflows/{workflowId}/export", operation_id="exportWorkflow", summary="Export workflow",
            responses=READ_ERRORS)
async def export_workflow(m: ManagedDep, workflowId: WorkflowId,
                          exportChildren: bool = False) -> c.ExportWorkflowOutputBody:
    reply = await m.read_workflow(workflowId, "export_workflow", {"workflow_id": workflowId,
                                                                  "export_children": exportChildren},
                                  c.ExportReply, found=lambda r: r.serialized_workflow is not None)
    if reply.serialized_workflow is None:
        raise NotFoundError(f"workflow {workflowId!r} not found")
    return c.ExportWorkflowOutputBody(serializedWorkflow=reply.serialized_workflow)


@router.post("/workflows/aggregates", operation_id="getWorkflowAggregates", summary="Get workflow aggregates",
             responses=READ_ERRORS, response_model=list[c.WorkflowAggregate])
async def get_workflow_aggregates(m: ManagedDep, body: c.WorkflowAggregatesBody) -> Response:
    reply = await m.read("get_workflow_aggregates", {"body": c.workflow_aggregates_body(body)},
                         c.WorkflowAggregatesReply)
    return _without_nulls([c.workflow_aggregate_of(a) for a in reply.output])


@router.post("/steps/aggregates", operation_id="getStepAggregates", summary="Get step aggregates",
             responses=READ_ERRORS, response_model=list[c.StepAggregate])
async def get_step_aggregates(m: ManagedDep, body: c.StepAggregatesBody) -> Response:
    reply = await m.read("get_step_aggregates", {"body": c.step_aggregates_body(body)}, c.StepAggregatesReply)
    return _without_nulls([c.step_aggregate_of(a) for a in reply.output])


def _without_nulls(items: list[c.WorkflowAggregate] | list[c.StepAggregate]) -> Response:
    """Upstream leaves unselected aggregates out (they are integers, never null); ``group`` keeps its nulls."""
    rows = [{**a.model_dump(mode="json", exclude_none=True), "group": a.model_dump(mode="json")["group"]}
            for a in items]
    return Response(content=_json(rows), media_type="application/json")


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


# -- one workflow ----------------------------------------------------------------------------------------------


@router.post("/workflows/{workflowId}/cancel", operation_id="cancelWorkflow", summary="Cancel workflow",
             status_code=204, responses=WRITE_ERRORS)
async def cancel_workflow(
    m: ManagedDep, workflowId: WorkflowId,
    body: Annotated[c.CancelWorkflowInputBody, Body(default_factory=c.CancelWorkflowInputBody)],
) -> Response:
    await m.mutate("workflow.cancel", "cancel", {"workflow_id": workflowId, "cancel_children": body.cancelChildren},
                   c.SdkReply, details={"workflowId": workflowId, "cancelChildren": body.cancelChildren},
                   workflow_ids=[workflowId])
    return Response(status_code=204)


@router.post("/workflows/{workflowId}/resume", operation_id="resumeWorkflow", summary="Resume workflow",
             status_code=204, responses=WRITE_ERRORS)
async def resume_workflow(
    m: ManagedDep, workflowId: WorkflowId,
    body: Annotated[c.ResumeWorkflowInputBody, Body(default_factory=c.ResumeWorkflowInputBody)],
) -> Response:
    """Sent to an executor on the latest application version."""
    await m.mutate("workflow.resume", "resume", {"workflow_id": workflowId, "queue_name": body.queueName},
                   c.SdkReply, pick=Pick.LATEST, details={"workflowId": workflowId, "queueName": body.queueName},
                   workflow_ids=[workflowId])
    return Response(status_code=204)


@router.delete("/workflows/{workflowId}", operation_id="deleteWorkflow", summary="Delete workflow",
               status_code=204, responses=WRITE_ERRORS)
async def delete_workflow(m: ManagedDep, workflowId: WorkflowId, deleteChildren: bool = False) -> Response:
    await m.mutate("workflow.delete", "delete", {"workflow_id": workflowId, "delete_children": deleteChildren},
                   c.SdkReply, details={"workflowId": workflowId, "deleteChildren": deleteChildren},
                   workflow_ids=[workflowId])
    return Response(status_code=204)


@router.post("/workflows/{workflowId}/fork", operation_id="forkWorkflow", summary="Fork workflow", status_code=201,
             responses=WRITE_ERRORS)
async def fork_workflow(
    m: ManagedDep, workflowId: WorkflowId,
    body: Annotated[c.ForkWorkflowInputBody, Body(default_factory=c.ForkWorkflowInputBody)],
) -> c.ForkWorkflowOutputBody:
    """Sent to an executor of ``appVersion`` when given, else of the latest application version."""
    reply = await m.mutate(
        "workflow.fork", "fork_workflow", {"body": c.fork_body(workflowId, body)}, c.ForkReply, pick=Pick.LATEST,
        version=body.appVersion, details={"workflowId": workflowId, "startStep": body.startStep,
                                          "appVersion": body.appVersion},
        outcome=lambda r: {"newWorkflowId": r.new_workflow_id}, workflow_ids=[workflowId],
        new_workflow_id=body.newWorkflowId)
    return c.ForkWorkflowOutputBody(workflowId=reply.new_workflow_id)


@router.post("/workflows/import", operation_id="importWorkflow", summary="Import workflow", status_code=201,
             responses=WRITE_ERRORS, response_class=Response)  # upstream: 201 without a body
async def import_workflow(m: ManagedDep, body: c.ImportWorkflowInputBody) -> Response:
    """Needs an org-wide key: the executor deserializes the payload (Python executors unpickle it)."""
    if m.principal.apps is not None:
        raise ForbiddenError("importWorkflow needs an org-wide key: the executor deserializes the payload")
    payload = body.serializedWorkflow.encode()
    await m.mutate("workflow.import", "import_workflow", {"serialized_workflow": body.serializedWorkflow},
                   c.SdkReply, details={"sha256": hashlib.sha256(payload).hexdigest(), "sizeBytes": len(payload)})
    return Response(status_code=201)


# -- bulk ------------------------------------------------------------------------------------------------------


async def _bulk(m: Managed, operation: str, kind: str, ids: list[str], fields: dict[str, Any], *,
                pick: Pick = Pick.ANY) -> None:
    """One request naming every id (``workflow_ids``; ``workflow_id`` for SDKs that read only that)."""
    ids = capped(m, ids)
    m.limit_rate()
    if ids:
        await m.mutate(operation, kind, {"workflow_id": ids[0], "workflow_ids": ids, **fields}, c.SdkReply,
                       pick=pick, details={"workflowIds": ids, "count": len(ids), **fields}, workflow_ids=ids)


@router.post("/workflows/bulk-cancel", operation_id="bulkCancelWorkflows", summary="Bulk cancel workflows",
             status_code=204, responses=BULK_ERRORS)
async def bulk_cancel(m: ManagedDep, body: c.BulkCancelInputBody) -> Response:
    await _bulk(m, "workflow.bulk_cancel", "cancel", body.workflowIds, {"cancel_children": body.cancelChildren})
    return Response(status_code=204)


@router.post("/workflows/bulk-resume", operation_id="bulkResumeWorkflows", summary="Bulk resume workflows",
             status_code=204, responses=BULK_ERRORS)
async def bulk_resume(m: ManagedDep, body: c.BulkResumeInputBody) -> Response:
    await _bulk(m, "workflow.bulk_resume", "resume", body.workflowIds, {"queue_name": body.queueName},
                pick=Pick.LATEST)
    return Response(status_code=204)


@router.post("/workflows/bulk-delete", operation_id="bulkDeleteWorkflows", summary="Bulk delete workflows",
             status_code=204, responses=BULK_ERRORS)
async def bulk_delete(m: ManagedDep, body: c.BulkDeleteInputBody) -> Response:
    await _bulk(m, "workflow.bulk_delete", "delete", body.workflowIds, {"delete_children": body.deleteChildren})
    return Response(status_code=204)


@router.post("/workflows/bulk-fork-from-failure", operation_id="bulkForkWorkflowsFromFailure",
             summary="Bulk fork workflows from failure", responses=BULK_ERRORS)
async def bulk_fork_from_failure(m: ManagedDep, body: c.BulkForkFromFailureBody) -> c.BulkForkFromFailureOutputBody:
    """Sent to an executor of ``appVersion`` when given, else of the latest application version."""
    ids = capped(m, body.workflowIds)
    m.limit_rate()
    if not ids:
        return c.BulkForkFromFailureOutputBody(workflowIds=[])
    reply = await m.mutate(
        "workflow.bulk_fork_from_failure", "fork_from_failure", {"body": c.fork_from_failure_body(ids, body)},
        c.ForkFromFailureReply, pick=Pick.LATEST, version=body.appVersion,
        details={"workflowIds": ids, "count": len(ids), "appVersion": body.appVersion},
        outcome=lambda r: {"forkedWorkflowIds": r.forked_workflow_ids}, workflow_ids=ids)
    return c.BulkForkFromFailureOutputBody(workflowIds=reply.forked_workflow_ids)


# -- Relay extension: bulk actions by filter ---------------------------------------------------------------------

PerId = Callable[[str], Awaitable[c.BulkResult]]
EXTENSION_OP = {"x-relay-extension": True}


async def _by_filter(m: Managed, operation: str, body: c.BulkFilter, per_id: PerId) -> c.BulkByFilterOutputBody:
    m.limit_rate()
    listing = await m.read("list_workflows", {"body": c.filter_list_body(body, limit=m.bulk_max + 1)},
                           c.ListWorkflowsReply)
    ids = list(dict.fromkeys(w.WorkflowUUID for w in listing.output))
    if len(ids) > m.bulk_max:
        raise RequestValidationError([{
            "loc": ("body",), "type": "too_long", "input": len(ids),
            "msg": f"more than {m.bulk_max} workflows match (the bulk cap): narrow the filter"}])
    if body.dryRun:
        return c.BulkByFilterOutputBody(dryRun=True, count=len(ids), firstIds=ids[:c.FIRST_IDS])
    gate = asyncio.Semaphore(BULK_CONCURRENCY)

    async def one(workflow_id: str) -> c.BulkResult:
        async with gate:
            try:
                return await per_id(workflow_id)
            except RelayError as err:
                return c.BulkResult(workflowId=workflow_id, outcome="failure", error=err.detail)

    results = list(await asyncio.gather(*(one(i) for i in ids)))
    failed = sum(r.outcome == "failure" for r in results)
    await m.audit(operation, "failure" if failed else "success", None, {
        "filter": body.model_dump(mode="json", exclude_none=True, exclude={"schema_url"}), "count": len(ids),
        "failed": failed, "results": [r.model_dump(exclude_none=True) for r in results]})
    return c.BulkByFilterOutputBody(dryRun=False, count=len(ids), firstIds=ids[:c.FIRST_IDS], results=results)


def _done(workflow_id: str, forked: str | None = None) -> c.BulkResult:
    return c.BulkResult(workflowId=workflow_id, outcome="success", forkedWorkflowId=forked)


@router.post("/workflows/bulk-cancel-by-filter", operation_id="bulkCancelWorkflowsByFilter",
             summary="Bulk cancel workflows by filter (Relay extension)", responses=BULK_ERRORS,
             openapi_extra=EXTENSION_OP)
async def bulk_cancel_by_filter(m: ManagedDep, body: c.BulkCancelByFilterBody) -> c.BulkByFilterOutputBody:
    """Cancels every workflow the filter matches (at most the bulk cap; 422 when more match), one by one, and says
    how each went. ``dryRun``: only count them and show the first 20 ids."""
    async def cancel(workflow_id: str) -> c.BulkResult:
        await m.ask("cancel", {"workflow_id": workflow_id, "cancel_children": body.cancelChildren})
        return _done(workflow_id)

    return await _by_filter(m, "workflow.bulk_cancel_by_filter", body, cancel)


@router.post("/workflows/bulk-resume-by-filter", operation_id="bulkResumeWorkflowsByFilter",
             summary="Bulk resume workflows by filter (Relay extension)", responses=BULK_ERRORS,
             openapi_extra=EXTENSION_OP)
async def bulk_resume_by_filter(m: ManagedDep, body: c.BulkResumeByFilterBody) -> c.BulkByFilterOutputBody:
    """As bulk-cancel-by-filter, resuming each on an executor of the latest application version."""
    async def resume(workflow_id: str) -> c.BulkResult:
        await m.ask("resume", {"workflow_id": workflow_id, "queue_name": body.resumeQueueName}, pick=Pick.LATEST)
        return _done(workflow_id)

    return await _by_filter(m, "workflow.bulk_resume_by_filter", body, resume)


@router.post("/workflows/bulk-fork-by-filter", operation_id="bulkForkWorkflowsByFilter",
             summary="Bulk fork workflows by filter (Relay extension)", responses=BULK_ERRORS,
             openapi_extra=EXTENSION_OP)
async def bulk_fork_by_filter(m: ManagedDep, body: c.BulkForkByFilterBody) -> c.BulkByFilterOutputBody:
    """As bulk-cancel-by-filter, forking each as bulkForkWorkflowsFromFailure does (``fork`` holds its options),
    on an executor of ``fork.appVersion`` when given, else of the latest application version."""
    async def fork(workflow_id: str) -> c.BulkResult:
        reply = await m.read("fork_from_failure", {"body": c.fork_from_failure_body([workflow_id], body.fork)},
                             c.ForkFromFailureReply, pick=Pick.LATEST, version=body.fork.appVersion)
        forked = reply.forked_workflow_ids
        if not forked:
            return c.BulkResult(workflowId=workflow_id, outcome="failure", error="the executor forked nothing")
        return _done(workflow_id, forked[0])

    return await _by_filter(m, "workflow.bulk_fork_by_filter", body, fork)
