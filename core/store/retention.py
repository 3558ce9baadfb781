"""Workflow retention (the executors' own garbage collection, asked for by Relay's retention rounds): which apps
have a retention setting, which executor runs an app's round, and the round's audit rows and last start."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlmodel import Session, and_, col, or_, select

from core import candidates
from core.models import Application, AuditLog, RetentionState
from core.store.audit import insert_audit
from core.store.base import InsertOnce, StoreBase
from core.store.claims import eligible

_STATES = InsertOnce(RetentionState, "org", "app")


class RetentionStore(StoreBase):
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
            best = candidates.select_retention_executor(eligible(s, org, app), exclude=exclude, latest=latest)
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
            if not insert_audit(s.connection(), AuditLog(event_key=event_key, org=org, app=app,
                                                         executor_id=executor_id, operation=operation,
                                                         status=status, details=details)):
                return False  # a retried activity: this event already landed
            if started_at is not None:
                state = _STATES.lock(s, RetentionState(org=org, app=app, last_started_at=started_at))
                state.last_started_at = max(state.last_started_at, started_at)
                state.executor_id, state.request_id = executor_id, request_id
                s.add(state)
            s.commit()
        return True
