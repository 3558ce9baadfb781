"""Relay's ``retention`` request on DBOS's public API: dbos 3.4 moved garbage collection and the global timeout out
of its MIT package, and both are sound as lists and bulk actions.

- Garbage collection: the application's finished workflows (SUCCESS, ERROR, CANCELLED,
  MAX_RECOVERY_ATTEMPTS_EXCEEDED) completed before ``gc_cutoff_epoch_ms`` are deleted with everything they hold
  (``DBOS.delete_workflows``), and so are those beyond the ``gc_rows_threshold`` newest, a batch of
  ``gc_batch_size`` ids at a time (at most ``DELETE_MAX``: one bulk delete is one statement with an id per
  parameter, and SQLite takes 32,766 at most).
- The global timeout: the application's PENDING, ENQUEUED and DELAYED workflows created at or before
  ``timeout_cutoff_epoch_ms`` are cancelled (``DBOS.cancel_workflows``), a batch at a time.

As dbos 3.2.0 did, a round runs on a thread of its own, so the request is answered at once ("started") and every
other request keeps being answered meanwhile; a request while a round runs is skipped, with a warning.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime, timedelta, timezone

from dbos import DBOS

log = logging.getLogger("relay_dbos")

FINISHED = ["SUCCESS", "ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED"]
ACTIVE = ["PENDING", "ENQUEUED", "DELAYED"]
DEFAULT_BATCH = 10_000
DELETE_MAX = 10_000
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def iso_at(epoch_ms: int, *, inclusive: bool) -> str:
    """The ISO text whose instant the SDK compares as ``<= epoch_ms`` (``inclusive``) or ``< epoch_ms``.

    The SDK reads a bound back as ``int(fromisoformat(text).timestamp() * 1000)``: a float, one part in 1e16 off
    either way. Half a millisecond inside the wanted integer keeps that reading exact.
    """
    half = timedelta(microseconds=500)
    at = _EPOCH + timedelta(milliseconds=epoch_ms) + (half if inclusive else -half)
    return at.isoformat()


def _ids(statuses: list[str], limit: int, **filters: object) -> list[str]:
    found = DBOS.list_workflows(status=statuses, limit=limit, load_input=False, load_output=False,
                                **filters)  # type: ignore[arg-type]
    return [w.workflow_id for w in found]


def drain(batch: Callable[[], list[str]], act: Callable[[list[str]], None], size: int) -> int:
    """Act on ``batch()`` until it returns fewer than ``size`` ids; how many were acted on. A batch that repeats
    the last one's ids (the action took nothing away) ends the round rather than looping."""
    total, last = 0, None
    while True:
        ids = batch()
        if not ids or ids == last:
            return total
        act(ids)
        total += len(ids)
        if len(ids) < size:
            return total
        last = ids


class Retention:
    """Rounds of retention, one at a time per process."""

    def __init__(self, *, stopping: threading.Event) -> None:
        self.stopping = stopping
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self, *, gc_cutoff_epoch_ms: int | None, gc_rows_threshold: int | None, gc_batch_size: int | None,
              timeout_cutoff_epoch_ms: int | None) -> bool:
        """Start a round in the background; False (and a warning) when the previous one still runs."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                log.warning("Skipping retention: the previous round on this executor is still running.")
                return False
            self._thread = threading.Thread(
                target=self._run, name="relay-dbos-retention", daemon=True,
                args=(gc_cutoff_epoch_ms, gc_rows_threshold, gc_batch_size, timeout_cutoff_epoch_ms))
            self._thread.start()
            return True

    def join(self, timeout: timedelta) -> None:
        thread = self._thread
        if thread is not None:
            thread.join(timeout.total_seconds())

    def _run(self, gc_cutoff_epoch_ms: int | None, gc_rows_threshold: int | None, gc_batch_size: int | None,
             timeout_cutoff_epoch_ms: int | None) -> None:
        try:
            run_round(gc_cutoff_epoch_ms=gc_cutoff_epoch_ms, gc_rows_threshold=gc_rows_threshold,
                      gc_batch_size=gc_batch_size, timeout_cutoff_epoch_ms=timeout_cutoff_epoch_ms)
        except Exception:
            if self.stopping.is_set():  # the process is shutting down: the next round takes up the work
                log.debug("Retention interrupted by shutdown")
                return
            log.exception("Exception encountered during enforcing retention policy")


def run_round(*, gc_cutoff_epoch_ms: int | None, gc_rows_threshold: int | None, gc_batch_size: int | None,
              timeout_cutoff_epoch_ms: int | None) -> tuple[int, int]:
    """One round, in the calling thread: (workflows deleted, workflows cancelled)."""
    size = min(gc_batch_size if gc_batch_size is not None and gc_batch_size > 0 else DEFAULT_BATCH, DELETE_MAX)
    deleted = 0
    if gc_cutoff_epoch_ms is not None:
        before = iso_at(gc_cutoff_epoch_ms, inclusive=False)
        deleted += drain(lambda: _ids(FINISHED, size, completed_before=before), DBOS.delete_workflows, size)
    # A threshold of 0 or less keeps nothing by that rule: it is no rule (dbos 3.2.0 turned 0 into an error).
    if gc_rows_threshold is not None and gc_rows_threshold > 0:
        keep = gc_rows_threshold
        deleted += drain(lambda: _ids(FINISHED, size, sort_desc=True, offset=keep), DBOS.delete_workflows, size)
    cancelled = 0
    if timeout_cutoff_epoch_ms is not None:
        until = iso_at(timeout_cutoff_epoch_ms, inclusive=True)
        cancelled = drain(lambda: _ids(ACTIVE, size, end_time=until), DBOS.cancel_workflows, size)
    if deleted or cancelled:
        log.info("Retention: %d finished workflows deleted, %d timed out (cancelled)", deleted, cancelled)
    return deleted, cancelled
