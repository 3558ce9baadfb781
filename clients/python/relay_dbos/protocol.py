"""The conductor protocol as an executor speaks it, with no socket in it: a frame in, the reply frame out.

Relay speaks first and the executor only answers: every request carries ``type`` and ``request_id``, and its reply
carries the same two, the fields of that type, and ``error_message`` (null when all went well). The field names are
those of the conductor client built into dbos 3.2.0, so Relay reads this client's replies as it reads that one's.

How a request can fail, and what the reply then says:

- the frame is not a JSON object, or lacks ``type`` or ``request_id``: an error reply with whatever could be read
  (Relay logs a reply it cannot match; nothing here raises);
- a required field is missing or of the wrong type: ``error_message`` names it (dbos 3.2.0 closed the socket);
- the operation raised: ``error_message`` holds the context and the traceback, as dbos 3.2.0 sends it (only the
  exception's type in metadata-only mode);
- the SDK release cannot do it (``Unsupported``): ``error_message`` says so and ``unsupported`` is true, which Relay
  answers with a 501 naming the operation, not a 502 that blames the executor;
- an unknown ``type``: ``"Unknown message type"``, as every SDK answers it.
"""

from __future__ import annotations

import json
import logging
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

log = logging.getLogger("relay_dbos")

T = TypeVar("T")

# Requests that move an application's data rather than its metadata: refused in metadata-only mode, as dbos 3.2.0
# refuses them (Relay answers the refusal with a 409).
DATA_TYPES = frozenset({"get_workflow_events", "get_workflow_notifications", "get_workflow_streams",
                        "export_workflow", "import_workflow"})
UNKNOWN_TYPE = "Unknown message type"


class BadRequest(Exception):
    """A request this client cannot act on: a required field missing or of the wrong type."""


class Unsupported(Exception):
    """An operation this SDK release cannot do through its public API (it moved out of the MIT package): the reply
    says so with ``unsupported: true``."""


@dataclass(frozen=True)
class Request:
    """One request from Relay: its ``type``, ``request_id`` and every other field as sent."""

    kind: str  # its ``type``
    request_id: str
    fields: Mapping[str, Any] = field(default_factory=dict)

    def get(self, name: str, kind: type[T] | tuple[type, ...], default: Any = None) -> Any:
        """An optional field: ``default`` when absent or null, ``BadRequest`` when of another type."""
        value = self.fields.get(name)
        if value is None:
            return default
        return _typed(self.kind, name, value, kind)

    def require(self, name: str, kind: type[T] | tuple[type, ...]) -> Any:
        value = self.fields.get(name)
        if value is None:
            raise BadRequest(f"{self.kind} request: field {name!r} is required")
        return _typed(self.kind, name, value, kind)

    def body(self, *, required: bool = True) -> Request:
        """The request's ``body`` object as a ``Request`` of the same type, so its fields are read the same way."""
        value = self.fields.get("body")
        if value is None and not required:
            return Request(self.kind, self.request_id, {})
        if not isinstance(value, dict):
            raise BadRequest(f"{self.kind} request: field 'body' must be an object")
        return Request(self.kind, self.request_id, value)


def _typed(kind_of: str, name: str, value: Any, kind: type[T] | tuple[type, ...]) -> Any:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    # JSON has no int/bool distinction Python would respect: True is an int to isinstance.
    if isinstance(value, bool) and bool not in kinds:
        raise BadRequest(f"{kind_of} request: field {name!r} must be {_names(kinds)}, not a boolean")
    if not isinstance(value, kinds):
        raise BadRequest(f"{kind_of} request: field {name!r} must be {_names(kinds)}, not {type(value).__name__}")
    return value


def _names(kinds: tuple[type, ...]) -> str:
    return " or ".join({str: "a string", int: "an integer", bool: "a boolean", list: "a list", dict: "an object",
                        float: "a number"}.get(k, k.__name__) for k in kinds)


Handler = Callable[[Request], dict[str, Any]]


@dataclass(frozen=True)
class Operation:
    """How one request type is answered: ``handler`` returns the reply's fields; ``failed`` are the fields of a
    reply whose request failed (``success: false``, an empty list, ...), as dbos 3.2.0 sends them."""

    handler: Handler
    failed: Mapping[str, Any]
    context: str  # what an error message says was being done


def decode(frame: str | bytes) -> Request:
    """The request in a frame; ``BadRequest`` (with whatever ``type`` and ``request_id`` could be read in its
    ``args[1:]``) when it is not one."""
    try:
        data = json.loads(frame)
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise BadRequest(f"malformed message: not JSON ({type(err).__name__})", "", "") from None
    if not isinstance(data, dict):
        raise BadRequest("malformed message: not a JSON object", "", "")
    kind, request_id = data.get("type"), data.get("request_id")
    if not isinstance(kind, str) or not isinstance(request_id, str):
        raise BadRequest("malformed message: 'type' and 'request_id' must be strings",
                         kind if isinstance(kind, str) else "", request_id if isinstance(request_id, str) else "")
    return Request(kind, request_id, data)


def encode(kind: str, request_id: str, fields: Mapping[str, Any], error: str | None = None,
           *, unsupported: bool = False) -> str:
    reply: dict[str, Any] = {"type": kind, "request_id": request_id, **fields, "error_message": error}
    if unsupported:
        reply["unsupported"] = True
    # default=str: a value the SDK hands back that JSON has no type for (a datetime in a schedule) goes as text.
    return json.dumps(reply, default=str)


def handle(frame: str | bytes, operations: Mapping[str, Operation], *, metadata_only: bool = False) -> str:
    """The reply to one frame. Never raises: whatever went wrong is in the reply's ``error_message``."""
    try:
        request = decode(frame)
    except BadRequest as err:
        message, kind, request_id = err.args
        log.warning("relay-dbos: %s", message)
        return encode(kind, request_id, {}, message)
    operation = operations.get(request.kind)
    if operation is None:
        log.warning("relay-dbos: unexpected message type %.40r", request.kind)
        return encode(request.kind, request.request_id, {}, UNKNOWN_TYPE)
    if metadata_only and request.kind in DATA_TYPES:
        return encode(request.kind, request.request_id, operation.failed,
                      f"{request.kind} is not allowed in conductor metadata-only mode")
    try:
        return encode(request.kind, request.request_id, operation.handler(request))
    except BadRequest as err:
        log.warning("relay-dbos: %s", err)
        return encode(request.kind, request.request_id, operation.failed, str(err))
    except Unsupported as err:
        return encode(request.kind, request.request_id, operation.failed, str(err), unsupported=True)
    except Exception as err:
        log.error("relay-dbos: %s", operation.context, exc_info=True)
        if metadata_only:
            error = f"{operation.context}: {type(err).__name__} (details withheld in metadata-only mode)"
        else:
            error = f"{operation.context}: {traceback.format_exc()}"
        return encode(request.kind, request.request_id, operation.failed, error)
