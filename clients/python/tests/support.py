"""Helpers of the client's tests: polling with a deadline, requests through ``protocol.handle``, direct writes to the
SQLite system database."""

from __future__ import annotations

import json
import sqlite3
import time
import uuid
from collections.abc import Callable, Mapping
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from relay_dbos.protocol import Operation, handle

T = TypeVar("T")

CLIENT_DIR = Path(__file__).resolve().parent.parent  # clients/python


def wait_until(probe: Callable[[], T | None], *, timeout: float = 10.0, interval: float = 0.01,
               what: str = "the condition") -> T:
    """``probe()``'s first truthy value, polled until ``timeout`` s have passed (then ``AssertionError``)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout} s (last: {value!r})")
        time.sleep(interval)


@dataclass
class Asker:
    """Sends requests through ``protocol.handle`` with a table of operations, as the socket thread does."""

    table: Mapping[str, Operation]
    metadata_only: bool = False
    alerts: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)

    def raw(self, frame: str | bytes) -> dict[str, Any]:
        reply = json.loads(handle(frame, self.table, metadata_only=self.metadata_only))
        assert isinstance(reply, dict)
        assert "error_message" in reply
        return reply

    def ask(self, kind: str, **fields: Any) -> dict[str, Any]:
        """The reply to a request of type ``kind``; its ``type`` and ``request_id`` are checked here."""
        request_id = str(uuid.uuid4())
        reply = self.raw(json.dumps({"type": kind, "request_id": request_id, **fields}))
        assert reply["type"] == kind
        assert reply["request_id"] == request_id
        return reply

    def ok(self, kind: str, **fields: Any) -> dict[str, Any]:
        """``ask``, and the reply must report no error."""
        reply = self.ask(kind, **fields)
        assert reply["error_message"] is None, reply["error_message"]
        return reply


def set_times(db: Path, workflow_id: str, **columns: int) -> None:
    """Overwrite epoch-ms columns (``created_at``, ``completed_at``) of one workflow's row, as an old workflow has
    them: the SDK stores them in ``workflow_status`` as integers."""
    assert columns and set(columns) <= {"created_at", "completed_at", "updated_at"}
    assignments = ", ".join(f"{name} = ?" for name in columns)
    with closing(sqlite3.connect(db, timeout=10)) as connection, connection:
        changed = connection.execute(f"UPDATE workflow_status SET {assignments} WHERE workflow_uuid = ?",
                                     (*columns.values(), workflow_id)).rowcount
    assert changed == 1, f"no row for workflow {workflow_id}"
