"""All database access: keys, applications, the executor registry and the audit log.

One ``Store`` wraps one engine. Methods are synchronous (SQLAlchemy); async callers run them in a thread.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, text
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlmodel import Session, and_, col, or_, select

from core import candidates, units
from core.errors import AuthError, ConflictError, ForbiddenError, NotFoundError
from core.models import (
    ApiKey,
    Application,
    AuditLog,
    Executor,
    RecoveryClaim,
    RetentionState,
    utcnow,
)
from workflows.contracts.common import ExecutorInfo, ExecutorStatus

KEY_PREFIX = "dbos_"


def hash_key(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def unavailable(err: BaseException) -> bool:
    """Whether ``err`` means the database is away for now (stopped, restarting, unreachable, locked) rather than a
    bug: the same call may succeed later, so a request gets 503 and an activity is retried.

    Both drivers raise ``OperationalError`` for these (sqlite3: "database is locked"; psycopg: connection refused,
    "terminating connection due to administrator command", "the database system is starting up"); a connection
    that died under another DBAPI error is flagged ``connection_invalidated``; a pool with every connection stuck
    raises ``sqlalchemy.exc.TimeoutError``.
    """
    if isinstance(err, OperationalError | PoolTimeoutError):
        return True
    return isinstance(err, DBAPIError) and err.connection_invalidated


def outage(err: BaseException) -> str:
    """One short line about a database error, for a log line or a retried activity's failure: the driver's own
    message, without SQLAlchemy's SQL, parameters and background link (a PostgreSQL outage repeats it a lot)."""
    lines = str(getattr(err, "orig", None) or err).strip().splitlines()
    return f"{type(err).__name__}: {lines[0][:200] if lines else ''}"


@dataclass(frozen=True)
class Principal:
    """Who a valid key speaks for."""

    key_id: str
    key_name: str
    org: str
    apps: tuple[str, ...] | None

    def allows(self, app: str) -> bool:
        return self.apps is None or app in self.apps

    def require(self, app: str) -> None:
        """403 for a key not allowed for ``app``."""
        if not self.allows(app):
            raise ForbiddenError(f"this key is not allowed for app {app!r}")


@dataclass(frozen=True)
class Candidates:
    """Executors a management request may go to: the app's routable HEALTHY ones, and the ids of those busy."""

    executors: list[Executor]
    busy: set[str]


@dataclass(frozen=True)
class AppAccess:
    """A key's access to one registered app, and (when asked for) the app's management candidates then."""

    principal: Principal
    app: Application
    candidates: Candidates | None = None


class Store:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def ping(self) -> None:
        """One round trip (``SELECT 1``) on a pooled connection; raises while the database is unreachable (see
        ``unavailable``). The pool's pre-ping replaces a connection that a restarted server dropped."""
        with self.engine.connect() as c:
            c.execute(text("SELECT 1"))

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

    def live_key_hashes(self) -> frozenset[str]:
        """The hashes of every key not revoked: what a gateway refuses unknown keys against without a database
        trip each (refreshed by its revocation watcher, twice a second)."""
        with self.engine.connect() as c:
            return frozenset(c.execute(select(ApiKey.key_hash).where(col(ApiKey.revoked_at).is_(None))).scalars())

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
                           details=units.app_settings_to_rest(changes)))
            s.commit()
            s.refresh(app)
            return app

    # -- executor registry (written on behalf of the lifecycle workflow) -----------------------------------

    def list_executors(self, org: str, app: str) -> list[Executor]:
        with Session(self.engine) as s:
            return list(s.exec(select(Executor).where(Executor.org == org, Executor.app == app)
                               .order_by(col(Executor.created_at))).all())

    def record_status(self, *, org: str, app: str, executor_id: str, status: ExecutorStatus, operation: str,
                      event_key: str, info: ExecutorInfo | None, connection_id: str | None,
                      gateway_queue: str | None, details: dict[str, Any]) -> list[str]:
        """Upsert the registry row and write its audit row, both at most once per ``event_key``. For a HEALTHY
        write, also returns the ids of the app's DEAD executors (each one's workflow may be waiting for a peer)."""
        with Session(self.engine) as s:
            landed = s.exec(select(AuditLog.id).where(AuditLog.event_key == event_key)).first() is not None
            if not landed:  # else a retried activity: this event already landed
                now = utcnow()
                row = s.get(Executor, (org, app, executor_id))
                if row is None:
                    row = Executor(org=org, app=app, executor_id=executor_id, created_at=now)
                row.status = status
                row.updated_at = now
                if info is not None:
                    row.app_version = info.application_version
                    row.hostname = info.hostname
                    row.language = info.language
                    row.dbos_version = info.dbos_version
                    row.executor_metadata = info.executor_metadata
                if connection_id is not None:
                    row.connection_id = connection_id
                    row.gateway_queue = gateway_queue
                s.add(row)
                s.add(AuditLog(event_key=event_key, org=org, app=app, executor_id=executor_id,
                               operation=operation, details=details, emit_time=now))
                s.commit()
            if status != ExecutorStatus.HEALTHY:
                return []
            return list(s.exec(select(Executor.executor_id).where(
                Executor.org == org, Executor.app == app, Executor.status == ExecutorStatus.DEAD)).all())

    def delete_executor(self, *, org: str, app: str, executor_id: str, event_key: str,
                        details: dict[str, Any]) -> None:
        with Session(self.engine) as s:
            if s.exec(select(AuditLog.id).where(AuditLog.event_key == event_key)).first() is not None:
                return
            row = s.get(Executor, (org, app, executor_id))
            if row is not None:
                s.delete(row)
            claim = s.get(RecoveryClaim, (org, app, executor_id))
            if claim is not None:
                s.delete(claim)
            s.add(AuditLog(event_key=event_key, org=org, app=app, executor_id=executor_id,
                           operation="executor.deleted", details=details))
            s.commit()

    def select_candidate(self, *, org: str, app: str, app_version: str, exclude: list[str],
                         dead_executor_id: str = "") -> tuple[Executor, bool] | None:
        """Claim a HEALTHY peer for ``dead_executor_id``'s recovery: ``(peer, cross_version)``, or None.

        The choice is ``candidates.select_candidate``'s; this loads what it reads and records the claim.
        """
        with Session(self.engine) as s:
            application = s.exec(select(Application).where(Application.org == org, Application.name == app)).first()
            claims = _live_claims(s, org, app)
            found = candidates.select_candidate(
                _routable(s, org, app), app_version=app_version, exclude=exclude,
                cross_version_allowed=application is not None and application.cross_version_recovery,
                claims={c.dead_executor_id: c.candidate_id for c in claims}, dead_executor_id=dead_executor_id,
            )
            if found is None:
                return None
            row, cross = found
            if dead_executor_id:
                s.merge(RecoveryClaim(org=org, app=app, dead_executor_id=dead_executor_id,
                                      candidate_id=row.executor_id, claimed_at=utcnow()))
                s.commit()
                s.refresh(row)
            return row, cross

    def management_candidates(self, org: str, app: str) -> Candidates:
        """The app's routable HEALTHY executors, and the ids of those busy: a recovery or a slow operator's
        request is on them (claimed peers). Read on every management request."""
        with self.engine.connect() as c:
            return _candidates(c, org, app)

    def claim_for_management(self, *, org: str, app: str, executor_id: str, request_id: str) -> None:
        """An operator's request is taking a while on ``executor_id``: count it as work in flight there, so a
        recovery picks another peer while one is free (the SDKs answer one request at a time)."""
        with Session(self.engine) as s:
            s.merge(RecoveryClaim(org=org, app=app, dead_executor_id=MANAGEMENT_CLAIM + request_id,
                                  candidate_id=executor_id, claimed_at=utcnow()))
            s.commit()

    def release_management_claim(self, *, org: str, app: str, request_id: str) -> None:
        with Session(self.engine) as s:
            claim = s.get(RecoveryClaim, (org, app, MANAGEMENT_CLAIM + request_id))
            if claim is not None:
                s.delete(claim)
                s.commit()

    def executor_counts(self, org: str) -> Counter[tuple[str, str, str]]:
        """The org's registry rows counted by ``(org, app, status)``."""
        with Session(self.engine) as s:
            rows = s.exec(select(Executor.org, Executor.app, Executor.status).where(Executor.org == org)).all()
        return Counter((org, app, str(status)) for org, app, status in rows)

    def executors_on_gateway(self, gateway_queue: str) -> list[tuple[str, str, str, str]]:
        """``(org, app, executor_id, connection_id)`` of HEALTHY executors whose socket is on that gateway."""
        with Session(self.engine) as s:
            rows = s.exec(select(Executor).where(Executor.gateway_queue == gateway_queue,
                                                 Executor.status == ExecutorStatus.HEALTHY)).all()
        return [(r.org, r.app, r.executor_id, r.connection_id or "") for r in rows]

    def registry_on_gateway(self, gateway_queue: str) -> dict[tuple[str, str, str], tuple[ExecutorStatus, str]]:
        """``(org, app, executor_id) -> (status, connection_id)`` of every executor last placed on that gateway."""
        with Session(self.engine) as s:
            rows = s.exec(select(Executor).where(Executor.gateway_queue == gateway_queue)).all()
        return {(r.org, r.app, r.executor_id): (r.status, r.connection_id or "") for r in rows}

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

    # -- retention -----------------------------------------------------------------------------------------

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
            best = candidates.select_retention_executor(_routable(s, org, app), exclude=exclude, latest=latest)
        if best is None:
            return None
        assert best.gateway_queue is not None
        return best.executor_id, best.gateway_queue

    def write_retention_audit(self, *, org: str, app: str, operation: str, event_key: str, status: str,
                              executor_id: str | None, details: dict[str, Any],
                              started_at: datetime | None = None, request_id: str | None = None) -> None:
        """Write one retention audit row and, with ``started_at``, the app's last round, in one transaction and
        at most once per ``event_key``."""
        with Session(self.engine) as s:
            if s.exec(select(AuditLog.id).where(AuditLog.event_key == event_key)).first() is not None:
                return  # a retried activity: this event already landed
            s.add(AuditLog(event_key=event_key, org=org, app=app, executor_id=executor_id, operation=operation,
                           status=status, details=details))
            if started_at is not None:
                state = s.get(RetentionState, (org, app))
                if state is None:
                    state = RetentionState(org=org, app=app, last_started_at=started_at)
                state.last_started_at = max(state.last_started_at, started_at)
                state.executor_id, state.request_id = executor_id, request_id
                s.add(state)
            try:
                s.commit()
            except IntegrityError:
                s.rollback()  # the same event_key, written concurrently by an earlier try of this activity

    # -- admin API -----------------------------------------------------------------------------------------

    def org_exists(self, org: str) -> bool:
        """An org exists once a key was issued for it (apps are only ever registered with a key of theirs)."""
        with Session(self.engine) as s:
            return s.exec(select(ApiKey.id).where(ApiKey.org == org).limit(1)).first() is not None

    def authorize_org(self, key: str, org: str) -> Principal:
        """401 unknown or revoked key, 404 unknown org, 403 a key of another org."""
        principal = self.authenticate(key)
        if principal.org != org:
            if not self.org_exists(org):
                raise NotFoundError(f"org {org!r} not found")
            raise ForbiddenError(f"this key does not belong to org {org!r}")
        return principal

    def authorize_app(self, key: str, org: str, app: str, *, with_candidates: bool = False) -> AppAccess:
        """``authorize_org``, then 403 a key not allowed for the app (before any 404 for it, so a restricted key
        cannot probe which apps exist), then 404 an unknown app: a REST call's whole check, on one connection with
        prepared statements (the hot path of workflow management: a third of ``authorize_org`` plus ``get_app``).
        With ``with_candidates``, also the app's ``management_candidates``, on the same connection."""
        digest = hash_key(key)
        with self.engine.connect() as c:
            row = c.execute(_KEY_BY_HASH, {"key_hash": digest}).first()
            if row is None or row.revoked_at is not None or not hmac.compare_digest(row.key_hash, digest):
                raise AuthError("unknown or revoked API key")
            principal = Principal(row.id, row.name, row.org, tuple(row.apps) if row.apps else None)
            if principal.org != org:
                if c.execute(_ANY_KEY_OF_ORG, {"org": org}).first() is None:
                    raise NotFoundError(f"org {org!r} not found")
                raise ForbiddenError(f"this key does not belong to org {org!r}")
            principal.require(app)
            found = c.execute(_APP_BY_NAME, {"org": org, "name": app}).first()
            if found is None:
                raise NotFoundError(f"application {app!r} not found in org {org!r}")
            return AppAccess(principal, Application.model_validate(found._mapping),
                             _candidates(c, org, app) if with_candidates else None)

    def list_apps(self, org: str, names: tuple[str, ...] | None = None
                  ) -> list[tuple[Application, list[Executor]]]:
        """The org's apps (only ``names``, when given), each with its executors, in name order."""
        with Session(self.engine) as s:
            q = select(Application).where(Application.org == org)
            if names is not None:
                q = q.where(col(Application.name).in_(names))
            apps = s.exec(q.order_by(col(Application.name))).all()
            executors = s.exec(select(Executor).where(Executor.org == org)
                               .order_by(col(Executor.created_at))).all()
        by_app: dict[str, list[Executor]] = {}
        for row in executors:
            by_app.setdefault(row.app, []).append(row)
        return [(app, by_app.get(app.name, [])) for app in apps]

    def delete_app(self, org: str, name: str, *, subject: str, source_ip: str,
                   orphans: list[str], details: dict[str, Any]) -> None:
        """Delete the app's row (audited) and the registry rows of ``orphans``: executors whose lifecycle
        workflow is gone, so nothing else will ever delete them."""
        with Session(self.engine) as s:
            app = s.exec(select(Application).where(Application.org == org, Application.name == name)).first()
            if app is None:
                raise NotFoundError(f"application {name!r} not found in org {org!r}")
            s.delete(app)
            for executor_id in orphans:
                row = s.get(Executor, (org, name, executor_id))
                if row is not None:
                    s.delete(row)
            s.add(AuditLog(org=org, app=name, operation="app.deleted", subject=subject, source_ip=source_ip,
                           details=details))
            s.commit()

    def create_token(self, *, org: str, name: str, apps: list[str] | None, subject: str,
                     source_ip: str) -> str:
        """Create a named key (audited) and return it; only its hash is stored. 409 if the org already has a
        live token of that name (``relay keys create`` labels are not unique, so this is checked here)."""
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        with Session(self.engine) as s:
            taken = s.exec(select(ApiKey.id).where(ApiKey.org == org, ApiKey.name == name,
                                                   col(ApiKey.revoked_at).is_(None))).first()
            if taken is not None:
                raise ConflictError(f"org {org!r} already has a token named {name!r}")
            s.add(ApiKey(org=org, name=name, key_hash=hash_key(key), apps=apps or None))
            s.add(AuditLog(org=org, operation="token.created", subject=subject, source_ip=source_ip,
                           details={"tokenName": name, "appNames": apps or None}))
            s.commit()
        return key

    def list_tokens(self, org: str) -> tuple[list[ApiKey], dict[str, str]]:
        """The org's live keys, oldest first, and its registered apps' ids by name."""
        with Session(self.engine) as s:
            keys = s.exec(select(ApiKey).where(ApiKey.org == org, col(ApiKey.revoked_at).is_(None))
                          .order_by(col(ApiKey.created_at))).all()
            apps = s.exec(select(Application.name, Application.id).where(Application.org == org)).all()
        return list(keys), dict(apps)

    def revoke_token(self, org: str, name: str, *, subject: str, source_ip: str) -> list[str]:
        """Revoke every live key of the org with that name (audited); returns their ids. 404 if none."""
        with Session(self.engine) as s:
            keys = s.exec(select(ApiKey).where(ApiKey.org == org, ApiKey.name == name,
                                               col(ApiKey.revoked_at).is_(None))).all()
            if not keys:
                raise NotFoundError(f"no token named {name!r} in org {org!r}")
            now = utcnow()
            for row in keys:
                row.revoked_at = now
                s.add(row)
            s.add(AuditLog(org=org, operation="token.deleted", subject=subject, source_ip=source_ip,
                           details={"tokenName": name, "keys": len(keys)}))
            s.commit()
            return [row.id for row in keys]

    def still_valid(self, key_ids: set[str], pairs: set[tuple[str, str]]
                    ) -> tuple[set[str], dict[tuple[str, str], str]]:
        """In one session: those of ``key_ids`` that no longer authenticate, and the ids of those ``(org, app)``
        that are registered (what a gateway checks its sockets against, twice a second)."""
        live: set[str] = set()
        registered: dict[tuple[str, str], str] = {}
        with self.engine.connect() as c:  # Core, not an ORM session: this runs twice a second on every gateway
            if key_ids:
                live = set(c.execute(select(ApiKey.id).where(col(ApiKey.id).in_(key_ids),
                                                             col(ApiKey.revoked_at).is_(None))).scalars())
            if pairs:
                orgs, names = {org for org, _ in pairs}, {name for _, name in pairs}
                rows = c.execute(select(Application.org, Application.name, Application.id).where(
                    col(Application.org).in_(orgs), col(Application.name).in_(names))).all()
                registered = {(org, name): app_id for org, name, app_id in rows if (org, name) in pairs}
        return key_ids - live, registered

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
            key_ids = {r.subject.removeprefix(API_KEY_SUBJECT) for r in rows if r.subject.startswith(API_KEY_SUBJECT)}
            names = dict(s.exec(select(ApiKey.id, ApiKey.name).where(col(ApiKey.id).in_(key_ids))).all())
        return rows, names


# Claims by operators' requests (``claim_for_management``) sit beside recovery claims, keyed by request; one left
# behind by a gateway that died mid-request stops counting after this long.
MANAGEMENT_CLAIM = "management:"
MANAGEMENT_CLAIM_TTL = timedelta(minutes=5)


def _live_claims(s: Session, org: str, app: str) -> list[RecoveryClaim]:
    claims = s.exec(select(RecoveryClaim).where(RecoveryClaim.org == org, RecoveryClaim.app == app)).all()
    stale = utcnow() - MANAGEMENT_CLAIM_TTL
    return [c for c in claims if _live(c.dead_executor_id, c.claimed_at, stale)]


def _candidates(c: Connection, org: str, app: str) -> Candidates:
    stale = utcnow() - MANAGEMENT_CLAIM_TTL
    rows = c.execute(_ROUTABLE, {"org": org, "app": app, "status": ExecutorStatus.HEALTHY}).all()
    claims = c.execute(_CLAIMS, {"org": org, "app": app}).all()
    busy = {claim.candidate_id for claim in claims if _live(claim.dead_executor_id, claim.claimed_at, stale)}
    return Candidates([Executor.model_validate(row._mapping) for row in rows], busy)


def _live(dead_executor_id: str, claimed_at: datetime, stale: datetime) -> bool:
    """A recovery claim lives until released; an operator's request claim also expires (its gateway may die)."""
    return not (dead_executor_id.startswith(MANAGEMENT_CLAIM) and claimed_at < stale)


# Statements of the hot path (every REST call about an app, every management request), built once: SQLAlchemy
# spends more building and caching a statement than SQLite spends running it.
_KEY_BY_HASH = select(ApiKey).where(ApiKey.key_hash == bindparam("key_hash"))
_ANY_KEY_OF_ORG = select(ApiKey.id).where(ApiKey.org == bindparam("org")).limit(1)
_APP_BY_NAME = select(Application).where(Application.org == bindparam("org"), Application.name == bindparam("name"))
_ROUTABLE = select(Executor).where(Executor.org == bindparam("org"), Executor.app == bindparam("app"),
                                   Executor.status == bindparam("status"), col(Executor.gateway_queue).is_not(None))
_CLAIMS = select(RecoveryClaim.candidate_id, RecoveryClaim.dead_executor_id, RecoveryClaim.claimed_at).where(
    RecoveryClaim.org == bindparam("org"), RecoveryClaim.app == bindparam("app"))


def _routable(s: Session, org: str, app: str) -> list[Executor]:
    """The app's HEALTHY executors whose gateway is known, so a request can be routed to their socket."""
    return list(s.execute(_ROUTABLE, {"org": org, "app": app, "status": ExecutorStatus.HEALTHY}).scalars())


# -- admin API ----------------------------------------------------------------------------------------------

# Audit subjects are stored as "system" or "api_key:<key id>" (older rows: "key:<key name>").
API_KEY_SUBJECT = "api_key:"
SYSTEM_SUBJECT = "system"
TOKEN_OPERATIONS = ("token.created", "token.deleted")


def subject_of_key(key_id: str) -> str:
    return API_KEY_SUBJECT + key_id


def subject_of(principal: Principal) -> str:
    """The audit subject for an action taken with this key."""
    return subject_of_key(principal.key_id)
