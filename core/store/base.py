"""What every part of the store shares: the engine, SQLite's one thread, the one app lookup and the one key check,
how a database error reads (``unavailable``, ``outage``), and how a row meant to exist once per key is written
(``InsertOnce``).

One ``Store`` wraps one engine. Methods are synchronous (SQLAlchemy); async callers run them through ``call``.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import hashlib
import hmac
import itertools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar

from sqlalchemy import Connection, Engine, Executable, bindparam, text
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlmodel import Session, SQLModel, select

from core.errors import AuthError, ForbiddenError, NotFoundError
from core.models import ApiKey, Application

if TYPE_CHECKING:
    from core.gateways import GatewayRegistry

KEY_PREFIX = "dbos_"
P = ParamSpec("P")
T = TypeVar("T")
M = TypeVar("M", bound=SQLModel)


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def unavailable(err: BaseException) -> bool:
    """Whether ``err`` means the database is away for now (stopped, restarting, unreachable, locked) rather than a
    bug: the same call may succeed later, so a request gets 503 and an activity is retried.

    Both drivers raise ``OperationalError`` for these (sqlite3: "database is locked"; psycopg: connection refused,
    "terminating connection due to administrator command", "the database system is starting up"); a connection
    that died under another DBAPI error is flagged ``connection_invalidated``; a pool with every connection stuck
    raises ``sqlalchemy.exc.TimeoutError``.
    """
    if isinstance(err, OperationalError | PoolTimeoutError):
        return True
    return isinstance(err, DBAPIError) and err.connection_invalidated


def outage(err: BaseException) -> str:
    """One short line about a database error, for a log line or a retried activity's failure: the driver's own
    message, without SQLAlchemy's SQL, parameters and background link (a PostgreSQL outage repeats it a lot)."""
    lines = str(getattr(err, "orig", None) or err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0][:200] if lines else ''}"


@dataclass(frozen=True)
class Principal:
    """Who a valid key speaks for."""

    key_id: str
    key_name: str
    org: str
    apps: tuple[str, ...] | None

    def allows(self, app: str) -> bool:
        return self.apps is None or app in self.apps

    def require(self, app: str) -> None:
        """403 for a key not allowed for ``app``."""
        if not self.allows(app):
            raise ForbiddenError(f"this key is not allowed for app {app!r}")


# Statements of the hot path (every REST call about an app, every management request), built once: SQLAlchemy
# spends more building and caching a statement than SQLite spends running it.
_KEY_BY_HASH = select(ApiKey).where(ApiKey.key_hash == bindparam("key_hash"))
_APP_BY_NAME = select(Application).where(Application.org == bindparam("org"), Application.name == bindparam("name"))


def check_key(c: Connection, key: str) -> Principal:
    """The one key check: who ``key`` speaks for; 401 for an unknown or revoked key."""
    digest = hash_key(key)
    row = c.execute(_KEY_BY_HASH, {"key_hash": digest}).first()
    # The lookup is by hash; compare again in constant time so a partial index match leaks nothing.
    if row is None or row.revoked_at is not None or not hmac.compare_digest(row.key_hash, digest):
        raise AuthError("unknown or revoked API key")
    return Principal(row.id, row.name, row.org, tuple(row.apps) if row.apps else None)


def find_app(db: Session | Connection, org: str, name: str) -> Application | None:
    """The one app lookup, by name. In a session, the session's object (to change or delete); on a bare connection
    (the hot path: no ORM session), one built from the plain row."""
    params = {"org": org, "name": name}
    if isinstance(db, Session):
        return db.exec(_APP_BY_NAME, params=params).first()
    row = db.execute(_APP_BY_NAME, params).first()
    return None if row is None else Application.model_validate(row._mapping)


def app_row(db: Session | Connection, org: str, name: str) -> Application:
    """``find_app``; 404 for an unknown app."""
    row = find_app(db, org, name)
    if row is None:
        raise NotFoundError(f"application {name!r} not found in org {org!r}")
    return row


class InsertOnce(Generic[M]):
    """``INSERT ... ON CONFLICT (key) DO NOTHING`` into one table, built once for each database Relay runs on: how
    the store writes every row meant to exist once per key, never a check for the row followed by an insert.

    A check then an insert, in READ COMMITTED transactions, lets two writers both miss each other's row: on PostgreSQL
    each may read before the other commits (a gateway's ``record_disconnect`` and its workflow's ``begin_grace`` met
    so in a drain: ``UniqueViolation`` on ``auditlog_event_key_key``), and on SQLite too, whose driver (pysqlite)
    begins the transaction at its first write, after the check. An insert that does nothing on a conflict decides it
    atomically: a PostgreSQL writer whose key another transaction has inserted but not committed waits for that one on
    the unique index, then does nothing, and the row is visible to its next statement (each takes a new snapshot); on
    SQLite the insert, even one that does nothing, takes the database's write lock. Nor does a lost race abort the
    transaction and log an ERROR on the server, as a failed insert caught as ``IntegrityError`` did."""

    def __init__(self, model: type[M], *key: str) -> None:
        self.model, self.key = model, key
        # ``preserve_rowcount``: SQLAlchemy keeps the driver's rowcount of an UPDATE or DELETE only (psycopg's
        # INSERT reads -1 without it), and the rowcount is what says whether this insert did anything.
        self._statements: dict[str, Executable] = {
            "postgresql": postgresql_insert(model).on_conflict_do_nothing(index_elements=list(key))
            .execution_options(preserve_rowcount=True),
            "sqlite": sqlite_insert(model).on_conflict_do_nothing(index_elements=list(key))
            .execution_options(preserve_rowcount=True),
        }

    def __call__(self, c: Connection, row: M | dict[str, Any]) -> bool:
        """Insert ``row`` (a model, or its columns) unless a row of its key is there; whether this call inserted it."""
        values = row.model_dump() if isinstance(row, SQLModel) else row
        inserted = c.execute(self._statements[c.dialect.name], values).rowcount
        if inserted not in (0, 1):  # -1, a driver that does not count: never read as "landed already"
            raise RuntimeError(f"{c.dialect.name}'s driver counted {inserted} rows inserted into {self.model.__name__}")
        return inserted == 1

    def lock(self, s: Session, row: M) -> M:
        """The stored row of ``row``'s key (``key`` is the primary key, in order), ``row`` inserted first if there was
        none, locked for the session's transaction: the insert takes SQLite's write lock, the ``SELECT ... FOR
        UPDATE`` PostgreSQL's row lock, before anything else is read. Two writers creating the row at once both get
        it, one after the other."""
        ident = tuple(getattr(row, name) for name in self.key)
        for _ in range(3):  # the row may be deleted between the two statements (its app deleted): insert it again
            self(s.connection(), row)
            locked = s.get(self.model, ident, with_for_update=True)
            if locked is not None:
                return locked
        raise RuntimeError(f"could not lock the {self.model.__name__} row {ident}")

    def put(self, s: Session, row: M) -> M:
        """``row`` stored whether or not one of its key was there (replacing that one's columns), under ``lock``."""
        stored = self.lock(s, row)
        for name in type(row).model_fields:
            setattr(stored, name, getattr(row, name))
        s.add(stored)
        return stored


class _SerialThread:
    """One thread that runs what it is given one call at a time, in order, except that a call submitted ``first``
    goes ahead of every call not ``first`` still waiting. Started on first use; a daemon (it holds no state)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._queue: queue.PriorityQueue[tuple[int, int, Callable[[], Any], Future[Any]]] = queue.PriorityQueue()
        self._order = itertools.count()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, work: Callable[[], T], *, first: bool = False) -> Future[T]:
        future: Future[T] = Future()
        self._queue.put((0 if first else 1, next(self._order), work, future))
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
        return future

    def _run(self) -> None:
        while True:
            _, _, work, future = self._queue.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(work())
            except BaseException as err:  # handed to the caller, as a ThreadPoolExecutor does
                future.set_exception(err)


# A database that does not answer a SELECT 1 within this long counts as unreachable for readiness.
READY_DB_TIMEOUT = timedelta(seconds=2)


class StoreBase:
    """The engine and how async callers reach it; each part of ``Store`` (a mixin per concern) builds on this."""

    gateways: GatewayRegistry

    def __init__(self, engine: Engine) -> None:
        # Imported here, not above: ``core.gateways`` writes its rows through ``InsertOnce``, from this module.
        from core.gateways import GatewayRegistry

        self.engine = engine
        self.gateways = GatewayRegistry(engine)
        # SQLite has one writer: calls from many threads at once only contend for its lock, each loser sleeping in
        # SQLite's busy handler (a burst of 100 deaths: 6 threads took longer than 1, with a p99 of 0.9 s per
        # death instead of 72 ms). So async callers of a SQLite store go through one thread; PostgreSQL's through
        # the event loop's pool.
        self._serial = _SerialThread("relay-sqlite") if engine.dialect.name == "sqlite" else None

    async def call(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """Run ``fn`` (one of this store's methods) off the event loop: what every async caller does."""
        return await self._call(False, functools.partial(fn, *args, **kwargs))

    async def call_first(self, fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
        """``call``, ahead of every ``call`` waiting for SQLite's thread: for the writes and reads that decide an
        executor's status (DISCONNECTED, DEAD), which a burst of deaths would otherwise queue behind the
        recoveries of the deaths before them."""
        return await self._call(True, functools.partial(fn, *args, **kwargs))

    async def _call(self, first: bool, work: Callable[[], T]) -> T:
        if self._serial is None:
            return await asyncio.to_thread(work)
        return await asyncio.wrap_future(self._serial.submit(functools.partial(contextvars.copy_context().run, work),
                                                             first=first))

    def ping(self) -> None:
        """One round trip (``SELECT 1``) on a pooled connection; raises while the database is unreachable (see
        ``unavailable``). The pool's pre-ping replaces a connection that a restarted server dropped."""
        with self.engine.connect() as c:
            c.execute(text("SELECT 1"))

    async def unreachable(self) -> str | None:
        """Why the database counts as unreachable for readiness (``ping`` failed, or no answer within
        ``READY_DB_TIMEOUT``), or None when it answers: the gateway's ``/readyz`` and the worker's ask the same."""
        try:
            await asyncio.wait_for(asyncio.to_thread(self.ping), READY_DB_TIMEOUT.total_seconds())
        except Exception as err:  # any failure to answer is "not ready", with the driver's one-line reason
            return f"database unreachable ({outage(err) if not isinstance(err, TimeoutError) else 'no answer'})"
        return None
