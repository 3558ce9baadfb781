"""The executor wire protocol: validated message models, and the one place seconds and epoch milliseconds
are produced for executors.

Executor replies are a discriminated union on ``type``. Unknown fields are ignored (SDKs add fields between
releases); a missing required field is a protocol error the caller logs and audits.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from core import units
from core.errors import NestingError, ProtocolError


class _Reply(BaseModel):
    model_config = ConfigDict(extra="ignore")

    request_id: str
    error_message: str | None = None


class ExecutorInfoReply(_Reply):
    type: Literal["executor_info"]
    executor_id: str = Field(min_length=1)
    application_version: str | None = None
    hostname: str | None = None
    language: str | None = None
    dbos_version: str | None = None
    executor_metadata: dict[str, Any] | None = None


class RecoveryReply(_Reply):
    type: Literal["recovery"]
    success: bool


class ExistPendingWorkflowsReply(_Reply):
    type: Literal["exist_pending_workflows"]
    exist: bool


class RetentionReply(_Reply):
    """Python 3.x and TypeScript SDKs answer at once: ``success`` means the round started, not that it ended."""

    type: Literal["retention"]
    success: bool


class OtherReply(_Reply):
    """Any other type: kept, with every field, so its ``request_id`` can still complete a waiting request and a
    management request gets the whole reply (``body()``)."""

    model_config = ConfigDict(extra="allow")

    type: str

    def body(self) -> dict[str, Any]:
        """The reply without ``type`` and ``request_id``."""
        return {"error_message": self.error_message, **(self.model_extra or {})}


Reply = Annotated[ExecutorInfoReply | RecoveryReply | ExistPendingWorkflowsReply | RetentionReply,
                  Field(discriminator="type")]
_known = TypeAdapter(Reply)
KNOWN_TYPES = {"executor_info", "recovery", "exist_pending_workflows", "retention"}
TYPE_MAX, REASON_MAX = 40, 300  # characters of an executor's own text quoted in a reason (logged and audited)


def parse_reply(
    text: str | bytes,
) -> ExecutorInfoReply | RecoveryReply | ExistPendingWorkflowsReply | RetentionReply | OtherReply:
    """Decode one executor frame. Raises ``ProtocolError`` with a short reason (``NestingError`` for a frame nested
    too deep to parse at all); never anything else."""
    try:
        data = json.loads(text)
    except RecursionError:
        raise NestingError("invalid JSON: nested too deep to parse") from None
    except (ValueError, UnicodeDecodeError) as err:
        raise ProtocolError(f"invalid JSON: {err}"[:REASON_MAX]) from None
    if not isinstance(data, dict):
        raise ProtocolError("a frame must be a JSON object")
    try:
        if isinstance(data.get("type"), str) and data["type"] in KNOWN_TYPES:  # a list or dict is unhashable
            return _known.validate_python(data)
        return OtherReply.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "frame"
        request_id = data.get("request_id")
        # Clipped: the reason is logged and audited for every malformed frame, and the frame may be megabytes.
        raise ProtocolError(f"{data.get('type')!s:.{TYPE_MAX}} reply: {where}: {first['msg']}"[:REASON_MAX],
                            request_id=request_id if isinstance(request_id, str) else None) from None


# What the SDKs put around an exception's messages in ``error_message``: Python's ``traceback.format_exc()`` after a
# context (``Exception encountered when resuming workflow(s) [...]: Traceback (most recent call last): ...``), and
# the lines that join chained exceptions. Stack frames and source lines are indented in Python, JavaScript and Java
# traces alike; the unindented lines are the messages.
TRACEBACK_HEADER = "Traceback (most recent call last):"
_CHAINING = ("During handling of the above exception", "The above exception was the direct cause")


def error_summary(error: str, limit: int = REASON_MAX) -> str:
    """An executor's ``error_message`` without its stack trace: the context and each exception's message, joined
    by ``; ``, at most ``limit`` characters (head and tail: the last message says what failed). What a REST
    problem quotes; the whole message is for the gateway's log."""
    lines = []
    for line in error.splitlines():
        if not line.strip() or line[0].isspace() or line.startswith(_CHAINING):
            continue
        line = line.replace(TRACEBACK_HEADER, "").rstrip().removesuffix(":").rstrip()
        if line:
            lines.append(line)
    return clip("; ".join(lines) or error.strip() or "no message", limit)


def clip(text: str, limit: int = REASON_MAX) -> str:
    """Head and tail of a long message, at most ``limit`` characters: an error's last words say what failed."""
    if len(text) <= limit:
        return text
    half = (limit - 3) // 2
    return f"{text[:half]} … {text[-half:]}"


def management_request(kind: str, request_id: str, fields: dict[str, Any]) -> str:
    """An operator's request (``list_workflows``, ``cancel``, ...): its fields as the REST layer built them."""
    return json.dumps({**fields, "type": kind, "request_id": request_id})


def executor_info_request(request_id: str) -> str:
    return json.dumps({"type": "executor_info", "request_id": request_id})


def recovery_request(request_id: str, executor_ids: list[str]) -> str:
    return json.dumps({"type": "recovery", "request_id": request_id, "executor_ids": executor_ids})


def exist_pending_workflows_request(request_id: str, executor_id: str, application_version: str) -> str:
    return json.dumps({"type": "exist_pending_workflows", "request_id": request_id,
                       "executor_id": executor_id, "application_version": application_version})


def retention_body(*, gc_cutoff: datetime | None, gc_rows_threshold: int | None, gc_batch_size: int | None,
                   timeout_cutoff: datetime | None) -> dict[str, int | None]:
    """The ``retention`` body: instants become epoch milliseconds here, and only here.

    A non-positive ``gc_rows_threshold`` becomes null: the SDKs turn 0 into ``OFFSET -1``, an error on
    PostgreSQL. A non-positive ``gc_batch_size`` becomes null too (the SDK then uses its own default) rather
    than the ``ValueError`` the Python SDK raises for it.
    """
    return {
        "gc_cutoff_epoch_ms": None if gc_cutoff is None else units.datetime_to_epoch_ms(gc_cutoff),
        "gc_rows_threshold": gc_rows_threshold if gc_rows_threshold is not None and gc_rows_threshold > 0 else None,
        "gc_batch_size": gc_batch_size if gc_batch_size is not None and gc_batch_size > 0 else None,
        "timeout_cutoff_epoch_ms": None if timeout_cutoff is None else units.datetime_to_epoch_ms(timeout_cutoff),
    }


def retention_request(request_id: str, *, gc_cutoff: datetime | None, gc_rows_threshold: int | None,
                      gc_batch_size: int | None, timeout_cutoff: datetime | None) -> str:
    body = retention_body(gc_cutoff=gc_cutoff, gc_rows_threshold=gc_rows_threshold, gc_batch_size=gc_batch_size,
                          timeout_cutoff=timeout_cutoff)
    return json.dumps({"type": "retention", "request_id": request_id, "body": body})
