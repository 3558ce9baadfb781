"""What every management route shares (workflows, queues, schedules, versions and metrics): the ``Managed``
dependency (the caller, the app, how to ask an executor and how to audit), executor errors as problems, the bulk
size cap and the per-app bulk rate limit, and the error responses those routes document.

An unknown workflow id is a 404 for every operation on named workflows, whatever the SDK answers for it (dbos
3.2.0 cancels it "successfully", lists no steps for it, and resumes or forks it with a traceback):
``Managed.require``. An executor's error is quoted without its stack trace, which is logged instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError

from api import conductor as c
from api.deps import AppAccessDep, source_ip
from api.problems import responses
from core import wire
from core.errors import (
    ConflictError,
    ExecutorRefusedError,
    ExecutorsFailedError,
    NotFoundError,
    RateLimitedError,
    RelayError,
)
from core.ratelimit import TokenBucket
from core.store import Candidates, Principal, Store, subject_of
from gateway import Answer, Gateway, Pick

R = TypeVar("R", bound=c.SdkReply)
log = logging.getLogger("relay.gateway")

PREFIX = "/v2/orgs/{orgName}/apps/{appName}"  # every management route's: one app of one org
# 501: the executors' SDK release cannot do it (Relay's client for dbos 3.3/3.4, for what DBOS moved out of its MIT
# package): ``gateway.management`` raises it when every executor asked says so.
READ_ERRORS = responses(401, 403, 404, 409, 422, 501, 502, 503)
WRITE_ERRORS = READ_ERRORS
BULK_ERRORS = responses(401, 403, 404, 409, 422, 429, 501, 502, 503)
MAX_QUOTE = 300  # an executor's error message, quoted in a problem (without its traceback: ``wire.error_summary``)
MAX_LOGGED = 10_000  # the whole error message, traceback included, in the gateway's log


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

    async def require(self, workflow_ids: list[str], *, absent: str | None = None) -> None:
        """404 unless every one of ``workflow_ids`` is a workflow of the app, and 409 when ``absent`` (the id of a
        workflow about to be made) is one already: one ``list_workflows`` naming them all (ids only), since some SDKs
        answer a cancel or a delete of an unknown id with success, and a fork under a taken id with an error (a 502
        blaming the executor; one made meanwhile still gets that error)."""
        asked = [*workflow_ids, *([absent] if absent is not None else [])]
        listing = await self.read("list_workflows", {"body": c.existence_body(asked)}, c.ListWorkflowsReply)
        known = {w.WorkflowUUID for w in listing.output}
        unknown = [i for i in workflow_ids if i not in known]
        if len(workflow_ids) == 1 and unknown:
            raise NotFoundError(f"workflow {unknown[0]!r} not found")
        if unknown:
            names = clip(", ".join(repr(i) for i in unknown))
            raise NotFoundError(f"{len(unknown)} of the {len(workflow_ids)} workflows not found, so none was "
                                f"changed: {names}")
        if absent is not None and absent in known:
            raise ConflictError(f"workflow {absent!r} already exists: give the fork another newWorkflowId")

    async def require_schedule(self, name: str) -> None:
        """404 unless ``name`` is a schedule of the app: the SDKs answer a trigger or a backfill of an unknown one
        with an error (which would be a 502 blaming the executor) and a pause or a resume with success."""
        found = await self.read("get_schedule", {"schedule_name": name}, c.GetScheduleReply)
        if found.output is None:
            raise NotFoundError(f"schedule {name!r} not found")

    async def mutate(self, operation: str, kind: str, fields: Mapping[str, Any], reply: type[R], *,
                     details: dict[str, Any], pick: Pick = Pick.ANY, version: str | None = None,
                     outcome: Callable[[R], dict[str, Any]] | None = None, workflow_ids: list[str] | None = None,
                     schedule: str | None = None, new_workflow_id: str | None = None) -> R:
        """``read``, audited as ``operation`` whatever happens (``outcome`` adds to the details of a success).
        ``workflow_ids``: the workflows it acts on, which must exist; ``schedule``: the schedule it acts on, which
        must exist (404, audited, and nothing sent); ``new_workflow_id``: the id of the workflow it makes, which
        must not exist yet (409, audited, and nothing sent)."""
        try:
            if workflow_ids or new_workflow_id is not None:
                await self.require(workflow_ids or [], absent=new_workflow_id)
            if schedule is not None:
                await self.require_schedule(schedule)
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
