"""REST route for the audit log (upstream listAuditLogs). Needs an org-wide key.

``details`` keys are in the REST API's one style, camelCase (``requestId``, ``connectionId``), whoever wrote the
row: Relay's workflows write some in snake_case. Only the top level is renamed: a value carried whole (``body``,
the wire message sent to an executor) keeps the names it had on the wire.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool

from api.deps import AdminPrincipal, OrgName, StoreDep
from api.problems import responses
from api.schemas import (
    FILTER_MAX,
    MAX_JSON_INT,
    PRINTABLE_PATTERN,
    AuditLogEntry,
    AuditSubject,
    AuditTarget,
    UTCTime,
    extended,
)
from core.models import AuditLog
from core.store import TOKEN_OPERATIONS

router = APIRouter(tags=["Audit"])

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
OptionalTime = UTCTime | None
OptionalStr = str | None
_SNAKE = re.compile(r"_([a-z0-9])")


def text_filter(*, description: str) -> Any:
    """A text filter: 1-FILTER_MAX characters, no control characters."""
    return Query(description=description, min_length=1, max_length=FILTER_MAX, pattern=PRINTABLE_PATTERN,
                 json_schema_extra=extended(f"1-{FILTER_MAX} characters, no control characters"))


@router.get("/audit-logs", operation_id="listAuditLogs", summary="List audit logs",
            responses=responses(401, 403, 404, 422))
async def list_audit_logs(
    orgName: OrgName,
    _p: AdminPrincipal,
    store: StoreDep,
    startTime: Annotated[OptionalTime, Query(description="entries at or after this instant")] = None,
    endTime: Annotated[OptionalTime, Query(description="entries before this instant")] = None,
    operation: Annotated[OptionalStr, text_filter(description="exact operation, e.g. app.updated")] = None,
    subject: Annotated[OptionalStr, text_filter(description="`system`, or a key's id or name")] = None,
    target: Annotated[OptionalStr, text_filter(description="an app name, a token name or an executor id")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, json_schema_extra=extended(
        f"1-{MAX_LIMIT}, default {DEFAULT_LIMIT}"))] = DEFAULT_LIMIT,
    offset: Annotated[int, Query(ge=0, le=MAX_JSON_INT)] = 0,
) -> list[AuditLogEntry]:
    """Newest first. Relay's own actions (executor lifecycle, recovery, retention) have subject type ``system``
    (a Relay extension); entries about an executor target its application and name it in
    ``details.executorId``."""
    rows, key_names = await run_in_threadpool(lambda: store.query_audit(
        orgName, start=startTime, end=endTime, operation=operation, subject=subject, target=target,
        limit=limit, offset=offset))
    return [_entry(row, key_names) for row in rows]


def _entry(row: AuditLog, key_names: dict[str, str]) -> AuditLogEntry:
    details = rest_keys(row.details) if isinstance(row.details, dict) else row.details
    if row.executor_id is not None:
        details = {**(details or {}), "executorId": row.executor_id}
    return AuditLogEntry(id=row.id, emitTime=row.emit_time, operation=row.operation,
                         status="success" if row.status == "success" else "failure",
                         subject=AuditSubject.of(row.subject, key_names), target=_target(row), sourceIp=row.source_ip,
                         details=details)


def rest_keys(details: dict[str, Any]) -> dict[str, Any]:
    """``details`` with its top-level keys in camelCase (``request_id`` → ``requestId``), in their order; of a key
    written both ways, the camelCase one."""
    out: dict[str, Any] = {}
    for key, value in details.items():
        camel = _SNAKE.sub(lambda m: m.group(1).upper(), key)
        if camel == key or camel not in details:
            out[camel] = value
    return out


def _target(row: AuditLog) -> AuditTarget:
    if row.operation in TOKEN_OPERATIONS and row.details and isinstance(row.details.get("tokenName"), str):
        return AuditTarget(type="token", id=row.details["tokenName"])
    if row.app is not None:
        return AuditTarget(type="application", id=row.app)
    return AuditTarget(type="organization", id=row.org)
