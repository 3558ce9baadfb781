"""Every activity's way to the database, and Relay's one way of living through a database outage.

A store call runs in the store's thread (``Store.call``; ``first`` ahead of the others waiting for SQLite). A
database that is away (``core.store.unavailable``: stopped, restarting, locked) fails the attempt with a short,
retryable ``DatabaseUnavailable`` error, BENIGN, so the SDK logs it at DEBUG rather than a traceback per attempt per
workflow: the workflow retries the activity until the database is back, and each write lands once by its event key,
so nothing is lost or doubled. The worker logs one line when an outage starts (and every ``OUTAGE_LOG_EVERY`` while
it lasts) and one when it ends, whichever activity met it: one ``DatabaseCalls`` per store.
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import ParamSpec, TypeVar

from sqlalchemy.exc import SQLAlchemyError
from temporalio.exceptions import ApplicationError, ApplicationErrorCategory

from core.logs import OncePerWindow
from core.store import Store, outage, unavailable

log = logging.getLogger("relay.worker")
P = ParamSpec("P")
T = TypeVar("T")
# The failure type of an attempt that found the database away; retried like any failure (never non-retryable).
DATABASE_UNAVAILABLE = "DatabaseUnavailable"
# While the database is away, say so in the log at most this often (every workflow's activity retries meanwhile).
OUTAGE_LOG_EVERY = timedelta(seconds=30)


class DatabaseCalls:
    """Store calls for activities, one outage report for all of them (``database_calls``)."""

    def __init__(self, store: Store) -> None:
        self._store = store
        self._down_since: float | None = None  # monotonic time of the first failure of the current outage
        self._reports = OncePerWindow(OUTAGE_LOG_EVERY)

    async def __call__(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._guarded(self._store.call(fn, *args, **kwargs))

    async def first(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """A call ahead of the others waiting for SQLite (``Store.call_first``): what decides a status."""
        return await self._guarded(self._store.call_first(fn, *args, **kwargs))

    async def _guarded(self, call: Awaitable[T]) -> T:
        try:
            result = await call
        except SQLAlchemyError as err:
            if not unavailable(err):
                raise  # a bug, or a duplicate written by an earlier attempt still running: retried all the same
            self._report_down(err)
            raise ApplicationError(f"database unavailable: {outage(err)}", type=DATABASE_UNAVAILABLE,
                                   category=ApplicationErrorCategory.BENIGN) from None
        if self._down_since is not None:
            log.warning("database reachable again after %.1f s; retried activities go on",
                        time.monotonic() - self._down_since)
            self._down_since = None
            self._reports.forget()
        return result

    def _report_down(self, err: SQLAlchemyError) -> None:
        if self._down_since is None:
            self._down_since = time.monotonic()
        if self._reports.due():
            log.warning("database unavailable for %.1f s, database activities retrying: %s",
                        time.monotonic() - self._down_since, outage(err))


_calls: weakref.WeakKeyDictionary[Store, DatabaseCalls] = weakref.WeakKeyDictionary()


def database_calls(store: Store) -> DatabaseCalls:
    """The one ``DatabaseCalls`` of ``store``, shared by every activity class of the worker."""
    calls = _calls.get(store)
    if calls is None:
        calls = _calls[store] = DatabaseCalls(store)
    return calls
