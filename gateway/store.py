"""All database access: keys, applications, the executor registry and the audit log.

One ``Store`` wraps one engine. Methods are synchronous (SQLAlchemy); async callers run them in a thread.
"""

from __future__ import annotations

import hashlib
import hmac
import random
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import IntegrityError
from sqlmodel import Session, col, select

from gateway.errors import AuthError, ForbiddenError, NotFoundError
from gateway.models import ApiKey, Application, AuditLog, Executor, ExecutorStatus, utcnow

KEY_PREFIX = "dbos_"
UNSET: Any = object()


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def redact(key: str) -> str:
    """What may appear of a key in logs and errors: its prefix only."""
    return key[:9] + "…" if key.startswith(KEY_PREFIX) else "…"


@dataclass(frozen=True)
class Principal:
    """Who a valid key speaks for."""

    key_id: str
    key_name: str
    org: str
    apps: tuple[str, ...] | None

    def allows(self, app: str) -> bool:
        return self.apps is None or app in self.apps


class Store:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

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

    def authorize(self, key: str, org: str, app: str | None = None) -> Principal:
        principal = self.authenticate(key)
        if principal.org != org:
            raise ForbiddenError(f"this key does not belong to org {org!r}")
        if app is not None and not principal.allows(app):
            raise ForbiddenError(f"this key is not allowed for app {app!r}")
        return principal

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
                           details={k: _jsonable(v) for k, v in changes.items()}))
            s.commit()
            s.refresh(app)
            return app

    # -- executor registry (written on behalf of the lifecycle workflow) -----------------------------------

    def list_executors(self, org: str, app: str) -> list[Executor]:
        with Session(self.engine) as s:
            return list(s.exec(select(Executor).where(Executor.org == org, Executor.app == app)
                               .order_by(col(Executor.created_at))).all())

    def get_executor(self, org: str, app: str, executor_id: str) -> Executor | None:
        with Session(self.engine) as s:
            return s.get(Executor, (org, app, executor_id))

    def record_status(self, *, org: str, app: str, executor_id: str, status: ExecutorStatus, operation: str,
                      event_key: str, info: dict[str, Any] | None, connection_id: str | None,
                      gateway_queue: str | None, details: dict[str, Any]) -> None:
        """Upsert the registry row and write its audit row, both at most once per ``event_key``."""
        with Session(self.engine) as s:
            if s.exec(select(AuditLog.id).where(AuditLog.event_key == event_key)).first() is not None:
                return  # a retried activity: this event already landed
            now = utcnow()
            row = s.get(Executor, (org, app, executor_id))
            if row is None:
                row = Executor(org=org, app=app, executor_id=executor_id, created_at=now)
            row.status = status
            row.updated_at = now
            if info is not None:
                row.app_version = info.get("application_version") or ""
                row.hostname = info.get("hostname")
                row.language = info.get("language")
                row.dbos_version = info.get("dbos_version")
                row.executor_metadata = info.get("executor_metadata")
            if connection_id is not None:
                row.connection_id = connection_id
                row.gateway_queue = gateway_queue
            s.add(row)
            s.add(AuditLog(event_key=event_key, org=org, app=app, executor_id=executor_id,
                           operation=operation, details=details, emit_time=now))
            s.commit()

    def delete_executor(self, *, org: str, app: str, executor_id: str, event_key: str,
                        details: dict[str, Any]) -> None:
        with Session(self.engine) as s:
            if s.exec(select(AuditLog.id).where(AuditLog.event_key == event_key)).first() is not None:
                return
            row = s.get(Executor, (org, app, executor_id))
            if row is not None:
                s.delete(row)
            s.add(AuditLog(event_key=event_key, org=org, app=app, executor_id=executor_id,
                           operation="executor.deleted", details=details))
            s.commit()

    def select_candidate(self, *, org: str, app: str, app_version: str,
                         exclude: list[str]) -> tuple[str, str] | None:
        """A HEALTHY peer of the same org, app and version: ``(executor_id, gateway_queue)``, or None."""
        with Session(self.engine) as s:
            rows = s.exec(select(Executor).where(
                Executor.org == org, Executor.app == app, Executor.app_version == app_version,
                Executor.status == ExecutorStatus.HEALTHY, col(Executor.gateway_queue).is_not(None),
                col(Executor.executor_id).not_in(exclude),
            )).all()
        if not rows:
            return None
        row = random.choice(rows)  # spread recoveries; fair scheduling is a later issue
        assert row.gateway_queue is not None
        return row.executor_id, row.gateway_queue

    # -- audit ---------------------------------------------------------------------------------------------

    def write_audit(self, *, org: str, operation: str, app: str | None = None, executor_id: str | None = None,
                    status: str = "success", subject: str = "system", source_ip: str = "",
                    details: dict[str, Any] | None = None, event_key: str | None = None) -> None:
        with Session(self.engine) as s:
            s.add(AuditLog(event_key=event_key, org=org, app=app, executor_id=executor_id, operation=operation,
                           status=status, subject=subject, source_ip=source_ip, details=details))
            try:
                s.commit()
            except IntegrityError:
                s.rollback()  # same event_key: already written by an earlier try of the same activity

    def list_audit(self, org: str, *, app: str | None = None, limit: int = 1000) -> list[AuditLog]:
        with Session(self.engine) as s:
            q = select(AuditLog).where(AuditLog.org == org)
            if app is not None:
                q = q.where(AuditLog.app == app)
            return list(s.exec(q.order_by(col(AuditLog.emit_time).desc()).limit(limit)).all())


def _jsonable(value: Any) -> Any:
    if isinstance(value, timedelta):
        return value.total_seconds()
    return value
