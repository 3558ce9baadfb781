"""API keys: creating, listing and revoking them, and what a request's key may do (``authenticate``,
``authorize_org``, ``authorize_app``: each through the one key check, ``base.check_key``)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from sqlalchemy import Connection, bindparam
from sqlmodel import Session, col, select

from core.errors import ConflictError, ForbiddenError, NotFoundError
from core.models import ApiKey, Application, AuditLog
from core.store.base import KEY_PREFIX, Principal, StoreBase, app_row, check_key, hash_key
from core.store.claims import Candidates, candidates_on
from core.store.registry import AppExecutors, app_executors_on
from core.units import utcnow


@dataclass(frozen=True)
class AppAccess:
    """A key's access to one registered app, and (when asked for) the app's management candidates or what getApp
    says of its executors, read then."""

    principal: Principal
    app: Application
    candidates: Candidates | None = None
    executors: AppExecutors | None = None


_ANY_KEY_OF_ORG = select(ApiKey.id).where(ApiKey.org == bindparam("org")).limit(1)


def _org_exists(c: Connection, org: str) -> bool:
    return c.execute(_ANY_KEY_OF_ORG, {"org": org}).first() is not None


def _authorize_org(c: Connection, key: str, org: str) -> Principal:
    principal = check_key(c, key)
    if principal.org != org:
        if not _org_exists(c, org):
            raise NotFoundError(f"org {org!r} not found")
        raise ForbiddenError(f"this key does not belong to org {org!r}")
    return principal


class KeysStore(StoreBase):
    def create_key(self, *, org: str, name: str, apps: list[str] | None = None) -> str:
        """Create a key and return it; only its hash is stored."""
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        with Session(self.engine) as s:
            s.add(ApiKey(org=org, name=name, key_hash=hash_key(key), apps=apps or None))
            s.commit()
        return key

    def authenticate(self, key: str) -> Principal:
        """Who ``key`` speaks for; 401 for an unknown or revoked key."""
        with self.engine.connect() as c:
            return check_key(c, key)

    def live_key_hashes(self) -> frozenset[str]:
        """The hashes of every key not revoked: what a gateway refuses unknown keys against without a database
        trip each (refreshed by its revocation watcher, twice a second)."""
        with self.engine.connect() as c:
            return frozenset(c.execute(select(ApiKey.key_hash).where(col(ApiKey.revoked_at).is_(None))).scalars())

    def org_exists(self, org: str) -> bool:
        """An org exists once a key was issued for it (apps are only ever registered with a key of theirs)."""
        with self.engine.connect() as c:
            return _org_exists(c, org)

    def authorize_org(self, key: str, org: str) -> Principal:
        """401 unknown or revoked key, 404 unknown org, 403 a key of another org."""
        with self.engine.connect() as c:
            return _authorize_org(c, key, org)

    def authorize_app(self, key: str, org: str, app: str, *, with_candidates: bool = False,
                      with_executors: bool = False) -> AppAccess:
        """``authorize_org``, then 403 a key not allowed for the app (before any 404 for it, so a restricted key
        cannot probe which apps exist), then 404 an unknown app: a REST call's whole check, on one connection with
        prepared statements (the hot path of workflow management: a third of ``authorize_org`` plus ``get_app``).
        With ``with_candidates``, also the app's ``management_candidates``, and with ``with_executors`` its
        ``AppExecutors`` (getApp's whole read), on the same connection."""
        with self.engine.connect() as c:
            principal = _authorize_org(c, key, org)
            principal.require(app)
            return AppAccess(principal, app_row(c, org, app), candidates_on(c, org, app) if with_candidates else None,
                             app_executors_on(c, org, app) if with_executors else None)

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
