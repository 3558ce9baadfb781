"""Drain, pause and the recovery gate (``core.gate``, the pure decision): the rows an operator sets, and the
admission of each recovery under the app's gate row lock, with its tickets and the breaker's audit rows."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, bindparam, exists, func, union
from sqlalchemy import delete as sa_delete
from sqlmodel import Session, col, select

from core import gate, units
from core.errors import NotFoundError
from core.models import AuditLog, Executor, ExecutorDrain, RecoveryGate, RecoveryPause, RecoveryTicket
from core.store.audit import insert_audit
from core.store.base import InsertOnce, StoreBase, app_row
from core.store.registry import dead_executors
from core.types import ExecutorStatus
from core.units import utcnow

# Let-through tickets are kept this long (or a storm window, if longer): they spread recoveries over the peers.
TICKETS_KEPT = timedelta(hours=1)

# What the breaker reads of an app (``core.gate.Fleet``), as counts in the database, on the admission's connection.
# Reading the rows instead (every down executor and every recent ticket, into Python) made each admission of a burst
# of deaths cost as much as all the deaths before it: at 1,000 at once, 41 % of the worker's CPU, under the database's
# write lock (``python -m tests.bench.profile cpu-burst``). Each of these is a few index range scans in the database.
_T, _E = RecoveryTicket.__table__, Executor.__table__  # type: ignore[attr-defined]
_T2 = _T.alias("mine_paused")
_APP_T = (_T.c.org == bindparam("org"), _T.c.app == bindparam("app"))
_APP_E = (_E.c.org == bindparam("org"), _E.c.app == bindparam("app"))
# Another executor's ticket of a death since the window began.
_OTHERS_RECENT = (*_APP_T, _T.c.executor_id != bindparam("me"), _T.c.died_at >= bindparam("since"))
# A registry row gone down since the window began, unless its own recent ticket waited for a pause.
_ROW_DOWN = (*_APP_E, _E.c.status.in_([ExecutorStatus.DISCONNECTED, ExecutorStatus.DEAD]),
             _E.c.updated_at >= bindparam("since"),
             ~exists().where(_T2.c.org == _E.c.org, _T2.c.app == _E.c.app, _T2.c.executor_id == _E.c.executor_id,
                             _T2.c.died_at >= bindparam("since"), _T2.c.paused.is_(True)))
# The others gone down (each once: a recent ticket, or a row gone down, or both).
_DOWN_OTHERS = select(func.count()).select_from(union(
    select(_T.c.executor_id).where(*_OTHERS_RECENT, _T.c.paused.is_(False)),
    select(_E.c.executor_id).where(*_ROW_DOWN, _E.c.executor_id != bindparam("me"))).subquery())
# The asker's own row gone down.
_ME_DOWN = select(func.count()).select_from(_E).where(*_ROW_DOWN, _E.c.executor_id == bindparam("me"))
# The app's executors, and the others that died within the window and have no registry row (deleted: recovered).
_POPULATION = select(func.count()).select_from(_E).where(*_APP_E)
_GONE_RECENT = select(func.count()).select_from(_T).where(*_OTHERS_RECENT, ~exists().where(
    _E.c.org == _T.c.org, _E.c.app == _T.c.app, _E.c.executor_id == _T.c.executor_id))
_ME_REGISTERED = select(func.count()).select_from(_E).where(*_APP_E, _E.c.executor_id == bindparam("me"))
# ``core.gate.storm_over``'s two conditions, as the existence of what breaks them.
_ANOTHER_RECENT = select(exists().where(*_OTHERS_RECENT))
_ANOTHER_WAITING = select(exists().where(*_APP_T, _T.c.executor_id != bindparam("me"), _T.c.granted_at.is_(None),
                                         exists().where(_E.c.org == _T.c.org, _E.c.app == _T.c.app,
                                                        _E.c.executor_id == _T.c.executor_id,
                                                        _E.c.status == ExecutorStatus.DEAD)))


class _Counted:
    """``core.gate.Fleet`` as counts in the database (``core.gate.InMemory``'s answers, the same by
    tests/unit/test_gate.py on both databases), on the connection holding the gate's row lock."""

    def __init__(self, c: Connection, org: str, app: str) -> None:
        self._c, self._org, self._app = c, org, app

    def _scalar(self, statement: Any, **params: Any) -> Any:
        return self._c.execute(statement, {"org": self._org, "app": self._app, **params}).scalar_one()

    def storm_size(self, since: datetime, executor_id: str, ticket: gate.Ticket) -> tuple[int, int]:
        at = {"me": executor_id, "since": since}
        recent = ticket.died_at >= since
        down = self._scalar(_DOWN_OTHERS, **at) + int(
            (recent and not ticket.paused) or (not (recent and ticket.paused) and self._scalar(_ME_DOWN, **at) > 0))
        population = self._scalar(_POPULATION) + self._scalar(_GONE_RECENT, **at) + int(
            recent and not self._scalar(_ME_REGISTERED, me=executor_id))
        return down, population

    def storm_over(self, since: datetime, executor_id: str) -> bool:
        at = {"me": executor_id, "since": since}
        return not self._scalar(_ANOTHER_RECENT, **at) and not self._scalar(_ANOTHER_WAITING, **at)


# Statements built once (Core, on the session's connection, not ORM-enabled): built and compiled on every admission,
# with the ORM's synchronization of the session, these two cost a burst of deaths ~2 ms each under the write lock.
_GATES = InsertOnce(RecoveryGate, "org", "app")
# Finished tickets of others that died before ``kept``: they stopped counting.
_PRUNE_TICKETS = sa_delete(RecoveryTicket).where(
    col(RecoveryTicket.org) == bindparam("org"), col(RecoveryTicket.app) == bindparam("app"),
    col(RecoveryTicket.executor_id) != bindparam("me"), col(RecoveryTicket.granted_at).is_not(None),
    col(RecoveryTicket.died_at) < bindparam("kept"))
# An operator's drain of an executor and pause of an app: one row each, replaced by the next (``InsertOnce.put``).
_DRAINS = InsertOnce(ExecutorDrain, "org", "app", "executor_id")
_PAUSES = InsertOnce(RecoveryPause, "org", "app")


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


def _gate_audit(s: Session, decision: gate.Decision, *, org: str, app: str, executor_id: str, trips: int,
                policy: gate.GatePolicy, event_key: str) -> None:
    """The gate's audit rows, in its transaction: a retried admission finds the state they record (tripped,
    reset, held for that reason) already written, so none lands twice; the trip's row also has a unique key."""
    if decision.reset:
        s.add(AuditLog(org=org, app=app, executor_id=executor_id, operation="app.recovery.breaker_reset",
                       details={"trips": trips}))
    if decision.tripped:
        insert_audit(s.connection(), AuditLog(
            org=org, app=app, executor_id=executor_id, operation="app.recovery.breaker_tripped", status="failure",
            event_key=gate.breaker_event_key(org, app, trips),
            details={**decision.storm, "trip": trips, "stormShare": policy.storm_share,
                     "stormMinExecutors": policy.storm_min,
                     **units.rest_durations({"stormWindowMs": policy.window, "paceMs": policy.pace})}))
    if decision.first_hold and decision.until is not None:
        s.add(AuditLog(org=org, app=app, executor_id=executor_id, operation="executor.recovery.held",
                       details={"reason": decision.reason, "until": decision.until.isoformat(),
                                **({"workflowEvent": event_key} if event_key else {})}))


class GateStore(StoreBase):
    def set_drain(self, *, org: str, app: str, executor_id: str, until: datetime, reason: str, subject: str,
                  source_ip: str, details: dict[str, Any]) -> ExecutorDrain:
        """Drain a registered executor until ``until`` (replacing any drain of it), audited. 404: unknown app or
        executor."""
        with Session(self.engine) as s:
            app_row(s, org, app)
            if s.get(Executor, (org, app, executor_id)) is None:
                raise NotFoundError(f"executor {executor_id!r} of app {app!r} not found")
            row = _DRAINS.put(s, ExecutorDrain(org=org, app=app, executor_id=executor_id, until=until,
                                               subject=subject, reason=reason, created_at=utcnow()))
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
            app_row(s, org, app)
            row = s.get(ExecutorDrain, (org, app, executor_id))
            if row is None:
                raise NotFoundError(f"executor {executor_id!r} of app {app!r} is not drained")
            s.delete(row)
            s.add(AuditLog(org=org, app=app, executor_id=executor_id, operation="executor.drain.cleared",
                           subject=subject, source_ip=source_ip, details={"until": row.until.isoformat()}))
            s.commit()
            return dead_executors(s.connection(), org, app)

    def list_drains(self, org: str, app: str) -> list[ExecutorDrain]:
        """The app's drains, expired ones included (they are ignored, not deleted), by executor id. 404: no app."""
        with Session(self.engine) as s:
            app_row(s, org, app)
            return list(s.exec(select(ExecutorDrain).where(ExecutorDrain.org == org, ExecutorDrain.app == app)
                               .order_by(col(ExecutorDrain.executor_id))).all())

    def set_pause(self, *, org: str, app: str, until: datetime, reason: str, subject: str, source_ip: str,
                  details: dict[str, Any]) -> RecoveryPause:
        """Pause the app's recoveries until ``until`` (replacing any pause), audited. 404: unknown app."""
        with Session(self.engine) as s:
            app_row(s, org, app)
            row = _PAUSES.put(s, RecoveryPause(org=org, app=app, until=until, reason=reason, subject=subject,
                                               created_at=utcnow()))
            s.add(AuditLog(org=org, app=app, operation="app.recovery.paused", subject=subject, source_ip=source_ip,
                           details={**details, "until": until.isoformat(), "reason": reason}))
            s.commit()
            s.refresh(row)
            return row

    def clear_pause(self, *, org: str, app: str, subject: str, source_ip: str) -> None:
        """Lift the app's pause (expired or not), audited. 404: unknown app, or no pause."""
        with Session(self.engine) as s:
            app_row(s, org, app)
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
            app_row(s, org, app)
            waiting = s.exec(select(RecoveryTicket).where(
                RecoveryTicket.org == org, RecoveryTicket.app == app, col(RecoveryTicket.granted_at).is_(None))
                .order_by(col(RecoveryTicket.died_at))).all()
            return s.get(RecoveryPause, (org, app)), s.get(RecoveryGate, (org, app)), list(waiting)

    def admit_recovery(self, *, org: str, app: str, executor_id: str, ticket: str, now: datetime,
                       policy: gate.GatePolicy, event_key: str = "") -> gate.Decision:
        """Ask the app's recovery gate whether ``executor_id``'s recovery (death ``ticket``) may go at ``now``
        (``core.gate.admit``), in one transaction under the gate's row lock. Writes the breaker's alert
        (``app.recovery.breaker_tripped``, once per storm), its reset, and the first hold of each kind.

        The lock: the gate row, created the first time, is locked before anything is read (``InsertOnce.lock``: a
        write, so SQLite takes its write lock, then ``SELECT ... FOR UPDATE``, PostgreSQL's row lock); concurrent
        admissions of one app then run one after the other.
        """
        with Session(self.engine) as s:
            row = _GATES.lock(s, RecoveryGate(org=org, app=app))
            row.version += 1
            pause = s.get(RecoveryPause, (org, app))
            own = s.get(RecoveryTicket, (org, app, executor_id))
            breaker = gate.Breaker(row.tripped_at, row.trips, row.last_slot_at, row.last_granted_at)
            mine, decision = gate.admit(
                executor_id=executor_id, key=ticket, now=now, ticket=_ticket(own) if own is not None else None,
                breaker=breaker, pause_until=pause.until if pause else None, fleet=_Counted(s.connection(), org, app),
                policy=policy)
            row.tripped_at, row.trips = breaker.tripped_at, breaker.trips
            row.last_slot_at, row.last_granted_at = breaker.last_slot_at, breaker.last_granted_at
            s.add(row)
            _store_ticket(s, own, mine, org=org, app=app, executor_id=executor_id)
            _gate_audit(s, decision, org=org, app=app, executor_id=executor_id, trips=breaker.trips,
                        policy=policy, event_key=event_key)
            kept = now - max(policy.window, TICKETS_KEPT)  # finished tickets stop counting after a while
            s.connection().execute(_PRUNE_TICKETS, {"org": org, "app": app, "me": executor_id, "kept": kept})
            if own is not None and mine.granted_at is not None and mine.died_at < kept:
                s.delete(own)
            s.commit()
            return decision
