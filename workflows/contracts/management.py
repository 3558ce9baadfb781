"""The contract of a management request routed to another gateway process: ``ManagementRequestWorkflow`` runs on
the task queue of the gateway that holds the executor's socket, and its one (local) activity, ``executor_request``
(implemented in ``gateway.activities``), sends the request there and returns the reply.

The reply travels compressed (zlib, then base64): Temporal refuses payloads over 2 MB, and a page of workflows
compresses several times over.
"""

# No ``from __future__ import annotations``: a contract's annotations are types, not names (the package's docstring).
import base64
import json
import zlib
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Any

from temporalio import activity

from workflows.contracts.common import STUB, Activity

MANAGEMENT_WORKFLOW_PREFIX = "relay-management-"


def management_workflow_id(request_id: str) -> str:
    return MANAGEMENT_WORKFLOW_PREFIX + request_id


class Failure(StrEnum):
    UNAVAILABLE = "unavailable"  # no socket for the executor there (any more): never sent
    TIMEOUT = "timeout"  # sent, no reply in time
    BROKEN = "broken"  # the reply broke the protocol, or the socket closed while it was due


@dataclass(frozen=True)
class ExecutorRequestInput:
    org: str
    app: str
    executor_id: str
    request_id: str
    frame: str  # the whole request frame, as the executor receives it
    timeout: timedelta


@dataclass(frozen=True)
class ExecutorRequestReply:
    """The executor's reply frame (zlib-compressed JSON, base64), or why there is none."""

    reply_z: str = ""
    failure: Failure | None = None
    detail: str = ""


def pack(body: dict[str, Any]) -> str:
    """A reply for a Temporal payload: JSON, zlib, base64."""
    return base64.b64encode(zlib.compress(json.dumps(body, separators=(",", ":")).encode(), 6)).decode()


def unpack(packed: str) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(zlib.decompress(base64.b64decode(packed)))
    return body


def latest_version(body: dict[str, Any]) -> str | None:
    """The latest application version in a ``list_application_versions`` reply, as the SDK defines it (the newest
    ``version_timestamp``); None when it lists none."""
    output = body.get("output")
    versions = [v for v in output if isinstance(v, dict)] if isinstance(output, list) else []
    if not versions:
        return None
    latest = max(versions, key=lambda v: (int(v.get("version_timestamp") or 0), str(v.get("version_name"))))
    name = latest.get("version_name")
    return name if isinstance(name, str) else None


@activity.defn(name=Activity.EXECUTOR_REQUEST)
async def executor_request(input: ExecutorRequestInput) -> ExecutorRequestReply:
    """Send the frame to the executor over the socket this gateway holds; wait for its reply."""
    raise NotImplementedError(STUB)
