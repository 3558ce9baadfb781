"""Drain, pause and the recovery gate (``core.gate``, the pure decision): the rows an operator sets, and the
admission of each recovery under the app's gate row lock, with its tickets and the breaker's audit rows."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, bindparam, exists, func, union, update
from sqlalchemy import delete as sa_delete
from sqlalchemy import select as sa_select
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
# All five in one statement (one round trip, one statement's overhead).
_STORM = sa_select(_DOWN_OTHERS.scalar_subquery().label("down_others"), _ME_DOWN.scalar_subquery().label("me_down"),
                   _POPULATION.scalar_subquery().label("population"),
                   _GONE_RECENT.scalar_subquery().label("gone_recent"),
                   _ME_REGISTERED.scalar_subquery().label("me_registered"))
# ``core.gate.storm_over``'s two conditions, as the existence of what breaks them, in one statement.
_OVER = sa_select(exists().where(*_OTHERS_RECENT).label("another_recent"),
                  exists().where(*_APP_T, _T.c.executor_id != bindparam("me"), _T.c.granted_at.is_(None),
                                 exists().where(_E.c.org == _T.c.org, _E.c.app == _T.c.app,
                                                _E.c.executor_id == _T.c.executor_id,
                                                _E.c.status == ExecutorStatus.DEAD)).label("another_waiting"))


class _Counted:
    """``core.gate.Fleet`` as counts in the database (``core.gate.InMemory``'s answers, the same by
    tests/unit/test_gate.py on both databases), on the connection holding the gate's row lock."""

    def __init__(self, c: Connection, org: str, app: str) -> None:
        self._c, self._org, self._app = c, org, app

    def _row(self, statement: Any, executor_id: str, since: datetime) -> Any:
        return self._c.execute(statement, {"org": self._org, "app": self._app, "me": executor_id,
                                           "since": since}).one()

    def storm_size(self, since: datetime, executor_id: str, ticket: gate.Ticket) -> tuple[int, int]:
        n = self._row(_STORM, executor_id, since)
        recent = ticket.died_at >= since
        down = n.down_others + int((recent and not ticket.paused) or (not (recent and ticket.paused) and n.me_down > 0))
        return down, n.population + n.gone_recent + int(recent and not n.me_registered)

    def storm_over(self, since: datetime, executor_id: str) -> bool:
        n = self._row(_OVER, executor_id, since)
        return not n.another_recent and not n.another_waiting


# Statements built once (Core, on the session's connection, not ORM-enabled): built and compiled on every admission,
# with the ORM's synchronization of the session, these two cost a burst of deaths ~2 ms each under the write lock.
_GATES = InsertOnce(RecoveryGate, "org", "app")
# Finished tickets of others that died before ``kept``: they stopped counting.
_PRUNE_TICKETS = sa_delete(RecoveryTicket).where(
    col(RecoveryTicket.org) == bindparam("org"), col(RecoveryTicket.app) == bindparam("app"),
    col(RecoveryTicket.executor_id) != bindparam("me"), col(RecoveryTicket.granted_at).is_not(None),
    col(RecoveryTicket.died_at) < bindparam("kept"))
# The admission's own reads and writes, as plain statements on one connection: through the ORM (its gets, unit of
# work and commit) they were two thirds of an admission's cost, under the database's write lock in a burst of deaths.
_G = RecoveryGate.__table__  # type: ignore[attr-defined]
_GATE_KEY = (_G.c.org == bindparam("org"), _G.c.app == bindparam("app"))
_GATE_ROW = select(_G).where(*_GATE_KEY).with_for_update()
# (An UPDATE's key bound as ``k_*``: it reserves its columns' own names for its SET clause.)
_GATE_WRITE = update(_G).where(_G.c.org == bindparam("k_org"), _G.c.app == bindparam("k_app")).values(
    tripped_at=bindparam("tripped_at"), trips=bindparam("trips"), last_slot_at=bindparam("last_slot_at"),
    last_granted_at=bindparam("last_granted_at"), version=_G.c.version + 1)
_PAUSE_UNTIL = select(col(RecoveryPause.until)).where(col(RecoveryPause.org) == bindparam("org"),
                                                      col(RecoveryPause.app) == bindparam("app"))
_OWN_TICKET = select(_T).where(*_APP_T, _T.c.executor_id == bindparam("me"))
_TICKET_WRITE = update(_T).where(_T.c.org == bindparam("k_org"), _T.c.app == bindparam("k_app"),
                                  _T.c.executor_id == bindparam("k_me"))
_TICKET_NEW = InsertOnce(RecoveryTicket, "org", "app", "executor_id")
_TICKET_DELETE = sa_delete(RecoveryTicket).where(
    col(RecoveryTicket.org) == bindparam("org"), col(RecoveryTicket.app) == bindparam("app"),
    col(RecoveryTicket.executor_id) == bindparam("me"))
# An operator's drain of an executor and pause of an app: one row each, replaced by the next (``InsertOnce.put``).
_DRAINS = InsertOnce(ExecutorDrain, "org", "app", "executor_id")
_PAUSES = InsertOnce(RecoveryPause, "org", "app")


def _ticket(row: Any) -> gate.Ticket:
    """A ticket as the gate reads it, from its row (an object or a plain row)."""
    return gate.Ticket(key=row.ticket, died_at=row.died_at, slot_at=row.slot_at, granted_at=row.granted_at,
                       paused=row.paused, held=row.held)


def _store_ticket(c: Connection, stored: Any, ticket: gate.Ticket, *, org: str, app: str, executor_id: str) -> None:
    """Write the executor's ticket: a new row, or its stored row (``stored``, a plain row) updated."""
    values = {"ticket": ticket.key, "died_at": ticket.died_at, "slot_at": ticket.slot_at,
              "granted_at": ticket.granted_at, "paused": ticket.paused, "held": ticket.held}
    if stored is None:
        _TICKET_NEW(c, {"org": org, "app": app, "executor_id": executor_id, "candidate_id": None, **values})
        return
    if stored.ticket != ticket.key:
        values["candidate_id"] = None  # an earlier death's
    c.execute(_TICKET_WRITE.values(**values), {"k_org": org, "k_app": app, "k_me": executor_id})


def _gate_audit(c: Connection, decision: gate.Decision, *, org: str, app: str, executor_id: str, trips: int,
                policy: gate.GatePolicy, event_key: str) -> None:
    """The gate's audit rows, in its transaction: a retried admission finds the state they record (tripped,
    reset, held for that reason) already written, so none lands twice; the trip's row also has a unique key."""
    if decision.reset:
        insert_audit(c, AuditLog(org=org, app=app, executor_id=executor_id, operation="app.recovery.breaker_reset",
                                 details={"trips": trips}))
    if decision.tripped:
        insert_audit(c, AuditLog(
            org=org, app=app, executor_id=executor_id, operation="app.recovery.breaker_tripped", status="failure",
            event_key=gate.breaker_event_key(org, app, trips),
            details={**decision.storm, "trip": trips, "stormShare": policy.storm_share,
                     "stormMinExecutors": policy.storm_min,
                     **units.rest_durations({"stormWindowMs": policy.window, "paceMs": policy.pace})}))
    if decision.first_hold and decision.until is not None:
        insert_audit(c, AuditLog(org=org, app=app, executor_id=executor_id, operation="executor.recovery.held",
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

        The lock: the gate row, created the first time, is locked before anything is read (inserted if absent: a
        write, so SQLite takes its write lock; then ``SELECT ... FOR UPDATE``, PostgreSQL's row lock); concurrent
        admissions of one app then run one after the other.
        """
        at = {"org": org, "app": app, "me": executor_id}
        with self.engine.begin() as c:
            row = None
            for _ in range(3):  # the row may be deleted between the two statements (its app deleted): insert again
                _GATES(c, {"org": org, "app": app, "tripped_at": None, "trips": 0, "last_slot_at": None,
                           "last_granted_at": None, "version": 0})
                row = c.execute(_GATE_ROW, at).first()
                if row is not None:
                    break
            if row is None:
                raise RuntimeError(f"could not lock the recovery gate of {org}/{app}")
            pause_until = c.execute(_PAUSE_UNTIL, at).scalar()
            own = c.execute(_OWN_TICKET, at).first()
            breaker = gate.Breaker(row.tripped_at, row.trips, row.last_slot_at, row.last_granted_at)
            mine, decision = gate.admit(
                executor_id=executor_id, key=ticket, now=now, ticket=_ticket(own) if own is not None else None,
                breaker=breaker, pause_until=pause_until, fleet=_Counted(c, org, app), policy=policy)
            c.execute(_GATE_WRITE, {"k_org": org, "k_app": app, "tripped_at": breaker.tripped_at,
                                    "trips": breaker.trips, "last_slot_at": breaker.last_slot_at,
                                    "last_granted_at": breaker.last_granted_at})
            _store_ticket(c, own, mine, org=org, app=app, executor_id=executor_id)
            _gate_audit(c, decision, org=org, app=app, executor_id=executor_id, trips=breaker.trips,
                        policy=policy, event_key=event_key)
            kept = now - max(policy.window, TICKETS_KEPT)  # finished tickets stop counting after a while
            c.execute(_PRUNE_TICKETS, {**at, "kept": kept})
            if own is not None and mine.granted_at is not None and mine.died_at < kept:
                c.execute(_TICKET_DELETE, at)
            return decision
