"""Alerting rules (``core.alerts``, ``workflows.alerts``): the REST API's rules, what each alerts round evaluates
and the audit rows it reads past its watermark, and each evaluation's result (a firing claimed in one UPDATE)."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import update
from sqlmodel import Session, col, or_, select

from core import units
from core.errors import NotFoundError
from core.models import AlertingRule, AlertWatermark, Application, AuditLog, Executor
from core.store.base import InsertOnce, StoreBase, app_row
from core.types import ExecutorStatus

_WATERMARKS = InsertOnce(AlertWatermark, "name")


class AlertsStore(StoreBase):
    def create_alert_rule(self, *, org: str, app: str, receiving_app: str, rule_type: str, metadata: Any,
                          min_interval: timedelta | None, subject: str, source_ip: str) -> AlertingRule:
        """Create a rule (audited ``alert_rule.created``); 404 for an unknown app or receiving app."""
        with Session(self.engine) as s:
            own = app_row(s, org, app)
            receiver = own if receiving_app == app else app_row(s, org, receiving_app)
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
        with Session(self.engine) as s:
            app_id = app_row(s, org, app).id
            return list(s.exec(select(AlertingRule).where(AlertingRule.app_id == app_id)
                               .order_by(col(AlertingRule.created_at), col(AlertingRule.id))).all())

    def delete_alert_rule(self, org: str, app: str, rule_id: str, *, subject: str, source_ip: str) -> None:
        """Delete one of the app's rules (audited ``alert_rule.deleted``); 404 for an unknown app or rule."""
        with Session(self.engine) as s:
            app_id = app_row(s, org, app).id
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
        with self.engine.begin() as c:
            if not _WATERMARKS(c, AlertWatermark(name=watermark, until=until)):
                c.execute(update(AlertWatermark).where(col(AlertWatermark.name) == watermark,
                                                       col(AlertWatermark.until) < until).values(until=until))

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
