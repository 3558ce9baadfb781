"""Autoscaling policies (``core.autoscale``): one per app, set, read and deleted through the REST API (audited), and
listed for the gateways that keep ``relay_app_desired_executors`` current."""

from __future__ import annotations

from sqlmodel import Session, col, select

from core.autoscale import Policy, Rollout
from core.models import AuditLog, AutoscalingPolicy
from core.store.base import InsertOnce, StoreBase, app_row
from core.units import utcnow


def policy_of(row: AutoscalingPolicy) -> Policy:
    """The row as ``core.autoscale`` reads it: a rollout only where one of its fields was given."""
    if row.max_old_versions is None and row.max_old_executors is None:
        return Policy(queue=row.queue)
    return Policy(queue=row.queue, rollout=Rollout(max_old_versions=row.max_old_versions,
                                                   max_old_executors=row.max_old_executors))


_POLICIES = InsertOnce(AutoscalingPolicy, "org", "app")


class AutoscaleStore(StoreBase):
    def get_autoscaling_policy(self, org: str, app: str) -> Policy | None:
        """The app's policy; None when it has none. 404: unknown app."""
        with Session(self.engine) as s:
            app_row(s, org, app)
            row = s.get(AutoscalingPolicy, (org, app))
            return None if row is None else policy_of(row)

    def set_autoscaling_policy(self, org: str, app: str, policy: Policy, *, subject: str,
                               source_ip: str) -> Policy:
        """Store ``policy`` as the app's (replacing any), audited; returns it as stored. 404: unknown app."""
        rollout = policy.rollout or Rollout()
        with Session(self.engine) as s:
            app_row(s, org, app)
            # Two operators setting one app's first policy at once: one after the other, never a duplicate key.
            row = _POLICIES.put(s, AutoscalingPolicy(org=org, app=app, queue=policy.queue,
                                                     max_old_versions=rollout.max_old_versions,
                                                     max_old_executors=rollout.max_old_executors, subject=subject,
                                                     updated_at=utcnow()))
            stored = policy_of(row)
            s.add(AuditLog(org=org, app=app, operation="app.autoscaling_policy.set", subject=subject,
                           source_ip=source_ip, details=stored.rest()))
            s.commit()
            return stored

    def delete_autoscaling_policy(self, org: str, app: str, *, subject: str, source_ip: str) -> bool:
        """Delete the app's policy (audited when there was one); False when it had none. 404: unknown app."""
        with Session(self.engine) as s:
            app_row(s, org, app)
            row = s.get(AutoscalingPolicy, (org, app))
            if row is None:
                return False
            s.delete(row)
            s.add(AuditLog(org=org, app=app, operation="app.autoscaling_policy.deleted", subject=subject,
                           source_ip=source_ip, details=policy_of(row).rest()))
            s.commit()
            return True

    def autoscaling_policies(self) -> list[tuple[str, str, Policy]]:
        """Every app's policy, of every org: ``(org, app, policy)``, in org and app order."""
        with Session(self.engine) as s:
            rows = s.exec(select(AutoscalingPolicy).order_by(col(AutoscalingPolicy.org),
                                                             col(AutoscalingPolicy.app))).all()
            return [(row.org, row.app, policy_of(row)) for row in rows]
