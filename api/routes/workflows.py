"""REST routes for workflows (upstream listWorkflows ... importWorkflow, bulk operations, aggregates), carried to
an executor of the app (``gateway.management``), plus what every management route shares: the ``Managed``
dependency (the caller, the app, how to ask an executor and how to audit), executor errors as problems, the bulk
size cap and the per-app bulk rate limit.

Reads go to any HEALTHY executor; resume and fork to one on the latest application version unless the request
names one. Every mutation is audited with the executor that served it and its outcome, failures included. An
unknown workflow id is a 404 for every operation on named workflows, whatever the SDK answers for it (dbos 3.2.0
cancels it "successfully", lists no steps for it, and resumes or forks it with a traceback): ``Managed.require``.
An executor's error is quoted without its stack trace, which is logged instead.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Body, Depends, Path, Query, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from api import conductor as c
from api.deps import AppAccessDep, source_ip
from api.problems import responses
from api.schemas import MAX_JSON_INT
from core import wire
from core.errors import (
    ExecutorRefusedError,
    ExecutorsFailedError,
    ForbiddenError,
    NotFoundError,
    RateLimitedError,
    RelayError,
)
from core.ratelimit import TokenBucket
from core.store import Candidates, Principal, Store, subject_of
from gateway import Answer, Gateway, Pick

R = TypeVar("R", bound=c.SdkReply)
log = logging.getLogger("relay.gateway")

PREFIX = "/v2/orgs/{orgName}/apps/{appName}"
router = APIRouter(prefix=PREFIX, tags=["Workflows"])

READ_ERRORS = responses(401, 403, 404, 409, 422, 502, 503)
WRITE_ERRORS = READ_ERRORS
BULK_ERRORS = responses(401, 403, 404, 409, 422, 429, 502, 503)
MAX_QUOTE = 300  # an executor's error message, quoted in a problem (without its traceback: ``wire.error_summary``)
MAX_LOGGED = 10_000  # the whole error message, traceback included, in the gateway's log
BULK_CONCURRENCY = 8  # per-id requests of a bulk action by filter in flight at once (executors answer serially)

WorkflowId = Annotated[str, Path(min_length=1)]


# -- asking an executor ----------------------------------------------------------------------------------------


def clip(text: str, limit: int = MAX_QUOTE) -> str:
    return wire.clip(text, limit)


def failed(answer: Answer) -> str | None:
    """The executor's error, when it answered with one (``success: false`` without a message counts)."""
    if answer.error is None and answer.body.get("success") is False:
        return "success: false, without a message"
    return answer.error


def check(answer: Answer, kind: str) -> None:
    """An executor that answered with an error: 409 if it refuses (metadata-only mode), else 502. The problem
    quotes the error's messages only: the SDKs send whole tracebacks, which go to the gateway's log instead."""
    error = failed(answer)
    if error is None:
        return
    log.warning("executor %s failed %s: %s", answer.executor_id, kind, error[:MAX_LOGGED])
    said = wire.error_summary(error, MAX_QUOTE)
    if "metadata-only" in error.lower() or "metadata only" in error.lower():
        raise ExecutorRefusedError(f"executor {answer.executor_id} refused {kind} (metadata-only mode): {said}",
                                   executor_id=answer.executor_id)
    raise ExecutorsFailedError(f"executor {answer.executor_id} failed {kind}: {said}", tried=[answer.executor_id])


def parse(answer: Answer, reply: type[R], kind: str) -> R:
    try:
        return reply.model_validate(answer.body)
    except ValidationError as err:
        raise ExecutorsFailedError(f"executor {answer.executor_id} sent a {kind} reply Relay cannot read: "
                                   f"{clip(str(err))}", tried=[answer.executor_id]) from None


def storable(value: Any) -> Any:
    """``value`` with every string made storable: workflow and queue names are any JSON string, but PostgreSQL's
    JSON cannot hold NUL or a lone surrogate (``"\\ud800"`` is valid JSON)."""
    if isinstance(value, str):
        return value.replace("\x00", "\ufffd").encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {storable(k): storable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [storable(v) for v in value]
    return value


def executor_of(err: RelayError) -> str | None:
    """The executor an error came from, for the audit log."""
    if isinstance(err, ExecutorRefusedError):
        return err.executor_id
    tried: list[str] = getattr(err, "tried", None) or []
    return tried[-1] if tried else None


@dataclass
class BulkLimiter:
    """A token bucket per (org, app): ``per_minute`` bulk operations a minute, in bursts of as many."""

    per_minute: int
    buckets: dict[tuple[str, str], TokenBucket] = field(default_factory=dict)

    def take(self, key: tuple[str, str], now: float) -> bool:
        """``now``: a monotonic clock's seconds."""
        bucket = self.buckets.setdefault(key, TokenBucket(tokens=self.per_minute, updated=now))
        return bucket.take(now, rate=self.per_minute / timedelta(minutes=1).total_seconds(), capacity=self.per_minute)


@dataclass(frozen=True)
class Managed:
    """One management request: who asks, about which app, and the means to ask an executor and audit it."""

    org: str
    app: str
    app_id: str
    principal: Principal
    source_ip: str
    store: Store
    gateway: Gateway
    limiter: BulkLimiter
    prefetched: list[Candidates] = field(default_factory=list)

    async def answer(self, kind: str, fields: Mapping[str, Any], *, pick: Pick = Pick.ANY,
                     version: str | None = None) -> Answer:
        """The executor's answer as it came, an error included (``ask`` checks it)."""
        # The candidates read with the key check serve the first request; a bulk action's later ones read afresh.
        candidates = self.prefetched.pop() if self.prefetched else None
        return await self.gateway.management.ask(self.org, self.app, kind, fields, pick=pick, version=version,
                                                 candidates=candidates)

    async def ask(self, kind: str, fields: Mapping[str, Any], *, pick: Pick = Pick.ANY,
                  version: str | None = None) -> Answer:
        answer = await self.answer(kind, fields, pick=pick, version=version)
        check(answer, kind)
        return answer

    async def read(self, kind: str, fields: Mapping[str, Any], reply: type[R], *,
                   pick: Pick = Pick.ANY, version: str | None = None) -> R:
        return parse(await self.ask(kind, fields, pick=pick, version=version), reply, kind)

    async def read_workflow(self, workflow_id: str, kind: str, fields: Mapping[str, Any], reply: type[R], *,
                            found: Callable[[R], bool]) -> R:
        """A read about one workflow. An unknown id is a 404 whatever the SDK answers for it — nothing (``[]``
        steps, a null workflow) or an error (one that raises for it) — so an answer that is an error or not
        ``found`` is followed by a look whether the workflow exists; a known workflow's error is the 502 (409) it
        was, and its empty answer the answer."""
        answer = await self.answer(kind, fields)
        if failed(answer) is None:
            parsed = parse(answer, reply, kind)
            if found(parsed):
                return parsed
        await self.require([workflow_id])
        check(answer, kind)
        return parse(answer, reply, kind)

    async def require(self, workflow_ids: list[str]) -> None:
        """404 unless every one of ``workflow_ids`` is a workflow of the app: one ``list_workflows`` naming them
        (ids only), since some SDKs answer a cancel or a delete of an unknown id with success."""
        listing = await self.read("list_workflows", {"body": c.existence_body(workflow_ids)}, c.ListWorkflowsReply)
        known = {w.WorkflowUUID for w in listing.output}
        unknown = [i for i in workflow_ids if i not in known]
        if len(workflow_ids) == 1 and unknown:
            raise NotFoundError(f"workflow {unknown[0]!r} not found")
        if unknown:
            names = clip(", ".join(repr(i) for i in unknown))
            raise NotFoundError(f"{len(unknown)} of the {len(workflow_ids)} workflows not found, so none was "
                                f"changed: {names}")

    async def mutate(self, operation: str, kind: str, fields: Mapping[str, Any], reply: type[R], *,
                     details: dict[str, Any], pick: Pick = Pick.ANY, version: str | None = None,
                     outcome: Callable[[R], dict[str, Any]] | None = None, workflow_ids: list[str] | None = None) -> R:
        """``read``, audited as ``operation`` whatever happens (``outcome`` adds to the details of a success).
        ``workflow_ids``: the workflows it acts on, which must exist (404, audited, and nothing sent)."""
        try:
            if workflow_ids:
                await self.require(workflow_ids)
            answer = await self.ask(kind, fields, pick=pick, version=version)
            parsed = parse(answer, reply, kind)
        except RelayError as err:
            await self.audit(operation, "failure", executor_of(err), {**details, "outcome": err.detail})
            raise
        extra = outcome(parsed) if outcome is not None else {}
        await self.audit(operation, "success", answer.executor_id, {**details, "outcome": "success", **extra})
        return parsed

    async def audit(self, operation: str, status: str, executor_id: str | None, details: dict[str, Any]) -> None:
        await run_in_threadpool(lambda: self.store.write_audit(
            org=self.org, app=self.app, operation=operation, executor_id=executor_id, status=status,
            subject=subject_of(self.principal), source_ip=self.source_ip, details=storable(details)))

    @property
    def bulk_max(self) -> int:
        return self.gateway.settings.bulk_max_workflows

    def limit_rate(self) -> None:
        if not self.limiter.take((self.org, self.app), time.monotonic()):
            raise RateLimitedError(f"at most {self.limiter.per_minute} bulk operations a minute on app "
                                   f"{self.app!r}; retry shortly")


def _limiter(request: Request, gateway: Gateway) -> BulkLimiter:
    """One limiter per app instance (its state), made at first use: none at import time."""
    limiter: BulkLimiter | None = getattr(request.app.state, "bulk_limiter", None)
    if limiter is None:
        limiter = BulkLimiter(gateway.settings.bulk_operations_per_minute)
        request.app.state.bulk_limiter = limiter
    return limiter


async def managed(access: AppAccessDep, request: Request) -> Managed:
    """The app must be registered (404); the key allowed for it (403, checked first)."""
    gateway: Gateway = request.app.state.gateway
    app = access.app
    return Managed(org=app.org, app=app.name, app_id=app.id, principal=access.principal, source_ip=source_ip(request),
                   store=gateway.store, gateway=gateway, limiter=_limiter(request, gateway),
                   prefetched=[access.candidates] if access.candidates is not None else [])


ManagedDep = Annotated[Managed, Depends(managed)]


def capped(m: Managed, ids: list[str], location: str = "body.workflowIds") -> list[str]:
    """The ids without repeats, at most ``bulk_max_workflows`` of them (422 beyond)."""
    unique = list(dict.fromkeys(ids))
    if len(unique) > m.bulk_max:
        raise RequestValidationError([{"loc": tuple(location.split(".")), "type": "too_long", "input": len(unique),
                                       "msg": f"at most {m.bulk_max} workflows per bulk operation"}])
    return unique


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
        outcome=lambda r: {"newWorkflowId": r.new_workflow_id}, workflow_ids=[workflowId])
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
