"""All database access: keys, applications, the executor registry and the audit log.

One ``Store`` wraps one engine. Methods are synchronous (SQLAlchemy); async callers run them in a thread.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import hashlib
import hmac
import itertools
import queue
import secrets
import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import Connection, Engine, bindparam, exists, func, text, update
from sqlalchemy import delete as sa_delete
from sqlalchemy import select as sa_select
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlmodel import Session, and_, col, or_, select

from core import candidates, gate, units
from core.errors import AuthError, ConflictError, ForbiddenError, NotFoundError
from core.gateways import GatewayRegistry
from core.models import (
    AlertingRule,
    AlertWatermark,
    ApiKey,
    Application,
    AuditLog,
    Executor,
    ExecutorDrain,
    RecoveryClaim,
    RecoveryGate,
    RecoveryPause,
    RecoveryTicket,
    RetentionState,
    utcnow,
)
from workflows.contracts.common import ExecutorInfo, ExecutorStatus

KEY_PREFIX = "dbos_"
P = ParamSpec("P")
T = TypeVar("T")


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


@dataclass(frozen=True)
class StatusWritten:
    """What ``Store.record_status`` did: whether this call wrote the event (False: an earlier try of the same
    activity had), and, for a HEALTHY write, the ids of the app's DEAD executors."""

    written: bool
    dead: list[str]


@dataclass(frozen=True)
class Candidates:
    """Executors a management request may go to: the app's routable HEALTHY ones, and the ids of those busy."""

    executors: list[Executor]
    busy: set[str]


@dataclass(frozen=True)
class BlockedRecovery:
    """A DEAD executor whose recovery waits for a peer: the last recovery step its lifecycle recorded since it died
    is ``executor.recovery.blocked`` (no HEALTHY, undrained executor of its version)."""

    executor_id: str
    app_version: str
    died_at: datetime
    blocked_at: datetime
    reason: str


@dataclass(frozen=True)
class AppAccess:
    """A key's access to one registered app, and (when asked for) the app's management candidates then."""

    principal: Principal
    app: Application
    candidates: Candidates | None = None


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


class Store:
    def __init__(self, engine: Engine) -> None:
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

    # -- keys ----------------------------------------------------------------------------------------------

    def create_key(self, *, org: str, name: str, apps: list[str] | None = None) -> str:
        """Create a key and return it; only its hash is stored."""
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        with Session(self.engine) as s:
            s.add(ApiKey(org=org, name=name, key_hash=hash_key(key), apps=apps or None))
            s.commit()
        return key

    def authenticate(self, key: str) -> Principal:
        digest = hash_key(key)
        with Session(self.engine) as s:
            row = s.exec(select(ApiKey).where(ApiKey.key_hash == digest)).first()
        # The lookup is by hash; compare again in constant time so a partial index match leaks nothing.
        if row is None or row.revoked_at is not None or not hmac.compare_digest(row.key_hash, digest):
            raise AuthError("unknown or revoked API key")
        return Principal(row.id, row.name, row.org, tuple(row.apps) if row.apps else None)

    def live_key_hashes(self) -> frozenset[str]:
        """The hashes of every key not revoked: what a gateway refuses unknown keys against without a database
        trip each (refreshed by its revocation watcher, twice a second)."""
        with self.engine.connect() as c:
            return frozenset(c.execute(select(ApiKey.key_hash).where(col(ApiKey.revoked_at).is_(None))).scalars())

    # -- applications --------------------------------------------------------------------------------------

    def get_app(self, org: str, name: str) -> Application:
        with Session(self.engine) as s:
            row = s.exec(select(Application).where(Application.org == org, Application.name == name)).first()
        if row is None:
            raise NotFoundError(f"application {name!r} not found in org {org!r}")
        return row

    def ensure_app(self, org: str, name: str, *, subject: str = "system", source_ip: str = "",
                   private_mode: bool | None = None) -> tuple[Application, bool]:
        """Return the app, registering it with defaults (audited) if it does not exist yet."""
        with Session(self.engine) as s:
            row = s.exec(select(Application).where(Application.org == org, Application.name == name)).first()
            if row is not None:
                return row, False
            app = Application(org=org, name=name, private_mode=bool(private_mode))
            s.add(app)
            s.add(AuditLog(org=org, app=name, operation="app.registered", subject=subject,
                           source_ip=source_ip, details={"app": name}))
            try:
                s.commit()
            except IntegrityError:  # registered concurrently by another connection
                s.rollback()
                return self.get_app(org, name), False
            s.refresh(app)
            return app, True

    def update_app(self, org: str, name: str, changes: dict[str, Any], *, subject: str,
                   source_ip: str = "") -> Application:
        with Session(self.engine) as s:
            app = s.exec(select(Application).where(Application.org == org, Application.name == name)).first()
            if app is None:
                raise NotFoundError(f"application {name!r} not found in org {org!r}")
            for field, value in changes.items():
                setattr(app, field, value)
            s.add(app)
            s.add(AuditLog(org=org, app=name, operation="app.updated", subject=subject, source_ip=source_ip,
                           details=units.app_settings_to_rest(changes)))
            s.commit()
            s.refresh(app)
            return app

    # -- executor registry (written on behalf of the lifecycle workflow) -----------------------------------

    def list_executors(self, org: str, app: str) -> list[Executor]:
        with Session(self.engine) as s:
            return list(s.exec(select(Executor).where(Executor.org == org, Executor.app == app)
                               .order_by(col(Executor.created_at))).all())

    def record_status(self, *, org: str, app: str, executor_id: str, status: ExecutorStatus, operation: str,
                      event_key: str, info: ExecutorInfo | None, connection_id: str | None,
                      gateway_queue: str | None, details: dict[str, Any]) -> StatusWritten:
        """Upsert the registry row and write its audit row, both at most once per ``event_key``; whether this call
        wrote them and, for a HEALTHY write, the ids of the app's DEAD executors (each one's workflow may be waiting
        for a peer)."""
        with Session(self.engine) as s:
            landed = s.exec(select(AuditLog.id).where(AuditLog.event_key == event_key)).first() is not None
            if not landed:  # else a retried activity: this event already landed
                now = utcnow()
                row = s.get(Executor, (org, app, executor_id))
                if row is None:
                    row = Executor(org=org, app=app, executor_id=executor_id, created_at=now)
                elif row.status == ExecutorStatus.DEAD and status == ExecutorStatus.HEALTHY:
                    _drop_waiting_ticket(s, org, app, executor_id)  # back before its recovery went: called off
                row.status = status
                row.updated_at = now
                if info is not None:
                    row.app_version = info.application_version
                    row.hostname = info.hostname
                    row.language = info.language
                    row.dbos_version = info.dbos_version
                    row.executor_metadata = info.executor_metadata
                if connection_id is not None:
                    row.connection_id = connection_id
                    row.gateway_queue = gateway_queue
                s.add(row)
                s.add(AuditLog(event_key=event_key, org=org, app=app, executor_id=executor_id,
                               operation=operation, details=details, emit_time=now))
                s.commit()
            if status != ExecutorStatus.HEALTHY:
                return StatusWritten(written=not landed, dead=[])
            return StatusWritten(written=not landed, dead=list(s.exec(select(Executor.executor_id).where(
                Executor.org == org, Executor.app == app, Executor.status == ExecutorStatus.DEAD)).all()))

    def dead_since(self, *, org: str, app: str, executor_id: str) -> datetime | None:
        """When the executor was recorded DEAD (its row's last write), or None when it is not DEAD."""
        with Session(self.engine) as s:
            row = s.get(Executor, (org, app, executor_id))
        return row.updated_at if row is not None and row.status == ExecutorStatus.DEAD else None

    def delete_executor(self, *, org: str, app: str, executor_id: str, event_key: str,
                        details: dict[str, Any]) -> None:
        with Session(self.engine) as s:
            if s.exec(select(AuditLog.id).where(AuditLog.event_key == event_key)).first() is not None:
                return
            row = s.get(Executor, (org, app, executor_id))
            if row is not None:
                s.delete(row)
            claim = s.get(RecoveryClaim, (org, app, executor_id))
            if claim is not None:
                s.delete(claim)
            s.add(AuditLog(event_key=event_key, org=org, app=app, executor_id=executor_id,
                           operation="executor.deleted", details=details))
            s.commit()

    def select_candidate(self, *, org: str, app: str, app_version: str, exclude: list[str],
                         dead_executor_id: str = "") -> tuple[Executor, bool] | None:
        """Claim a HEALTHY peer for ``dead_executor_id``'s recovery: ``(peer, cross_version)``, or None.

        The choice is ``candidates.select_candidate``'s; this loads what it reads and records the claim.
        Drained executors are never chosen. Recoveries the peers carried recently (the gate's tickets) break ties
        between equally busy peers, so paced recoveries, each chosen when none is in flight, still spread evenly.
        """
        with Session(self.engine) as s:
            application = s.exec(select(Application).where(Application.org == org, Application.name == app)).first()
            stale = utcnow() - MANAGEMENT_CLAIM_TTL
            conn = s.connection()  # plain rows, not the ORM's: building them costs more than the query
            claims = {c.dead_executor_id: c.candidate_id for c in conn.execute(_CLAIMS, {"org": org, "app": app})
                      if _live(c.dead_executor_id, c.claimed_at, stale)}
            carried = Counter(t.candidate_id for t in conn.execute(_TICKET_PEERS, {"org": org, "app": app})
                              if t.candidate_id and t.executor_id != dead_executor_id)
            # Most peers carry nothing: one of them, drawn at random in the database, is what the full choice
            # would pick (its least-busy tie). Only when every peer of the version is busy (or excluded) is every
            # eligible peer read and ranked: at 1,000 executors that read cost a burst of deaths 20 ms each.
            busy = {peer for dead, peer in claims.items() if dead != dead_executor_id} | set(carried) | set(exclude)
            idle = conn.execute(_IDLE_PEER, {"org": org, "app": app, "status": ExecutorStatus.HEALTHY,
                                             "now": utcnow(), "version": app_version, "busy": sorted(busy)}).first()
            found: tuple[Any, bool] | None = (idle, False) if idle is not None else None
            if found is None:
                healthy = conn.execute(_ELIGIBLE_PEERS, {"org": org, "app": app, "status": ExecutorStatus.HEALTHY,
                                                       "now": utcnow()}).all()
                found = candidates.select_candidate(
                    healthy, app_version=app_version, exclude=exclude,
                    cross_version_allowed=application is not None and application.cross_version_recovery,
                    claims=claims, dead_executor_id=dead_executor_id,
                    carried=carried,
                )
            if found is None:
                return None
            peer, cross = found
            row = s.get(Executor, (org, app, peer.executor_id))
            assert row is not None
            if dead_executor_id:
                s.merge(RecoveryClaim(org=org, app=app, dead_executor_id=dead_executor_id,
                                      candidate_id=row.executor_id, claimed_at=utcnow()))
                ticket = s.get(RecoveryTicket, (org, app, dead_executor_id))
                if ticket is not None:
                    ticket.candidate_id = row.executor_id
                    s.add(ticket)
                s.commit()
                s.refresh(row)
            return row, cross

    def management_candidates(self, org: str, app: str) -> Candidates:
        """The app's routable HEALTHY executors that are not drained, and the ids of those busy: a recovery or a
        slow operator's request is on them (claimed peers). Read on every management request."""
        with self.engine.connect() as c:
            return _candidates(c, org, app)

    def drained_executors(self, org: str, app: str) -> list[tuple[str, str]]:
        """``(executor_id, app_version)`` of the app's routable HEALTHY executors that a drain in force keeps from
        being chosen (to carry an operator's request, to recover a peer), by id: read only to say so when none is
        left to choose."""
        with self.engine.connect() as c:
            rows = c.execute(_DRAINED, {"org": org, "app": app, "status": ExecutorStatus.HEALTHY, "now": utcnow()})
            return [(row.executor_id, row.app_version) for row in rows]

    def blocked_recoveries(self, org: str, app: str) -> list[BlockedRecovery]:
        """The app's DEAD executors whose recovery is blocked for lack of a peer, as their lifecycle workflows
        recorded it: the last of their recovery steps audited since they died (the registry row's last write) is
        ``executor.recovery.blocked``. Oldest death first."""
        with Session(self.engine) as s:
            dead = {e.executor_id: e for e in s.exec(select(Executor).where(
                Executor.org == org, Executor.app == app, Executor.status == ExecutorStatus.DEAD)).all()}
            if not dead:
                return []
            steps = s.exec(select(AuditLog).where(  # the emit_time index: only rows since the oldest death
                AuditLog.org == org, AuditLog.app == app,
                col(AuditLog.emit_time) >= min(e.updated_at for e in dead.values()),
                col(AuditLog.operation).in_(RECOVERY_STEPS), col(AuditLog.executor_id).in_(list(dead)))
                .order_by(col(AuditLog.emit_time))).all()
        last: dict[str, AuditLog] = {}
        for row in steps:
            if row.executor_id is not None and row.emit_time >= dead[row.executor_id].updated_at:
                last[row.executor_id] = row
        blocked = [BlockedRecovery(executor_id=i, app_version=dead[i].app_version, died_at=dead[i].updated_at,
                                   blocked_at=row.emit_time, reason=str((row.details or {}).get("reason", "")))
                   for i, row in last.items() if row.operation == "executor.recovery.blocked"]
        return sorted(blocked, key=lambda b: b.died_at)

    def claim_for_management(self, *, org: str, app: str, executor_id: str, request_id: str) -> None:
        """An operator's request is taking a while on ``executor_id``: count it as work in flight there, so a
        recovery picks another peer while one is free (the SDKs answer one request at a time)."""
        with Session(self.engine) as s:
            s.merge(RecoveryClaim(org=org, app=app, dead_executor_id=MANAGEMENT_CLAIM + request_id,
                                  candidate_id=executor_id, claimed_at=utcnow()))
            s.commit()

    def release_management_claim(self, *, org: str, app: str, request_id: str) -> None:
        with Session(self.engine) as s:
            claim = s.get(RecoveryClaim, (org, app, MANAGEMENT_CLAIM + request_id))
            if claim is not None:
                s.delete(claim)
                s.commit()

    def executor_counts(self, org: str) -> Counter[tuple[str, str, str]]:
        """The org's registry rows counted by ``(org, app, status)``."""
        with Session(self.engine) as s:
            rows = s.exec(select(Executor.org, Executor.app, Executor.status).where(Executor.org == org)).all()
        return Counter((org, app, str(status)) for org, app, status in rows)

    def executors_on_gateway(self, gateway_queue: str) -> list[tuple[str, str, str, str]]:
        """``(org, app, executor_id, connection_id)`` of HEALTHY executors whose socket is on that gateway."""
        with Session(self.engine) as s:
            rows = s.exec(select(Executor).where(Executor.gateway_queue == gateway_queue,
                                                 Executor.status == ExecutorStatus.HEALTHY)).all()
        return [(r.org, r.app, r.executor_id, r.connection_id or "") for r in rows]

    def registry_on_gateway(self, gateway_queue: str) -> dict[tuple[str, str, str], tuple[ExecutorStatus, str]]:
        """``(org, app, executor_id) -> (status, connection_id)`` of every executor last placed on that gateway."""
        with Session(self.engine) as s:
            rows = s.exec(select(Executor).where(Executor.gateway_queue == gateway_queue)).all()
        return {(r.org, r.app, r.executor_id): (r.status, r.connection_id or "") for r in rows}

    def apps_with_healthy_executors(self) -> list[tuple[str, str]]:
        """``(org, app)`` of every app with a HEALTHY executor in the registry (the orphan sweep asks one of them)."""
        with Session(self.engine) as s:
            rows = s.exec(select(Executor.org, Executor.app).where(Executor.status == ExecutorStatus.HEALTHY)
                          .distinct().order_by(col(Executor.org), col(Executor.app))).all()
        return [(org, app) for org, app in rows]

    def registry_row(self, org: str, app: str, executor_id: str) -> Executor | None:
        with Session(self.engine) as s:
            return s.get(Executor, (org, app, executor_id))

    def registry_rows(self) -> list[tuple[str, str, str, ExecutorStatus, str]]:
        """``(org, app, executor_id, status, app_version)`` of every registry row (the reconciliation's scan)."""
        with self.engine.connect() as conn:
            rows = conn.execute(sa_select(col(Executor.org), col(Executor.app), col(Executor.executor_id),
                                          col(Executor.status), col(Executor.app_version))).all()
        return [(org, app, executor_id, ExecutorStatus(status), version)
                for org, app, executor_id, status, version in rows]

    def registered_executor_ids(self) -> set[str]:
        """Every executor id with a registry row, in any status, org and app (the orphan sweep leaves them alone)."""
        with Session(self.engine) as s:
            return set(s.exec(select(Executor.executor_id).distinct()).all())

    # -- audit ---------------------------------------------------------------------------------------------

    def write_audit(self, *, org: str, operation: str, app: str | None = None, executor_id: str | None = None,
                    status: str = "success", subject: str = "system", source_ip: str = "",
                    details: dict[str, Any] | None = None, event_key: str | None = None) -> bool:
        """Write one audit row; False when an earlier try of the same activity wrote it (the same ``event_key``)."""
        with Session(self.engine) as s:
            s.add(AuditLog(event_key=event_key, org=org, app=app, executor_id=executor_id, operation=operation,
                           status=status, subject=subject, source_ip=source_ip, details=details))
            try:
                s.commit()
            except IntegrityError:
                s.rollback()  # same event_key: already written by an earlier try of the same activity
                return False
        return True

    def prune_audit_batch(self, *, before: datetime, limit: int) -> int:
        """Delete up to ``limit`` of the oldest audit rows emitted before ``before`` (every org's), in one short
        transaction found through the ``emit_time`` index; how many (fewer than ``limit``: none older are left). The
        audit retention calls it again and again rather than deleting everything at once: one huge DELETE would hold
        SQLite's write lock, or PostgreSQL's row locks and a long transaction, while every writer waits."""
        with Session(self.engine) as s:
            ids = s.exec(select(AuditLog.id).where(col(AuditLog.emit_time) < before)
                         .order_by(col(AuditLog.emit_time)).limit(limit)).all()
            if ids:
                s.execute(sa_delete(AuditLog).where(col(AuditLog.id).in_(ids)))
                s.commit()
        return len(ids)

    def list_audit(self, org: str, *, app: str | None = None, limit: int = 1000) -> list[AuditLog]:
        with Session(self.engine) as s:
            q = select(AuditLog).where(AuditLog.org == org)
            if app is not None:
                q = q.where(AuditLog.app == app)
            return list(s.exec(q.order_by(col(AuditLog.emit_time).desc()).limit(limit)).all())

    # -- retention -----------------------------------------------------------------------------------------

    def list_retention_targets(self, org: str | None = None,
                               app: str | None = None) -> list[tuple[Application, datetime | None]]:
        """Apps with at least one retention setting, each with the start of its last round (None: never).

        A ``gc_rows_threshold`` <= 0 counts as unset: it is never sent (``OFFSET -1`` on PostgreSQL).
        """
        joined = and_(RetentionState.org == Application.org, RetentionState.app == Application.name)
        query = (
            select(Application, RetentionState)
            .join(RetentionState, joined, isouter=True)
            .where(or_(col(Application.gc_time_threshold).is_not(None), col(Application.global_timeout).is_not(None),
                       col(Application.gc_rows_threshold) > 0))
        )
        if org is not None:
            query = query.where(Application.org == org)
        if app is not None:
            query = query.where(Application.name == app)
        with Session(self.engine) as s:
            rows = s.exec(query.order_by(col(Application.org), col(Application.name))).all()
        return [(app, None if state is None else state.last_started_at) for app, state in rows]

    def select_retention_executor(self, *, org: str, app: str, exclude: list[str],
                                  latest: str | None = None) -> tuple[str, str] | None:
        """The executor to run the app's retention round (``candidates.select_retention_executor``, newest
        application version first): ``(executor_id, gateway_queue)``, or None."""
        with Session(self.engine) as s:
            best = candidates.select_retention_executor(_eligible(s, org, app), exclude=exclude, latest=latest)
        if best is None:
            return None
        assert best.gateway_queue is not None
        return best.executor_id, best.gateway_queue

    def write_retention_audit(self, *, org: str, app: str, operation: str, event_key: str, status: str,
                              executor_id: str | None, details: dict[str, Any],
                              started_at: datetime | None = None, request_id: str | None = None) -> bool:
        """Write one retention audit row and, with ``started_at``, the app's last round, in one transaction and
        at most once per ``event_key``; False when an earlier try wrote them."""
        with Session(self.engine) as s:
            if s.exec(select(AuditLog.id).where(AuditLog.event_key == event_key)).first() is not None:
                return False  # a retried activity: this event already landed
            s.add(AuditLog(event_key=event_key, org=org, app=app, executor_id=executor_id, operation=operation,
                           status=status, details=details))
            if started_at is not None:
                state = s.get(RetentionState, (org, app))
                if state is None:
                    state = RetentionState(org=org, app=app, last_started_at=started_at)
                state.last_started_at = max(state.last_started_at, started_at)
                state.executor_id, state.request_id = executor_id, request_id
                s.add(state)
            try:
                s.commit()
            except IntegrityError:
                s.rollback()  # the same event_key, written concurrently by an earlier try of this activity
                return False
        return True

    # -- drain, pause and the recovery gate (core.gate) ---------------------------------------------------

    def set_drain(self, *, org: str, app: str, executor_id: str, until: datetime, reason: str, subject: str,
                  source_ip: str, details: dict[str, Any]) -> ExecutorDrain:
        """Drain a registered executor until ``until`` (replacing any drain of it), audited. 404: unknown app or
        executor."""
        with Session(self.engine) as s:
            _app_row(s, org, app)
            if s.get(Executor, (org, app, executor_id)) is None:
                raise NotFoundError(f"executor {executor_id!r} of app {app!r} not found")
            row = s.merge(ExecutorDrain(org=org, app=app, executor_id=executor_id, until=until, subject=subject,
                                        reason=reason, created_at=utcnow()))
            s.add(AuditLog(org=org, app=app, executor_id=executor_id, operation="executor.drain.set",
                           subject=subject, source_ip=source_ip,
                           details={**details, "until": until.isoformat(), "reason": reason}))
            s.commit()
            s.refresh(row)
            return row

    def clear_drain(self, *, org: str, app: str, executor_id: str, subject: str, source_ip: str) -> list[str]:
        """End an executor's drain (expired or not), audited; returns the app's DEAD executors (their recoveries
        may be waiting for a peer). 404: unknown app, or no drain of that executor."""
        with Session(self.engine) as s:
            _app_row(s, org, app)
            row = s.get(ExecutorDrain, (org, app, executor_id))
            if row is None:
                raise NotFoundError(f"executor {executor_id!r} of app {app!r} is not drained")
            s.delete(row)
            s.add(AuditLog(org=org, app=app, executor_id=executor_id, operation="executor.drain.cleared",
                           subject=subject, source_ip=source_ip, details={"until": row.until.isoformat()}))
            s.commit()
            return list(s.exec(select(Executor.executor_id).where(
                Executor.org == org, Executor.app == app, Executor.status == ExecutorStatus.DEAD)).all())

    def list_drains(self, org: str, app: str) -> list[ExecutorDrain]:
        """The app's drains, expired ones included (they are ignored, not deleted), by executor id. 404: no app."""
        with Session(self.engine) as s:
            _app_row(s, org, app)
            return list(s.exec(select(ExecutorDrain).where(ExecutorDrain.org == org, ExecutorDrain.app == app)
                               .order_by(col(ExecutorDrain.executor_id))).all())

    def set_pause(self, *, org: str, app: str, until: datetime, reason: str, subject: str, source_ip: str,
                  details: dict[str, Any]) -> RecoveryPause:
        """Pause the app's recoveries until ``until`` (replacing any pause), audited. 404: unknown app."""
        with Session(self.engine) as s:
            _app_row(s, org, app)
            row = s.merge(RecoveryPause(org=org, app=app, until=until, reason=reason, subject=subject,
                                        created_at=utcnow()))
            s.add(AuditLog(org=org, app=app, operation="app.recovery.paused", subject=subject, source_ip=source_ip,
                           details={**details, "until": until.isoformat(), "reason": reason}))
            s.commit()
            s.refresh(row)
            return row

    def clear_pause(self, *, org: str, app: str, subject: str, source_ip: str) -> None:
        """Lift the app's pause (expired or not), audited. 404: unknown app, or no pause."""
        with Session(self.engine) as s:
            _app_row(s, org, app)
            row = s.get(RecoveryPause, (org, app))
            if row is None:
                raise NotFoundError(f"recovery of app {app!r} is not paused")
            s.delete(row)
            s.add(AuditLog(org=org, app=app, operation="app.recovery.resumed", subject=subject, source_ip=source_ip,
                           details={"until": row.until.isoformat(), "reason": row.reason}))
            s.commit()

    def recovery_state(self, org: str, app: str) -> tuple[RecoveryPause | None, RecoveryGate | None,
                                                             list[RecoveryTicket]]:
        """The app's pause, gate and tickets not let through yet. 404: unknown app."""
        with Session(self.engine) as s:
            _app_row(s, org, app)
            waiting = s.exec(select(RecoveryTicket).where(
                RecoveryTicket.org == org, RecoveryTicket.app == app, col(RecoveryTicket.granted_at).is_(None))
                .order_by(col(RecoveryTicket.died_at))).all()
            return s.get(RecoveryPause, (org, app)), s.get(RecoveryGate, (org, app)), list(waiting)

    def admit_recovery(self, *, org: str, app: str, executor_id: str, ticket: str, now: datetime,
                       policy: gate.GatePolicy, event_key: str = "") -> gate.Decision:
        """Ask the app's recovery gate whether ``executor_id``'s recovery (death ``ticket``) may go at ``now``
        (``core.gate.admit``), in one transaction under the gate's row lock. Writes the breaker's alert
        (``app.recovery.breaker_tripped``, once per storm), its reset, and the first hold of each kind.

        The lock: an UPDATE of the gate row comes first, so SQLite takes its write lock and PostgreSQL the row's
        lock before anything is read; concurrent admissions of one app then run one after the other.
        """
        with Session(self.engine) as s:
            _lock_gate(s, org, app)
            row = s.get(RecoveryGate, (org, app))
            assert row is not None
            # Plain rows, not the ORM's (a burst of deaths reads every ticket on every admission); the one this
            # admission writes is loaded as an object below.
            c = s.connection()
            # Only the tickets the gate can read: deaths within its window, tickets not yet let through, and this
            # executor's own. A finished ticket older than the window changes no decision (``core.gate``): reading
            # every ticket of the last hour made each admission of a storm cost as much as all the deaths before it.
            stored = {t.executor_id: t for t in c.execute(_TICKETS, {"org": org, "app": app, "me": executor_id,
                                                                     "since": now - policy.window})}
            # The gate reads the executors that are down or hold a ticket; the others (HEALTHY) only as a count.
            registry = {e.executor_id: gate.Registered(str(e.status), e.updated_at) for e in c.execute(
                _REGISTERED, {"org": org, "app": app, "healthy": ExecutorStatus.HEALTHY,
                              "ids": [executor_id, *stored]})}
            population = c.execute(_POPULATION, {"org": org, "app": app}).scalar_one()
            pause = s.get(RecoveryPause, (org, app))
            breaker = gate.Breaker(row.tripped_at, row.trips, row.last_slot_at, row.last_granted_at)
            tickets = {i: _ticket(t) for i, t in stored.items()}
            mine, decision = gate.admit(
                executor_id=executor_id, key=ticket, now=now, ticket=tickets.get(executor_id), breaker=breaker,
                pause_until=pause.until if pause else None, registry=registry, tickets=tickets, policy=policy,
                healthy_left_out=population - len(registry))
            row.tripped_at, row.trips = breaker.tripped_at, breaker.trips
            row.last_slot_at, row.last_granted_at = breaker.last_slot_at, breaker.last_granted_at
            s.add(row)
            own = s.get(RecoveryTicket, (org, app, executor_id)) if executor_id in stored else None
            _store_ticket(s, own, mine, org=org, app=app, executor_id=executor_id)
            self._gate_audit(s, decision, org=org, app=app, executor_id=executor_id, trips=breaker.trips,
                             policy=policy, event_key=event_key)
            kept = now - max(policy.window, TICKETS_KEPT)  # finished tickets stop counting after a while
            s.execute(sa_delete(RecoveryTicket).where(
                col(RecoveryTicket.org) == org, col(RecoveryTicket.app) == app,
                col(RecoveryTicket.executor_id) != executor_id, col(RecoveryTicket.granted_at).is_not(None),
                col(RecoveryTicket.died_at) < kept))
            if own is not None and mine.granted_at is not None and mine.died_at < kept:
                s.delete(own)
            s.commit()
            return decision

    def _gate_audit(self, s: Session, decision: gate.Decision, *, org: str, app: str, executor_id: str,
                    trips: int, policy: gate.GatePolicy, event_key: str) -> None:
        """The gate's audit rows, in its transaction: a retried admission finds the state they record (tripped,
        reset, held for that reason) already written, so none lands twice; the trip's row also has a unique key."""
        if decision.reset:
            s.add(AuditLog(org=org, app=app, executor_id=executor_id, operation="app.recovery.breaker_reset",
                           details={"trips": trips}))
        if decision.tripped:
            s.add(AuditLog(org=org, app=app, executor_id=executor_id, operation="app.recovery.breaker_tripped",
                           status="failure", event_key=gate.breaker_event_key(org, app, trips),
                           details={**decision.storm, "trip": trips, "stormShare": policy.storm_share,
                                    "stormMinExecutors": policy.storm_min,
                                    **units.rest_durations({"stormWindowMs": policy.window,
                                                            "paceMs": policy.pace})}))
        if decision.first_hold and decision.until is not None:
            s.add(AuditLog(org=org, app=app, executor_id=executor_id, operation="executor.recovery.held",
                           details={"reason": decision.reason, "until": decision.until.isoformat(),
                                    **({"workflowEvent": event_key} if event_key else {})}))

    # -- admin API -----------------------------------------------------------------------------------------

    def org_exists(self, org: str) -> bool:
        """An org exists once a key was issued for it (apps are only ever registered with a key of theirs)."""
        with Session(self.engine) as s:
            return s.exec(select(ApiKey.id).where(ApiKey.org == org).limit(1)).first() is not None

    def authorize_org(self, key: str, org: str) -> Principal:
        """401 unknown or revoked key, 404 unknown org, 403 a key of another org."""
        principal = self.authenticate(key)
        if principal.org != org:
            if not self.org_exists(org):
                raise NotFoundError(f"org {org!r} not found")
            raise ForbiddenError(f"this key does not belong to org {org!r}")
        return principal

    def authorize_app(self, key: str, org: str, app: str, *, with_candidates: bool = False) -> AppAccess:
        """``authorize_org``, then 403 a key not allowed for the app (before any 404 for it, so a restricted key
        cannot probe which apps exist), then 404 an unknown app: a REST call's whole check, on one connection with
        prepared statements (the hot path of workflow management: a third of ``authorize_org`` plus ``get_app``).
        With ``with_candidates``, also the app's ``management_candidates``, on the same connection."""
        digest = hash_key(key)
        with self.engine.connect() as c:
            row = c.execute(_KEY_BY_HASH, {"key_hash": digest}).first()
            if row is None or row.revoked_at is not None or not hmac.compare_digest(row.key_hash, digest):
                raise AuthError("unknown or revoked API key")
            principal = Principal(row.id, row.name, row.org, tuple(row.apps) if row.apps else None)
            if principal.org != org:
                if c.execute(_ANY_KEY_OF_ORG, {"org": org}).first() is None:
                    raise NotFoundError(f"org {org!r} not found")
                raise ForbiddenError(f"this key does not belong to org {org!r}")
            principal.require(app)
            found = c.execute(_APP_BY_NAME, {"org": org, "name": app}).first()
            if found is None:
                raise NotFoundError(f"application {app!r} not found in org {org!r}")
            return AppAccess(principal, Application.model_validate(found._mapping),
                             _candidates(c, org, app) if with_candidates else None)

    def list_apps(self, org: str, names: tuple[str, ...] | None = None
                  ) -> list[tuple[Application, list[Executor]]]:
        """The org's apps (only ``names``, when given), each with its executors, in name order."""
        with Session(self.engine) as s:
            q = select(Application).where(Application.org == org)
            if names is not None:
                q = q.where(col(Application.name).in_(names))
            apps = s.exec(q.order_by(col(Application.name))).all()
            executors = s.exec(select(Executor).where(Executor.org == org)
                               .order_by(col(Executor.created_at))).all()
        by_app: dict[str, list[Executor]] = {}
        for row in executors:
            by_app.setdefault(row.app, []).append(row)
        return [(app, by_app.get(app.name, [])) for app in apps]

    def delete_app(self, org: str, name: str, *, subject: str, source_ip: str,
                   orphans: list[str], details: dict[str, Any]) -> None:
        """Delete the app's row (audited), the registry rows of ``orphans`` (executors whose lifecycle workflow is
        gone, so nothing else will ever delete them), and what belongs to the app alone: its drains, pause, recovery
        gate and tickets, and its alerting rules (an app registered again under the name starts afresh)."""
        with Session(self.engine) as s:
            app = s.exec(select(Application).where(Application.org == org, Application.name == name)).first()
            if app is None:
                raise NotFoundError(f"application {name!r} not found in org {org!r}")
            s.delete(app)
            for executor_id in orphans:
                row = s.get(Executor, (org, name, executor_id))
                if row is not None:
                    s.delete(row)
            for table in (ExecutorDrain, RecoveryPause, RecoveryGate, RecoveryTicket):
                s.execute(sa_delete(table).where(col(table.org) == org, col(table.app) == name))
            s.execute(sa_delete(AlertingRule).where(or_(col(AlertingRule.app_id) == app.id,
                                                        col(AlertingRule.receiving_app_id) == app.id)))
            s.add(AuditLog(org=org, app=name, operation="app.deleted", subject=subject, source_ip=source_ip,
                           details=details))
            s.commit()

    def create_token(self, *, org: str, name: str, apps: list[str] | None, subject: str,
                     source_ip: str) -> str:
        """Create a named key (audited) and return it; only its hash is stored. 409 if the org already has a
        live token of that name (``relay keys create`` labels are not unique, so this is checked here)."""
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        with Session(self.engine) as s:
            taken = s.exec(select(ApiKey.id).where(ApiKey.org == org, ApiKey.name == name,
                                                   col(ApiKey.revoked_at).is_(None))).first()
            if taken is not None:
                raise ConflictError(f"org {org!r} already has a token named {name!r}")
            s.add(ApiKey(org=org, name=name, key_hash=hash_key(key), apps=apps or None))
            s.add(AuditLog(org=org, operation="token.created", subject=subject, source_ip=source_ip,
                           details={"tokenName": name, "appNames": apps or None}))
            s.commit()
        return key

    def list_tokens(self, org: str) -> tuple[list[ApiKey], dict[str, str]]:
        """The org's live keys, oldest first, and its registered apps' ids by name."""
        with Session(self.engine) as s:
            keys = s.exec(select(ApiKey).where(ApiKey.org == org, col(ApiKey.revoked_at).is_(None))
                          .order_by(col(ApiKey.created_at))).all()
            apps = s.exec(select(Application.name, Application.id).where(Application.org == org)).all()
        return list(keys), dict(apps)

    def revoke_token(self, org: str, name: str, *, subject: str, source_ip: str) -> list[str]:
        """Revoke every live key of the org with that name (audited); returns their ids. 404 if none."""
        with Session(self.engine) as s:
            keys = s.exec(select(ApiKey).where(ApiKey.org == org, ApiKey.name == name,
                                               col(ApiKey.revoked_at).is_(None))).all()
            if not keys:
                raise NotFoundError(f"no token named {name!r} in org {org!r}")
            now = utcnow()
            for row in keys:
                row.revoked_at = now
                s.add(row)
            s.add(AuditLog(org=org, operation="token.deleted", subject=subject, source_ip=source_ip,
                           details={"tokenName": name, "keys": len(keys)}))
            s.commit()
            return [row.id for row in keys]

    def still_valid(self, key_ids: set[str], pairs: set[tuple[str, str]]
                    ) -> tuple[set[str], dict[tuple[str, str], str]]:
        """In one session: those of ``key_ids`` that no longer authenticate, and the ids of those ``(org, app)``
        that are registered (what a gateway checks its sockets against, twice a second)."""
        live: set[str] = set()
        registered: dict[tuple[str, str], str] = {}
        with self.engine.connect() as c:  # Core, not an ORM session: this runs twice a second on every gateway
            if key_ids:
                live = set(c.execute(select(ApiKey.id).where(col(ApiKey.id).in_(key_ids),
                                                             col(ApiKey.revoked_at).is_(None))).scalars())
            if pairs:
                orgs, names = {org for org, _ in pairs}, {name for _, name in pairs}
                rows = c.execute(select(Application.org, Application.name, Application.id).where(
                    col(Application.org).in_(orgs), col(Application.name).in_(names))).all()
                registered = {(org, name): app_id for org, name, app_id in rows if (org, name) in pairs}
        return key_ids - live, registered

    def query_audit(self, org: str, *, start: datetime | None = None, end: datetime | None = None,
                    operation: str | None = None, subject: str | None = None, target: str | None = None,
                    limit: int = 100, offset: int = 0) -> tuple[list[AuditLog], dict[str, str]]:
        """Audit rows of the org, newest first, with the names of the keys that are their subjects.

        ``start`` is inclusive and ``end`` exclusive. ``subject`` is ``system``, a key id or a key name;
        ``target`` an app name, a token name or an executor id.
        """
        q = select(AuditLog).where(AuditLog.org == org)
        if start is not None:
            q = q.where(col(AuditLog.emit_time) >= start)
        if end is not None:
            q = q.where(col(AuditLog.emit_time) < end)
        if operation is not None:
            q = q.where(AuditLog.operation == operation)
        with Session(self.engine) as s:
            if subject is not None:
                ids = {subject, *s.exec(select(ApiKey.id).where(ApiKey.org == org, ApiKey.name == subject)).all()}
                stored = [subject_of_key(i) for i in ids] + [f"key:{subject}"]
                q = q.where(col(AuditLog.subject).in_(stored + ([SYSTEM_SUBJECT] if subject == SYSTEM_SUBJECT else [])))
            if target is not None:
                token = and_(col(AuditLog.operation).in_(TOKEN_OPERATIONS),
                             col(AuditLog.details)["tokenName"].as_string() == target)
                q = q.where(or_(AuditLog.app == target, AuditLog.executor_id == target, token))
            q = q.order_by(col(AuditLog.emit_time).desc(), col(AuditLog.id).desc()).offset(offset).limit(limit)
            rows = list(s.exec(q).all())
            return rows, _key_names(s, [r.subject for r in rows])

    def key_names(self, subjects: list[str]) -> dict[str, str]:
        """The names of the keys among these audit subjects (``api_key:<key id>``), by key id."""
        with Session(self.engine) as s:
            return _key_names(s, subjects)

    # -- alerting rules (core.alerts, workflows.alerts) ------------------------------------------------------

    def create_alert_rule(self, *, org: str, app: str, receiving_app: str, rule_type: str, metadata: Any,
                          min_interval: timedelta | None, subject: str, source_ip: str) -> AlertingRule:
        """Create a rule (audited ``alert_rule.created``); 404 for an unknown app or receiving app."""
        with Session(self.engine) as s:
            own = s.exec(select(Application).where(Application.org == org, Application.name == app)).first()
            receiver = own if receiving_app == app else s.exec(select(Application).where(
                Application.org == org, Application.name == receiving_app)).first()
            if own is None or receiver is None:
                missing = app if own is None else receiving_app
                raise NotFoundError(f"application {missing!r} not found in org {org!r}")
            rule = AlertingRule(org=org, app=app, app_id=own.id, receiving_app=receiving_app,
                                receiving_app_id=receiver.id, rule_type=rule_type, rule_metadata=metadata,
                                min_interval=min_interval)
            s.add(rule)
            s.add(AuditLog(org=org, app=app, operation="alert_rule.created", subject=subject, source_ip=source_ip,
                           details={"ruleId": rule.id, "ruleType": rule_type, "receivingAppName": receiving_app,
                                    "ruleMetadata": metadata,
                                    **units.rest_durations({"minIntervalSecs": min_interval})}))
            s.commit()
            s.refresh(rule)
            return rule

    def list_alert_rules(self, org: str, app: str) -> list[AlertingRule]:
        """The app's rules, oldest first; 404 for an unknown app."""
        app_id = self.get_app(org, app).id
        with Session(self.engine) as s:
            return list(s.exec(select(AlertingRule).where(AlertingRule.app_id == app_id)
                               .order_by(col(AlertingRule.created_at), col(AlertingRule.id))).all())

    def delete_alert_rule(self, org: str, app: str, rule_id: str, *, subject: str, source_ip: str) -> None:
        """Delete one of the app's rules (audited ``alert_rule.deleted``); 404 for an unknown app or rule."""
        app_id = self.get_app(org, app).id
        with Session(self.engine) as s:
            rule = s.get(AlertingRule, rule_id)
            if rule is None or rule.app_id != app_id:
                raise NotFoundError(f"alerting rule {rule_id!r} not found for app {app!r}")
            s.delete(rule)
            s.add(AuditLog(org=org, app=app, operation="alert_rule.deleted", subject=subject, source_ip=source_ip,
                           details={"ruleId": rule_id, "ruleType": rule.rule_type}))
            s.commit()

    def alert_rules_to_evaluate(self) -> list[tuple[AlertingRule, int, datetime | None]]:
        """Every rule of a registered app, each with its app's HEALTHY executor count and the latest change of
        one of its other executors (when the app lost them, at the latest)."""
        with Session(self.engine) as s:
            rules = s.exec(select(AlertingRule).join(Application, col(Application.id) == col(AlertingRule.app_id))
                           .order_by(col(AlertingRule.created_at))).all()
            apps = {(r.org, r.app) for r in rules}
            executors = s.exec(select(Executor).where(col(Executor.org).in_({o for o, _ in apps}),
                                                      col(Executor.app).in_({a for _, a in apps}))).all() \
                if apps else []
        healthy: Counter[tuple[str, str]] = Counter()
        since: dict[tuple[str, str], datetime] = {}
        for e in executors:
            key = (e.org, e.app)
            if e.status == ExecutorStatus.HEALTHY:
                healthy[key] += 1
            else:
                since[key] = max(since.get(key, e.updated_at), e.updated_at)
        return [(r, healthy[(r.org, r.app)], since.get((r.org, r.app))) for r in rules]

    def own_alert_events(self, operations: list[str], *, until: datetime, lookback: timedelta,
                         watermark: str = "audit") -> tuple[list[AuditLog], datetime]:
        """Audit rows of ``operations`` after the watermark (``until - lookback`` at first) up to ``until``,
        oldest first, and where that window started."""
        with Session(self.engine) as s:
            mark = s.get(AlertWatermark, watermark)
            start = mark.until if mark is not None else until - lookback
            if until <= start:
                return [], start
            rows = s.exec(select(AuditLog).where(col(AuditLog.operation).in_(operations),
                                                 col(AuditLog.emit_time) > start, col(AuditLog.emit_time) <= until)
                          .order_by(col(AuditLog.emit_time))).all()
        return list(rows), start

    def advance_alert_watermark(self, until: datetime, *, watermark: str = "audit") -> None:
        """Move the watermark forward to ``until`` (never back)."""
        with Session(self.engine) as s:
            mark = s.get(AlertWatermark, watermark)
            if mark is None:
                s.add(AlertWatermark(name=watermark, until=until))
            elif until > mark.until:
                mark.until = until
                s.add(mark)
            try:
                s.commit()
            except IntegrityError:  # created concurrently by another round: the later instant wins next time
                s.rollback()

    def record_rule_evaluation(self, rule_id: str, *, now: datetime, fire: bool, suppressed: bool,
                               expected_last_fired_at: datetime | None, checked_until: datetime | None,
                               condition_since: datetime | None) -> bool:
        """Store one evaluation of a rule. With ``fire``, claim the firing: ``last_fired_at`` becomes ``now`` only
        if it is still ``expected_last_fired_at`` (or already ``now``: a retried activity), in one UPDATE, so two
        evaluations never both fire. Returns whether the firing is claimed (False: rule gone, or fired
        meanwhile, which then counts as held back)."""
        state = {"checked_until": checked_until, "condition_since": condition_since}
        where = col(AlertingRule.id) == rule_id
        with Session(self.engine) as s:
            if fire:
                last = col(AlertingRule.last_fired_at)
                was = last.is_(None) if expected_last_fired_at is None else last == expected_last_fired_at
                claim = s.execute(update(AlertingRule).where(where, or_(was, last == now))
                                  .values(last_fired_at=now, suppressed=0, **state))
                if claim.rowcount == 1:  # type: ignore[attr-defined]
                    s.commit()
                    return True
                suppressed = True
            bump = col(AlertingRule.suppressed) + (1 if suppressed else 0)
            s.execute(update(AlertingRule).where(where).values(suppressed=bump, **state))
            s.commit()
        return False


# Claims by operators' requests (``claim_for_management``) sit beside recovery claims, keyed by request; one left
# behind by a gateway that died mid-request stops counting after this long.
MANAGEMENT_CLAIM = "management:"
# A DEAD executor's recovery steps, as its lifecycle workflow audits them: the last one since it died says whether
# its recovery is blocked for lack of a peer (``Store.blocked_recoveries``).
RECOVERY_STEPS = ("executor.recovery.blocked", "executor.recovery.unblocked", "executor.recovery.dispatched",
                  "executor.recovery.cancelled")
MANAGEMENT_CLAIM_TTL = timedelta(minutes=5)


# Let-through tickets are kept this long (or a storm window, if longer): they spread recoveries over the peers.
TICKETS_KEPT = timedelta(hours=1)


def _app_row(s: Session, org: str, app: str) -> Application:
    row = s.exec(select(Application).where(Application.org == org, Application.name == app)).first()
    if row is None:
        raise NotFoundError(f"application {app!r} not found in org {org!r}")
    return row


def _lock_gate(s: Session, org: str, app: str) -> None:
    """Take the app's gate row lock for this transaction (creating the row the first time)."""
    bump = update(RecoveryGate).where(col(RecoveryGate.org) == org, col(RecoveryGate.app) == app).values(
        version=col(RecoveryGate.version) + 1)
    for _ in range(3):
        if s.execute(bump).rowcount:  # type: ignore[attr-defined]
            return
        s.add(RecoveryGate(org=org, app=app))
        try:
            s.flush()
        except IntegrityError:  # created meanwhile by another admission: bump that one
            s.rollback()
            continue
        s.execute(bump)
        return
    raise RuntimeError(f"could not lock the recovery gate of {org}/{app}")


def _drop_waiting_ticket(s: Session, org: str, app: str, executor_id: str) -> None:
    """A DEAD executor back before its recovery was let through: its ticket is no longer waiting at the gate (nor,
    for the breaker, an executor gone down). A ticket let through stays: it says which peer carried a recovery."""
    row = s.get(RecoveryTicket, (org, app, executor_id))
    if row is not None and row.granted_at is None:
        s.delete(row)


def _ticket(row: Any) -> gate.Ticket:
    """A ticket as the gate reads it, from its row (an object or a plain row)."""
    return gate.Ticket(key=row.ticket, died_at=row.died_at, slot_at=row.slot_at, granted_at=row.granted_at,
                       paused=row.paused, held=row.held)


def _store_ticket(s: Session, row: RecoveryTicket | None, ticket: gate.Ticket, *, org: str, app: str,
                  executor_id: str) -> None:
    if row is None:
        row = RecoveryTicket(org=org, app=app, executor_id=executor_id, ticket=ticket.key, died_at=ticket.died_at)
    elif row.ticket != ticket.key:
        row.candidate_id = None  # an earlier death's
    row.ticket, row.died_at, row.slot_at, row.granted_at = ticket.key, ticket.died_at, ticket.slot_at, ticket.granted_at
    row.paused, row.held = ticket.paused, ticket.held
    s.add(row)


def _candidates(c: Connection, org: str, app: str) -> Candidates:
    stale = utcnow() - MANAGEMENT_CLAIM_TTL
    rows = c.execute(_ELIGIBLE, {"org": org, "app": app, "status": ExecutorStatus.HEALTHY, "now": utcnow()}).all()
    claims = c.execute(_CLAIMS, {"org": org, "app": app}).all()
    busy = {claim.candidate_id for claim in claims if _live(claim.dead_executor_id, claim.claimed_at, stale)}
    return Candidates([Executor.model_validate(row._mapping) for row in rows], busy)


def _live(dead_executor_id: str, claimed_at: datetime, stale: datetime) -> bool:
    """A recovery claim lives until released; an operator's request claim also expires (its gateway may die)."""
    return not (dead_executor_id.startswith(MANAGEMENT_CLAIM) and claimed_at < stale)


# Statements of the hot path (every REST call about an app, every management request), built once: SQLAlchemy
# spends more building and caching a statement than SQLite spends running it.
_KEY_BY_HASH = select(ApiKey).where(ApiKey.key_hash == bindparam("key_hash"))
_ANY_KEY_OF_ORG = select(ApiKey.id).where(ApiKey.org == bindparam("org")).limit(1)
_APP_BY_NAME = select(Application).where(Application.org == bindparam("org"), Application.name == bindparam("name"))
_ROUTABLE = select(Executor).where(Executor.org == bindparam("org"), Executor.app == bindparam("app"),
                                   Executor.status == bindparam("status"), col(Executor.gateway_queue).is_not(None))
# Routable and not drained (a drain still in force): who may recover others or carry an operator's request. The
# drain is excluded inside the same statement, so a management request still costs one query for its candidates.
_ELIGIBLE = _ROUTABLE.where(~exists().where(
    col(ExecutorDrain.org) == col(Executor.org), col(ExecutorDrain.app) == col(Executor.app),
    col(ExecutorDrain.executor_id) == col(Executor.executor_id), col(ExecutorDrain.until) > bindparam("now")))
# Routable HEALTHY executors a drain in force keeps out of _ELIGIBLE: only what saying so needs.
_DRAINED = _ROUTABLE.with_only_columns(col(Executor.executor_id), col(Executor.app_version)).where(exists().where(
    col(ExecutorDrain.org) == col(Executor.org), col(ExecutorDrain.app) == col(Executor.app),
    col(ExecutorDrain.executor_id) == col(Executor.executor_id), col(ExecutorDrain.until) > bindparam("now"))
).order_by(col(Executor.executor_id))
# The same peers as _ELIGIBLE, only what choosing one reads (``candidates.Peer``): a recovery's candidate is chosen
# among every HEALTHY executor of the app, and building an ORM object per row cost 25 ms at 1,000 executors, under the
# database's write lock (a burst of deaths waited on it in line).
_ELIGIBLE_PEERS = _ELIGIBLE.with_only_columns(col(Executor.executor_id), col(Executor.app_version))
# One eligible peer of a version that no recovery claims and no recent ticket names (``busy``), at random.
_IDLE_PEER = _ELIGIBLE_PEERS.where(
    col(Executor.app_version) == bindparam("version"),
    col(Executor.executor_id).not_in(bindparam("busy", expanding=True))).order_by(func.random()).limit(1)
# What the recovery gate reads of the registry (``core.gate.Registered``): plain rows of the executors that are not
# HEALTHY or hold a ticket, and how many executors the app has; every admission of a burst of deaths runs this under
# the database's write lock, so it must not grow with the app's healthy executors.
_REGISTERED = select(Executor.executor_id, Executor.status, Executor.updated_at).where(
    Executor.org == bindparam("org"), Executor.app == bindparam("app"),
    or_(Executor.status != bindparam("healthy"), col(Executor.executor_id).in_(bindparam("ids", expanding=True))))
_POPULATION = select(func.count()).select_from(Executor).where(Executor.org == bindparam("org"),
                                                               Executor.app == bindparam("app"))
_TICKETS = select(*RecoveryTicket.__table__.columns).where(  # type: ignore[attr-defined]
    col(RecoveryTicket.org) == bindparam("org"), col(RecoveryTicket.app) == bindparam("app"),
    or_(col(RecoveryTicket.died_at) >= bindparam("since"), col(RecoveryTicket.granted_at).is_(None),
        col(RecoveryTicket.executor_id) == bindparam("me")))
_TICKET_PEERS = select(RecoveryTicket.executor_id, RecoveryTicket.candidate_id).where(
    RecoveryTicket.org == bindparam("org"), RecoveryTicket.app == bindparam("app"))
_CLAIMS = select(RecoveryClaim.candidate_id, RecoveryClaim.dead_executor_id, RecoveryClaim.claimed_at).where(
    RecoveryClaim.org == bindparam("org"), RecoveryClaim.app == bindparam("app"))


def _eligible(s: Session, org: str, app: str) -> list[Executor]:
    """The app's HEALTHY executors whose gateway is known (a request can be routed to their socket) and that are
    not drained: who may recover others, run a retention round or carry an operator's request."""
    return list(s.execute(_ELIGIBLE, {"org": org, "app": app, "status": ExecutorStatus.HEALTHY,
                                      "now": utcnow()}).scalars())


# -- admin API ----------------------------------------------------------------------------------------------

# Audit subjects are stored as "system" or "api_key:<key id>" (older rows: "key:<key name>").
API_KEY_SUBJECT = "api_key:"
SYSTEM_SUBJECT = "system"
TOKEN_OPERATIONS = ("token.created", "token.deleted")


def _key_names(s: Session, subjects: list[str]) -> dict[str, str]:
    key_ids = {subject.removeprefix(API_KEY_SUBJECT) for subject in subjects if subject.startswith(API_KEY_SUBJECT)}
    if not key_ids:
        return {}
    return dict(s.exec(select(ApiKey.id, ApiKey.name).where(col(ApiKey.id).in_(key_ids))).all())


def subject_of_key(key_id: str) -> str:
    return API_KEY_SUBJECT + key_id


def subject_of(principal: Principal) -> str:
    """The audit subject for an action taken with this key."""
    return subject_of_key(principal.key_id)
