"""Drain, pause and the recovery gate (``core.gate``, the pure decision): the rows an operator sets, and the
admission of each recovery under the app's gate row lock, with its tickets and the breaker's audit rows."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import bindparam, func
from sqlalchemy import delete as sa_delete
from sqlmodel import Session, col, or_, select

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
            _gate_audit(s, decision, org=org, app=app, executor_id=executor_id, trips=breaker.trips,
                        policy=policy, event_key=event_key)
            kept = now - max(policy.window, TICKETS_KEPT)  # finished tickets stop counting after a while
            c.execute(_PRUNE_TICKETS, {"org": org, "app": app, "me": executor_id, "kept": kept})
            if own is not None and mine.granted_at is not None and mine.died_at < kept:
                s.delete(own)
            s.commit()
            return decision
