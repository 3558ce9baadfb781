"""Applications: registering (by an executor's first connection or the REST API), reading, changing and deleting
them, each found by name through the one app lookup (``base.find_app``)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import delete as sa_delete
from sqlmodel import Session, col, or_, select

from core import units
from core.models import (
    AlertingRule,
    Application,
    AuditLog,
    AutoscalingPolicy,
    Executor,
    ExecutorDrain,
    RecoveryGate,
    RecoveryPause,
    RecoveryTicket,
)
from core.store.audit import subject_of
from core.store.base import InsertOnce, Principal, StoreBase, app_row, check_key, find_app
from core.store.registry import AppExecutors, app_executors_columns

_APPS = InsertOnce(Application, "org", "name")


class AppsStore(StoreBase):
    def get_app(self, org: str, name: str) -> Application:
        with Session(self.engine) as s:
            return app_row(s, org, name)

    def join(self, key: str, name: str, *, source_ip: str = "") -> tuple[Principal, Application | None]:
        """A gateway's check of an executor joining app ``name``, on one connection: who ``key`` speaks for (401 for
        an unknown or revoked key), and the app, registered (audited, ``ensure_app``) on first use; None when the key
        is not allowed the app. The hot path of a connect storm: no ORM session unless the app is new."""
        with self.engine.connect() as c:
            principal = check_key(c, key)
            if not principal.allows(name):
                return principal, None
            app = find_app(c, principal.org, name)
        if app is None:
            app, _ = self.ensure_app(principal.org, name, subject=subject_of(principal), source_ip=source_ip)
        return principal, app

    def ensure_app(self, org: str, name: str, *, subject: str = "system", source_ip: str = "",
                   private_mode: bool | None = None) -> tuple[Application, bool]:
        """Return the app, registering it with defaults (audited) if it does not exist yet."""
        with Session(self.engine) as s:
            row = find_app(s, org, name)
            if row is not None:
                return row, False
            if not _APPS(s.connection(), Application(org=org, name=name, private_mode=bool(private_mode))):
                return app_row(s, org, name), False  # registered meanwhile by another connection
            s.add(AuditLog(org=org, app=name, operation="app.registered", subject=subject,
                           source_ip=source_ip, details={"app": name}))
            s.commit()
            return app_row(s, org, name), True

    def update_app(self, org: str, name: str, changes: dict[str, Any], *, subject: str,
                   source_ip: str = "") -> Application:
        with Session(self.engine) as s:
            app = app_row(s, org, name)
            for field, value in changes.items():
                setattr(app, field, value)
            s.add(app)
            s.add(AuditLog(org=org, app=name, operation="app.updated", subject=subject, source_ip=source_ip,
                           details=units.app_settings_to_rest(changes)))
            s.commit()
            s.refresh(app)
            return app

    def list_apps(self, org: str, names: tuple[str, ...] | None = None
                  ) -> list[tuple[Application, AppExecutors]]:
        """The org's apps (only ``names``, when given), in name order, each with what getApp says of its executors
        (``AppExecutors``), in one statement."""
        available, language = app_executors_columns(col(Application.org), col(Application.name))
        with Session(self.engine) as s:
            q = select(Application, available, language).where(Application.org == org)
            if names is not None:
                q = q.where(col(Application.name).in_(names))
            rows = s.exec(q.order_by(col(Application.name))).all()
        return [(app, AppExecutors(bool(healthy), lang)) for app, healthy, lang in rows]

    def delete_app(self, org: str, name: str, *, subject: str, source_ip: str,
                   orphans: list[str], details: dict[str, Any]) -> None:
        """Delete the app's row (audited), the registry rows of ``orphans`` (executors whose lifecycle workflow is
        gone, so nothing else will ever delete them), and what belongs to the app alone: its drains, pause, recovery
        gate and tickets, its autoscaling policy, and its alerting rules (an app registered again under the name
        starts afresh)."""
        with Session(self.engine) as s:
            app = app_row(s, org, name)
            s.delete(app)
            for executor_id in orphans:
                row = s.get(Executor, (org, name, executor_id))
                if row is not None:
                    s.delete(row)
            for table in (ExecutorDrain, RecoveryPause, RecoveryGate, RecoveryTicket, AutoscalingPolicy):
                s.execute(sa_delete(table).where(col(table.org) == org, col(table.app) == name))
            s.execute(sa_delete(AlertingRule).where(or_(col(AlertingRule.app_id) == app.id,
                                                        col(AlertingRule.receiving_app_id) == app.id)))
            s.add(AuditLog(org=org, app=name, operation="app.deleted", subject=subject, source_ip=source_ip,
                           details=details))
            s.commit()
