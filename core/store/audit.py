"""The audit log: writing a row (once per event key), reading and querying it for the REST API, pruning it for the
retention, and the audit subjects (``system`` or the key an action was taken with)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import delete as sa_delete
from sqlmodel import Session, and_, col, or_, select

from core.models import ApiKey, AuditLog
from core.store.base import InsertOnce, Principal, StoreBase

# Audit subjects are stored as "system" or "api_key:<key id>" (older rows: "key:<key name>").
API_KEY_SUBJECT = "api_key:"
SYSTEM_SUBJECT = "system"
TOKEN_OPERATIONS = ("token.created", "token.deleted")
# An audit row with an ``event_key`` lands once per key: whoever inserts it first wrote the event, and a writer that
# finds it there (an earlier try of the same activity, or the other writer of a step two may write) wrote nothing.
# A row without one (NULL, never equal to another in a unique index) always lands.
insert_audit = InsertOnce(AuditLog, "event_key")


def subject_of_key(key_id: str) -> str:
    return API_KEY_SUBJECT + key_id


def subject_of(principal: Principal) -> str:
    """The audit subject for an action taken with this key."""
    return subject_of_key(principal.key_id)


def _key_names(s: Session, subjects: list[str]) -> dict[str, str]:
    key_ids = {subject.removeprefix(API_KEY_SUBJECT) for subject in subjects if subject.startswith(API_KEY_SUBJECT)}
    if not key_ids:
        return {}
    return dict(s.exec(select(ApiKey.id, ApiKey.name).where(col(ApiKey.id).in_(key_ids))).all())


class AuditStore(StoreBase):
    def write_audit(self, *, org: str, operation: str, app: str | None = None, executor_id: str | None = None,
                    status: str = "success", subject: str = "system", source_ip: str = "",
                    details: dict[str, Any] | None = None, event_key: str | None = None) -> bool:
        """Write one audit row; False when an earlier try of the same activity wrote it (the same ``event_key``)."""
        with self.engine.begin() as c:
            return insert_audit(c, AuditLog(event_key=event_key, org=org, app=app, executor_id=executor_id,
                                            operation=operation, status=status, subject=subject, source_ip=source_ip,
                                            details=details))

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
