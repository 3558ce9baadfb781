"""The executor registry, written on behalf of each executor's lifecycle workflow (status, deletion; a gateway writes
ahead of it what the workflow will write on a signal it sent: a socket's close, a HEALTHY executor's new socket) and
read by the REST API, the gateways, the metrics, the orphan sweep and the reconciliation."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import ColumnElement, Connection, Label, bindparam, exists, tuple_
from sqlalchemy import delete as sa_delete
from sqlalchemy import select as sa_select
from sqlalchemy import update as sa_update
from sqlalchemy.orm import Mapped
from sqlmodel import Session, col, select

from core.models import Application, AuditLog, Executor, GatewayProcess, RecoveryClaim, RecoveryTicket, new_id
from core.store.audit import insert_audit
from core.store.base import InsertOnce, StoreBase
from core.types import ExecutorInfo, ExecutorStatus
from core.units import rest_durations, utcnow

# A DEAD executor's recovery steps, as its lifecycle workflow audits them: the last one since it died says whether
# its recovery is blocked for lack of a peer (``Store.blocked_recoveries``).
RECOVERY_STEPS = ("executor.recovery.blocked", "executor.recovery.unblocked", "executor.recovery.dispatched",
                  "executor.recovery.cancelled")


@dataclass(frozen=True)
class StatusWritten:
    """What ``Store.record_status`` did: whether this call wrote the event (False: an earlier try of the same
    activity had), when its audit row says it happened (this call's or the earlier try's), and, for a HEALTHY write,
    the ids of the app's DEAD executors and whether its gateway is known gone (``core.gateways``)."""

    written: bool
    dead: list[str]
    at: datetime
    gateway_gone: bool = False


@dataclass(frozen=True)
class RowSeen:
    """A registry row as a gateway read it before signalling a new socket's ``connected``: what ``move_healthy``
    writes over once the signal landed, only if nothing wrote the row in between."""

    status: ExecutorStatus
    connection_id: str
    updated_at: datetime


class Move(StrEnum):
    """What ``move_healthy`` did: the label of ``relay_gateway_moves_total``."""

    WRITTEN = "written"
    ALREADY = "already"  # the row names this socket already: its workflow took the signal in first
    LOST = "lost"  # another write in between, or this gateway known gone: the workflow writes it


@dataclass(frozen=True)
class GraceBegun:
    """What ``Store.begin_grace`` found or wrote: when the DISCONNECTED row says the executor went away, the grace
    it audited, and who wrote it: this call, the gateway (``record_disconnect``), or neither (an earlier try)."""

    at: datetime
    grace: timedelta
    written: bool
    by_gateway: bool = False


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
class AppExecutors:
    """What getApp says of an app's executors: whether one is HEALTHY, and the language of the newest that named
    one."""

    available: bool
    language: str | None


def app_executors_columns(org: ColumnElement[str] | Mapped[str], app: ColumnElement[str] | Mapped[str]
                          ) -> tuple[Label[bool], Label[str | None]]:
    """``AppExecutors`` as two SQL columns, ``available`` and ``language``, of the app that ``org`` and ``app`` name:
    bound parameters (getApp) or ``Application``'s own columns, correlated (listApps). No executor row is loaded."""
    of_app = (col(Executor.org) == org, col(Executor.app) == app)
    return (
        exists().where(*of_app, col(Executor.status) == ExecutorStatus.HEALTHY).label("available"),
        sa_select(col(Executor.language)).where(*of_app, col(Executor.language).is_not(None),
                                                col(Executor.language) != "")
        .order_by(col(Executor.created_at).desc()).limit(1).scalar_subquery().label("language"),
    )


_APP_EXECUTORS = sa_select(*app_executors_columns(bindparam("org"), bindparam("app")))


def app_executors_on(c: Connection, org: str, app: str) -> AppExecutors:
    """``AppExecutors`` in one statement on a connection the caller holds."""
    row = c.execute(_APP_EXECUTORS, {"org": org, "app": app}).one()
    return AppExecutors(bool(row.available), row.language)


_OF_APP = (col(Executor.org) == bindparam("org"), col(Executor.app) == bindparam("app"))
_DEAD = sa_select(col(Executor.executor_id)).where(*_OF_APP, col(Executor.status) == bindparam("dead"))


def dead_executors(c: Connection, org: str, app: str) -> list[str]:
    """The ids of the app's DEAD executors (each one's recovery may be waiting for a peer)."""
    return list(c.execute(_DEAD, {"org": org, "app": app, "dead": ExecutorStatus.DEAD}).scalars())

# ``record_status`` in SQLAlchemy Core, not the ORM: it runs for every status change of every executor, and the
# ORM's unit of work (load the row, track it, flush, commit) was most of its cost, a quarter of the worker's Python
# time in a burst of disconnects. Statements built once; the row's key as bind parameters.
# (Bound as ``k_*``: an UPDATE reserves its columns' own names for its SET clause.)
_PK = (col(Executor.org) == bindparam("k_org"), col(Executor.app) == bindparam("k_app"),
       col(Executor.executor_id) == bindparam("k_executor_id"))
_LANDED_AT = sa_select(col(AuditLog.emit_time)).where(col(AuditLog.event_key) == bindparam("event_key"))
_STATUS = sa_select(col(Executor.status)).where(*_PK)
_HEALTHY_CONNECTION = sa_select(col(Executor.connection_id)).where(*_PK, col(Executor.status) == bindparam("k_healthy"))
_DROP_WAITING_TICKET = sa_delete(RecoveryTicket).where(
    col(RecoveryTicket.org) == bindparam("k_org"), col(RecoveryTicket.app) == bindparam("k_app"),
    col(RecoveryTicket.executor_id) == bindparam("k_executor_id"), col(RecoveryTicket.granted_at).is_(None))
_INSERT_EXECUTOR = InsertOnce(Executor, "org", "app", "executor_id")
_UPDATE_EXECUTOR = sa_update(Executor).where(*_PK)  # SET: the columns the parameters name, but for the k_* key
_DELETE_EXECUTOR = sa_delete(Executor).where(*_PK)
_DEAD_SINCE = sa_select(col(Executor.status), col(Executor.updated_at)).where(*_PK)
_DELETE_CLAIM = sa_delete(RecoveryClaim).where(
    col(RecoveryClaim.org) == bindparam("k_org"), col(RecoveryClaim.app) == bindparam("k_app"),
    col(RecoveryClaim.dead_executor_id) == bindparam("k_executor_id"))
# A new row's columns that a status write does not set.
_NEW_ROW = {"app_version": "", "hostname": None, "language": None, "dbos_version": None, "executor_metadata": None,
            "gateway_queue": None, "connection_id": None}
_LANDED = sa_select(col(AuditLog.emit_time), col(AuditLog.details)).where(
    col(AuditLog.event_key) == bindparam("event_key"))
_APP_GRACE = sa_select(col(Application.executor_timeout)).where(
    col(Application.org) == bindparam("org"), col(Application.name) == bindparam("app"))
_DISCONNECT_HEALTHY = sa_update(Executor).where(*_PK, col(Executor.status) == bindparam("k_healthy"),
                                                col(Executor.connection_id) == bindparam("k_connection_id"))
# A registry row as a gateway reads it before it signals ``connected`` (``RowSeen``), and the write over exactly that
# row once the signal landed (``move_healthy``).
_KEY = tuple_(col(Executor.org), col(Executor.app), col(Executor.executor_id))
_SEEN_MANY = sa_select(col(Executor.org), col(Executor.app), col(Executor.executor_id), col(Executor.status),
                       col(Executor.connection_id), col(Executor.updated_at))
# Keys per ``rows_seen`` query: three bound parameters each, well under SQLite's and PostgreSQL's limits.
ROWS_SEEN_AT_ONCE = 500
_MOVE_HEALTHY = sa_update(Executor).where(*_PK, col(Executor.status) == bindparam("k_healthy"),
                                          col(Executor.connection_id) == bindparam("k_connection_id"),
                                          col(Executor.updated_at) == bindparam("k_updated_at"))
# Whether a gateway is known gone, read under a share lock on PostgreSQL (SQLite serializes writers anyway): a
# ``mark_gone`` of it waits for the HEALTHY write that read it to commit, so the sweep that follows reads that row.
_GATEWAY_GONE_AT = sa_select(col(GatewayProcess.gone_at)).where(
    col(GatewayProcess.queue) == bindparam("queue")).with_for_update(read=True)
DISCONNECTED_OPERATION = "executor.disconnected"
# The grace a DISCONNECTED row's audit details carry, in the REST unit its name states.
GRACE_DETAIL = "executorTimeoutSecs"
# Who wrote a DISCONNECTED row, in its audit details, when the gateway did: the lifecycle workflow that finds it
# reports the transition (the log line, ``relay_executor_transitions_total``), as it does one it wrote itself.
RECORDED_BY, GATEWAY_WRITER = "recordedBy", "gateway"


RECOVERY_SUCCEEDED = "executor.recovery.succeeded"
# The least time between two audit rows one transaction writes in order (the databases keep microseconds).
_AFTER = timedelta(microseconds=1)


@dataclass(frozen=True)
class RecoveredRow:
    """The ``executor.recovery.succeeded`` audit row ``delete_executor`` writes before the deletion."""

    event_key: str
    details: dict[str, Any]


@dataclass(frozen=True)
class Deleted:
    """``delete_executor``'s answer: whether this call deleted the row, and (with ``recovered``, written by this
    call) since when the executor was DEAD, for the recovery's metric."""

    deleted: bool
    dead_since: datetime | None = None


def _audit_row(*, org: str, app: str, executor_id: str, operation: str, event_key: str, now: datetime,
               details: dict[str, Any]) -> dict[str, Any]:
    return {"id": new_id(), "event_key": event_key, "org": org, "app": app, "executor_id": executor_id,
            "operation": operation, "status": "success", "subject": "system", "source_ip": "", "details": details,
            "emit_time": now}


def _row_values(status: ExecutorStatus, now: datetime, info: ExecutorInfo | None, connection_id: str | None,
                gateway_queue: str | None) -> dict[str, Any]:
    """The registry row's columns a status write sets."""
    values: dict[str, Any] = {"status": status, "updated_at": now}
    if info is not None:
        values |= {"app_version": info.application_version, "hostname": info.hostname,
                   "language": info.language, "dbos_version": info.dbos_version,
                   "executor_metadata": info.executor_metadata}
    if connection_id is not None:
        values |= {"connection_id": connection_id, "gateway_queue": gateway_queue}
    return values


def _write_status(c: Connection, *, org: str, app: str, executor_id: str, status: ExecutorStatus, operation: str,
                  event_key: str, info: ExecutorInfo | None, connection_id: str | None, gateway_queue: str | None,
                  details: dict[str, Any]) -> datetime | None:
    """Insert the audit row under ``event_key`` and, only if it was not there, upsert the registry row: their time,
    or None when the key had landed (this call wrote nothing).

    The audit row is the mark that the event landed, and its insert is the transaction's first write: the unique
    index, not a check read before it, decides which of two writers of one key (the gateway and the lifecycle
    workflow, or two tries of one activity) writes the event; the other waits there until the first commits. Every
    writer of a key takes the audit key, then the registry row, so none waits on another in the reverse order."""
    now = utcnow()
    if not insert_audit(c, _audit_row(org=org, app=app, executor_id=executor_id, operation=operation,
                                      event_key=event_key, now=now, details=details)):
        return None
    _write_row(c, org=org, app=app, executor_id=executor_id, status=status,
               values=_row_values(status, now, info, connection_id, gateway_queue), now=now)
    return now


def _write_row(c: Connection, *, org: str, app: str, executor_id: str, status: ExecutorStatus,
               values: dict[str, Any], now: datetime) -> None:
    """Upsert the registry row with ``values``."""
    key = {"k_org": org, "k_app": app, "k_executor_id": executor_id}
    was = c.execute(_STATUS, key).scalar()
    if was is None:
        if _INSERT_EXECUTOR(c, {"org": org, "app": app, "executor_id": executor_id, **_NEW_ROW, **values,
                                "created_at": now}):
            return
        was = c.execute(_STATUS, key).scalar()  # inserted meanwhile, under another event key: written over below
    if was == ExecutorStatus.DEAD and status == ExecutorStatus.HEALTHY:
        # Back before its recovery was let through: its ticket no longer waits at the gate (nor, for the
        # breaker, is it an executor gone down). A ticket let through stays: it says which peer carried a
        # recovery.
        c.execute(_DROP_WAITING_TICKET, key)
    c.execute(_UPDATE_EXECUTOR, key | values)


class RegistryStore(StoreBase):
    def list_executors(self, org: str, app: str) -> list[Executor]:
        with Session(self.engine) as s:
            return list(s.exec(select(Executor).where(Executor.org == org, Executor.app == app)
                               .order_by(col(Executor.created_at))).all())

    def gateway_identities(self, queues: set[str]) -> dict[str, str]:
        """The identity (``RELAY_GATEWAY_ID``) of each of these gateway processes, by task queue, for the ones on
        record (gone or not)."""
        if not queues:
            return {}
        with Session(self.engine) as s:
            rows = s.exec(select(GatewayProcess.queue, GatewayProcess.identity)
                          .where(col(GatewayProcess.queue).in_(sorted(queues)))).all()
        return dict(rows)

    def record_status(self, *, org: str, app: str, executor_id: str, status: ExecutorStatus, operation: str,
                      event_key: str, info: ExecutorInfo | None, connection_id: str | None,
                      gateway_queue: str | None, details: dict[str, Any]) -> StatusWritten:
        """Upsert the registry row and write its audit row, both at most once per ``event_key``; whether this call
        wrote them and, for a HEALTHY write, the ids of the app's DEAD executors (each one's workflow may be waiting
        for a peer) and whether the connection's gateway is already known gone: its watch may have swept the rows on
        it before this one named it (the lifecycle workflow took the ``connected`` in late), and then nothing else
        would ever disconnect it."""
        with self.engine.begin() as c:
            written_at = _write_status(c, org=org, app=app, executor_id=executor_id, status=status,
                                       operation=operation, event_key=event_key, info=info,
                                       connection_id=connection_id, gateway_queue=gateway_queue, details=details)
            now = written_at or c.execute(_LANDED_AT, {"event_key": event_key}).scalar_one()
            if status != ExecutorStatus.HEALTHY:
                return StatusWritten(written=written_at is not None, dead=[], at=now)
            # After the row's write, in its transaction: either the gateway's ``mark_gone`` came first and this
            # reads it, or it comes after this commits and the sweep behind it finds this row on that gateway.
            gone_at = None if gateway_queue is None else c.execute(_GATEWAY_GONE_AT, {"queue": gateway_queue}).scalar()
            return StatusWritten(written=written_at is not None, dead=dead_executors(c, org, app), at=now,
                                 gateway_gone=gone_at is not None)

    def begin_grace(self, *, org: str, app: str, executor_id: str, event_key: str,
                    details: dict[str, Any]) -> GraceBegun | None:
        """Record DISCONNECTED with the app's grace (``executorTimeoutSecs`` in the audit row), read in the same
        transaction, at most once per ``event_key``: a row already landed under it (the gateway's, or an earlier try)
        is answered as it was written. None when the app no longer exists.

        A row the gateway landed may since have been written HEALTHY again for that very connection: by this
        workflow taking in its ``connected`` after the gateway had written both (``move_healthy``, then
        ``record_disconnect``). The row is put back to DISCONNECTED, as of the landed time: the socket is closed."""
        with self.engine.begin() as c:
            grace = c.execute(_APP_GRACE, {"org": org, "app": app}).scalar()
            if grace is not None:  # an app gone writes nothing, but may still answer a row landed before
                at = _write_status(c, org=org, app=app, executor_id=executor_id, status=ExecutorStatus.DISCONNECTED,
                                   operation=DISCONNECTED_OPERATION, event_key=event_key, info=None,
                                   connection_id=None, gateway_queue=None,
                                   details={**details, **rest_durations({GRACE_DETAIL: grace})})
                if at is not None:
                    return GraceBegun(at=at, grace=grace, written=True)
            landed = c.execute(_LANDED, {"event_key": event_key}).one_or_none()
            if landed is None:
                return None
            said = landed.details or {}
            secs = said.get(GRACE_DETAIL)
            grace = timedelta(seconds=secs) if secs is not None else grace
            if grace is not None and said.get("connection_id"):
                c.execute(_DISCONNECT_HEALTHY, {
                    "k_org": org, "k_app": app, "k_executor_id": executor_id,
                    "k_healthy": ExecutorStatus.HEALTHY, "k_connection_id": said["connection_id"],
                    "status": ExecutorStatus.DISCONNECTED, "updated_at": landed.emit_time})
            return None if grace is None else GraceBegun(at=landed.emit_time, grace=grace, written=False,
                                                         by_gateway=said.get(RECORDED_BY) == GATEWAY_WRITER)

    def record_disconnect(self, *, org: str, app: str, executor_id: str, connection_id: str,
                          event_key: str) -> bool:
        """The gateway's own DISCONNECTED for a socket it saw close, written as it signals ``disconnected``: only
        over a row HEALTHY for that very socket (the lifecycle workflow's, or the gateway's ``move_healthy``), so it
        is the same step the workflow takes on that signal, under the same event key (``disconnect_event_key``), and
        whichever writes it second finds it landed (``begin_grace``). Any other row (a newer connection recorded,
        DEAD, none yet) is left to the workflow. The workflow still decides everything after: the grace, DEAD, the
        recovery. True when this call wrote it."""
        key = {"k_org": org, "k_app": app, "k_executor_id": executor_id}
        with self.engine.connect() as c, c.begin() as transaction:
            grace = c.execute(_APP_GRACE, {"org": org, "app": app}).scalar()
            if grace is None:
                return False
            now = utcnow()
            # The audit row first, as every writer of the key does (``_write_status``): landed already, it is the
            # workflow's.
            if not insert_audit(c, _audit_row(org=org, app=app, executor_id=executor_id,
                                              operation=DISCONNECTED_OPERATION, event_key=event_key, now=now,
                                              details={"connection_id": connection_id, RECORDED_BY: GATEWAY_WRITER,
                                                       **rest_durations({GRACE_DETAIL: grace})})):
                return False
            moved = c.execute(_DISCONNECT_HEALTHY, key | {
                "k_healthy": ExecutorStatus.HEALTHY, "k_connection_id": connection_id,
                "status": ExecutorStatus.DISCONNECTED, "updated_at": now})
            if moved.rowcount != 1:
                # Not that socket's HEALTHY row: the audit row goes too, and the workflow's ``begin_grace``, which
                # may be waiting on its key, writes its own.
                transaction.rollback()
                return False
        return True

    def row_seen(self, org: str, app: str, executor_id: str) -> RowSeen | None:
        """The executor's registry row as ``move_healthy`` compares it; None when it has none."""
        return self.rows_seen([(org, app, executor_id)]).get((org, app, executor_id))

    def rows_seen(self, executors: list[tuple[str, str, str]]) -> dict[tuple[str, str, str], RowSeen]:
        """``row_seen`` for many executors in one query per ``ROWS_SEEN_AT_ONCE`` (a burst of connects: a
        gateway's batch); those with no row are left out."""
        out: dict[tuple[str, str, str], RowSeen] = {}
        with self.engine.connect() as c:
            for start in range(0, len(executors), ROWS_SEEN_AT_ONCE):
                chunk = executors[start:start + ROWS_SEEN_AT_ONCE]
                for row in c.execute(_SEEN_MANY.where(_KEY.in_(chunk))):
                    out[(row.org, row.app, row.executor_id)] = RowSeen(ExecutorStatus(row.status),
                                                                       row.connection_id or "", row.updated_at)
        return out

    def move_healthy(self, *, org: str, app: str, executor_id: str, seen: RowSeen, connection_id: str,
                     gateway_queue: str, info: ExecutorInfo) -> Move:
        """The gateway's own write of a HEALTHY executor's new socket, once its ``connected`` landed in Temporal:
        the row names the new connection and gateway at once, not when the lifecycle workflow takes the signal in
        (behind a backlog, as when a killed gateway's executors all move at once, that can be most of a grace).

        Written only over the row exactly as ``seen`` before the signal was sent (HEALTHY, another connection, the
        same write time), so it never undoes a write that came after: any later event of the executor lands in
        Temporal after this signal, and the workflow (or a gateway) writes it after this read. An event from before
        it that the workflow has yet to take in may still write an older row over this one; the workflow then
        writes this connection itself when it takes it in, as it always does, with its gone check
        (``record_status``). No audit row: the workflow's write audits the move. ``Move.ALREADY`` when the row
        names this socket already (its workflow was first: in a quiet moment it takes the signal in before the
        gateway writes); ``Move.LOST`` when another write came in between, or when this gateway is known gone (read
        after the write, in its transaction, as ``record_status`` does: the sweep of a gateway marked gone after
        this commits finds the row on it)."""
        if seen.connection_id == connection_id:
            return Move.ALREADY
        if seen.status != ExecutorStatus.HEALTHY:
            return Move.LOST
        key = {"k_org": org, "k_app": app, "k_executor_id": executor_id}
        values = _row_values(ExecutorStatus.HEALTHY, utcnow(), info, connection_id, gateway_queue)
        with self.engine.connect() as c, c.begin() as transaction:
            moved = c.execute(_MOVE_HEALTHY, key | values | {
                "k_healthy": ExecutorStatus.HEALTHY, "k_connection_id": seen.connection_id,
                "k_updated_at": seen.updated_at})
            if moved.rowcount != 1:
                now = c.execute(_HEALTHY_CONNECTION, key | {"k_healthy": ExecutorStatus.HEALTHY}).scalar()
                return Move.ALREADY if now == connection_id else Move.LOST
            if c.execute(_GATEWAY_GONE_AT, {"queue": gateway_queue}).scalar() is not None:
                transaction.rollback()
                return Move.LOST
        return Move.WRITTEN

    def dead_since(self, *, org: str, app: str, executor_id: str) -> datetime | None:
        """When the executor was recorded DEAD (its row's last write), or None when it is not DEAD."""
        with Session(self.engine) as s:
            row = s.get(Executor, (org, app, executor_id))
        return row.updated_at if row is not None and row.status == ExecutorStatus.DEAD else None

    def delete_executor(self, *, org: str, app: str, executor_id: str, event_key: str,
                        details: dict[str, Any], recovered: RecoveredRow | None = None) -> Deleted:
        """Delete the executor's registry row and its recovery claim, audited, at most once per ``event_key``.

        ``recovered``: the ``executor.recovery.succeeded`` row to write first, in the same transaction (a confirmed
        recovery, then its deletion: one write where there were three, the row, the DEAD time its metric reads, the
        deletion); the answer says when the row was DEAD since, read before it goes."""
        key = {"k_org": org, "k_app": app, "k_executor_id": executor_id}
        now = utcnow()
        with self.engine.begin() as c:
            dead_since = None
            if recovered is not None:
                row = c.execute(_DEAD_SINCE, key).first()
                dead_since = row.updated_at if row is not None and row.status == ExecutorStatus.DEAD else None
                written = insert_audit(c, _audit_row(org=org, app=app, executor_id=executor_id,
                                                     operation=RECOVERY_SUCCEEDED, event_key=recovered.event_key,
                                                     now=now, details=recovered.details))
                if not written:
                    dead_since = None  # an earlier try wrote it (and reported it)
                now += _AFTER  # the deletion's row after the success row, in every listing ordered by time
            if not insert_audit(c, _audit_row(org=org, app=app, executor_id=executor_id, operation="executor.deleted",
                                              event_key=event_key, now=now, details=details)):
                return Deleted(False, dead_since)  # an earlier try of the same activity deleted them
            c.execute(_DELETE_EXECUTOR, key)
            c.execute(_DELETE_CLAIM, key)
        return Deleted(True, dead_since)

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

    def executor_counts(self, org: str) -> Counter[tuple[str, str, str]]:
        """The org's registry rows counted by ``(org, app, status)``."""
        with Session(self.engine) as s:
            rows = s.exec(select(Executor.org, Executor.app, Executor.status).where(Executor.org == org)).all()
        return Counter((org, app, str(status)) for org, app, status in rows)

    def executors_on_gateway(self, gateway_queue: str) -> list[tuple[str, str, str, str]]:
        """``(org, app, executor_id, connection_id)`` of the executors whose last socket was on that gateway and
        is not known to its workflow to be gone: HEALTHY, and DISCONNECTED too, since the gateway writes DISCONNECTED
        as a socket closes (``record_disconnect``) and may not have got its ``disconnected`` signal to Temporal (cut
        off from it, then dead). A signal for a close the workflow already took in is stale there and changes
        nothing."""
        with Session(self.engine) as s:
            rows = s.exec(select(Executor).where(
                Executor.gateway_queue == gateway_queue,
                col(Executor.status).in_([ExecutorStatus.HEALTHY, ExecutorStatus.DISCONNECTED]))).all()
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
