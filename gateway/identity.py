"""Limits on the identity an executor gives in its ``executor_info`` reply, checked at the handshake.

A value Temporal (or Relay's database) would refuse makes every signal and registry write for that executor
fail, however often it is retried, and the SDK reconnects with the same values every second. So it is refused
before anything is sent: close code 1008 with a reason that starts "permanent:", names the field and its limit,
and says the same values will fail again. Only sizes are reported, never the values (they can be megabytes).
"""

from __future__ import annotations

import json
from collections.abc import Callable

from core import nesting, wire
from core.errors import IdentityError
from workflows.contracts.common import lifecycle_workflow_id

# Temporal's default limits (dynamic config ``limit.maxIDLength`` and ``limit.searchAttributesSizeOfValue``):
# the lifecycle workflow id is relay-executor/{org}/{app}/{executor_id}, and the executor id and the application
# version are also keyword search attributes (RelayExecutorId, RelayAppVersion).
WORKFLOW_ID_BYTES = 1000
SEARCH_ATTRIBUTE_BYTES = 2048
# Relay's own: a DNS name is at most 255 octets (RFC 1035 2.3.4); the language and SDK version are short names.
HOSTNAME_BYTES = 255
SHORT_TEXT_BYTES = 255
# The metadata travels in every `connected` signal (Temporal refuses a payload over 2 MB by default) and is kept
# in the workflow's state and the registry row: a generous bound far below that.
METADATA_BYTES = 64 * 1024


def check(org: str, app: str, info: wire.ExecutorInfoReply) -> None:
    """Raises ``IdentityError`` for the first field Temporal or the registry would refuse."""
    _text("executor_id", info.executor_id, WORKFLOW_ID_BYTES - len(lifecycle_workflow_id(org, app, "").encode()))
    _text("application_version", info.application_version, SEARCH_ATTRIBUTE_BYTES)
    _text("hostname", info.hostname, HOSTNAME_BYTES)
    _text("language", info.language, SHORT_TEXT_BYTES)
    _text("dbos_version", info.dbos_version, SHORT_TEXT_BYTES)
    if info.executor_metadata is not None:
        # Depth before size: a few KiB of brackets pass the size bound, then fail the `connected` signal's
        # serialization on every retry (the executor connected, never registered).
        if nesting.too_deep(info.executor_metadata):
            raise _invalid("executor_metadata", f"is nested deeper than {nesting.MAX_JSON_DEPTH} levels")
        try:
            size = len(json.dumps(info.executor_metadata, ensure_ascii=False).encode())
        except (UnicodeEncodeError, ValueError, RecursionError):  # "\ud800" in a value: the wire model allows it
            raise _invalid("executor_metadata", "is not encodable as UTF-8 JSON") from None
        if size > METADATA_BYTES:
            raise _too_long("executor_metadata", size, METADATA_BYTES)


def nested_too_deep() -> IdentityError:
    """The refusal of an ``executor_info`` reply nested too deep to parse at all (``NestingError``)."""
    return _invalid("executor_info", f"is nested too deep to parse (over {nesting.MAX_JSON_DEPTH} levels is refused)")


def checker(org: str, app: str) -> Callable[[wire.ExecutorInfoReply], None]:
    """``check`` for one app, as the session takes it."""
    return lambda info: check(org, app, info)


def _text(field: str, value: str | None, limit: int) -> None:
    if value is None:
        return
    size = len(value.encode())  # the wire model refuses text that is not valid UTF-8 (a lone "\ud800")
    if size > limit:
        raise _too_long(field, size, limit)
    if "\x00" in value:  # PostgreSQL text cannot hold NUL: the registry write would fail on every retry
        raise _invalid(field, "contains a NUL character")


def _too_long(field: str, size: int, limit: int) -> IdentityError:
    return IdentityError(f"permanent: {field} is {size} bytes, over the {limit}-byte limit; the same value will "
                         f"fail again", field=field)


def _invalid(field: str, problem: str) -> IdentityError:
    return IdentityError(f"permanent: {field} {problem}; the same value will fail again", field=field)
