"""Who may carry work for an app, and the claims that spread it: the eligible peers (routable, HEALTHY, not
drained), a recovery's peer (``select_candidate``, which records its ``RecoveryClaim``), the candidates of an
operator's request, and the ``ManagementClaim`` of a request that is taking a while."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from sqlalchemy import Connection, bindparam, exists, func, union_all, update
from sqlmodel import Session, col, select

from core import candidates
from core.models import Executor, ExecutorDrain, ManagementClaim, RecoveryClaim, RecoveryTicket
from core.store.base import InsertOnce, StoreBase, find_app
from core.types import ExecutorStatus
from core.units import utcnow

# A claim by an operator's request (``claim_for_management``) left behind by a gateway that died mid-request stops
# counting after this long.
MANAGEMENT_CLAIM_TTL = timedelta(minutes=5)


@dataclass(frozen=True)
class Candidates:
    """Executors a management request may go to: the app's routable HEALTHY ones, and the ids of those busy."""

    executors: list[Executor]
    busy: set[str]


_ROUTABLE = select(Executor).where(Executor.org == bindparam("org"), Executor.app == bindparam("app"),
                                   Executor.status == bindparam("status"), col(Executor.gateway_queue).is_not(None))
# Routable and not drained (a drain still in force): who may recover others or carry an operator's request. The
# drain is excluded inside the same statement, so a management request still costs one query for its candidates.
_ELIGIBLE = _ROUTABLE.where(~exists().where(
    col(ExecutorDrain.org) == col(Executor.org), col(ExecutorDrain.app) == col(Executor.app),
    col(ExecutorDrain.executor_id) == col(Executor.executor_id), col(ExecutorDrain.until) > bindparam("now")))
# Routable HEALTHY executors a drain in force keeps out of _ELIGIBLE: only what saying so needs.
_DRAINED = _ROUTABLE.with_only_columns(col(Executor.executor_id), col(Executor.app_version)).where(exists().where(
    col(ExecutorDrain.org) == col(Executor.org), col(ExecutorDrain.app) == col(Executor.app),
    col(ExecutorDrain.executor_id) == col(Executor.executor_id), col(ExecutorDrain.until) > bindparam("now"))
).order_by(col(Executor.executor_id))
# The same peers as _ELIGIBLE, only what choosing one reads (``candidates.Peer``): a recovery's candidate is chosen
# among every HEALTHY executor of the app, and building an ORM object per row cost 25 ms at 1,000 executors, under the
# database's write lock (a burst of deaths waited on it in line).
_ELIGIBLE_PEERS = _ELIGIBLE.with_only_columns(col(Executor.executor_id), col(Executor.app_version))
# One eligible peer of a version that is not busy, at random (one on the ``prefer`` gateway queue first): no recovery
# claims it (but this death's own claim, a retry's), no operator's request counting, no recent ticket names it as the
# peer of another death. Busy is decided in the database: read into Python (every claim and ticket of the app, then a
# NOT IN of all their peers), each selection of a burst of deaths cost as much as all the deaths before it.
_IDLE_PEER = _ELIGIBLE_PEERS.where(
    col(Executor.app_version) == bindparam("version"),
    col(Executor.executor_id).not_in(bindparam("exclude", expanding=True)),
    col(Executor.executor_id).not_in(select(RecoveryClaim.candidate_id).where(
        RecoveryClaim.org == bindparam("org"), RecoveryClaim.app == bindparam("app"),
        RecoveryClaim.dead_executor_id != bindparam("dead"))),
    col(Executor.executor_id).not_in(select(ManagementClaim.candidate_id).where(
        ManagementClaim.org == bindparam("org"), ManagementClaim.app == bindparam("app"),
        col(ManagementClaim.claimed_at) >= bindparam("stale"))),
    col(Executor.executor_id).not_in(select(RecoveryTicket.candidate_id).where(
        RecoveryTicket.org == bindparam("org"), RecoveryTicket.app == bindparam("app"),
        RecoveryTicket.executor_id != bindparam("dead"), col(RecoveryTicket.candidate_id).is_not(None))),
).order_by((col(Executor.gateway_queue) == bindparam("prefer")).desc(), func.random()).limit(1)
# Recording the claim: plain statements built once (the ORM's get, merge and refresh cost ~2 ms a death, under the
# database's write lock in a burst of deaths).
_PEER_ROW = select(*Executor.__table__.columns).where(  # type: ignore[attr-defined]
    Executor.org == bindparam("org"), Executor.app == bindparam("app"), Executor.executor_id == bindparam("id"))
_CLAIM_KEY = (col(RecoveryClaim.org) == bindparam("c_org"), col(RecoveryClaim.app) == bindparam("c_app"),
              col(RecoveryClaim.dead_executor_id) == bindparam("dead"))
_CLAIM_AGAIN = update(RecoveryClaim).where(*_CLAIM_KEY).values(candidate_id=bindparam("peer"),
                                                               claimed_at=bindparam("at"))
_CLAIM = InsertOnce(RecoveryClaim, "org", "app", "dead_executor_id")
_MANAGEMENT_CLAIMS = InsertOnce(ManagementClaim, "org", "app", "request_id")
_TICKET_PEER = update(RecoveryTicket).where(
    col(RecoveryTicket.org) == bindparam("c_org"), col(RecoveryTicket.app) == bindparam("c_app"),
    col(RecoveryTicket.executor_id) == bindparam("dead")).values(candidate_id=bindparam("peer"))
_TICKET_PEERS = select(RecoveryTicket.executor_id, RecoveryTicket.candidate_id).where(
    RecoveryTicket.org == bindparam("org"), RecoveryTicket.app == bindparam("app"))
_CLAIMS = select(RecoveryClaim.candidate_id, RecoveryClaim.dead_executor_id).where(
    RecoveryClaim.org == bindparam("org"), RecoveryClaim.app == bindparam("app"))
# The peers of operators' requests still counting: a recovery claim lives until released, a request's also expires
# (its gateway may die).
_MANAGED = select(ManagementClaim.candidate_id).where(
    ManagementClaim.org == bindparam("org"), ManagementClaim.app == bindparam("app"),
    col(ManagementClaim.claimed_at) >= bindparam("stale"))
# Every busy peer (recoveries and requests on it), in one round trip: read on every management request.
_BUSY = union_all(select(RecoveryClaim.candidate_id).where(
    RecoveryClaim.org == bindparam("org"), RecoveryClaim.app == bindparam("app")), _MANAGED)


def eligible(s: Session, org: str, app: str) -> list[Executor]:
    """The app's HEALTHY executors whose gateway is known (a request can be routed to their socket) and that are
    not drained: who may recover others, run a retention round or carry an operator's request."""
    return list(s.execute(_ELIGIBLE, {"org": org, "app": app, "status": ExecutorStatus.HEALTHY,
                                      "now": utcnow()}).scalars())


def candidates_on(c: Connection, org: str, app: str) -> Candidates:
    """``Store.management_candidates`` on a connection the caller holds."""
    stale = utcnow() - MANAGEMENT_CLAIM_TTL
    rows = c.execute(_ELIGIBLE, {"org": org, "app": app, "status": ExecutorStatus.HEALTHY, "now": utcnow()}).all()
    busy = set(c.execute(_BUSY, {"org": org, "app": app, "stale": stale}).scalars())
    return Candidates([Executor.model_validate(row._mapping) for row in rows], busy)


class ClaimsStore(StoreBase):
    def select_candidate(self, *, org: str, app: str, app_version: str, exclude: list[str],
                         dead_executor_id: str = "", prefer_gateway: str = "") -> tuple[Executor, bool] | None:
        """Claim a HEALTHY peer for ``dead_executor_id``'s recovery: ``(peer, cross_version)``, or None.

        The choice is ``candidates.select_candidate``'s; this loads what it reads and records the claim.
        Drained executors are never chosen. Recoveries the peers carried recently (the gate's tickets) break ties
        between equally busy peers, so paced recoveries, each chosen when none is in flight, still spread evenly.
        An idle peer on ``prefer_gateway`` (the dead executor's last gateway, which then looks for its socket as it
        sends the request) is chosen before idle peers elsewhere; when every peer is busy, it makes no difference.
        """
        with self.engine.begin() as conn:  # plain rows, not the ORM's: building them costs more than the query
            stale = utcnow() - MANAGEMENT_CLAIM_TTL
            # Most peers carry nothing: one of them, drawn at random in the database, is what the full choice
            # would pick (its least-busy tie). Only when every peer of the version is busy (or excluded) is every
            # eligible peer read and ranked: at 1,000 executors that read cost a burst of deaths 20 ms each.
            idle = conn.execute(_IDLE_PEER, {"org": org, "app": app, "status": ExecutorStatus.HEALTHY,
                                             "now": utcnow(), "version": app_version, "exclude": sorted(exclude),
                                             "dead": dead_executor_id, "stale": stale,
                                             "prefer": prefer_gateway}).first()
            found: tuple[Any, bool] | None = (idle, False) if idle is not None else None
            if found is None:
                claims = {c.dead_executor_id: c.candidate_id for c in conn.execute(_CLAIMS, {"org": org,
                                                                                              "app": app})}
                managed = list(conn.execute(_MANAGED, {"org": org, "app": app, "stale": stale}).scalars())
                carried = Counter(t.candidate_id for t in conn.execute(_TICKET_PEERS, {"org": org, "app": app})
                                  if t.candidate_id and t.executor_id != dead_executor_id)
                healthy = conn.execute(_ELIGIBLE_PEERS, {"org": org, "app": app, "status": ExecutorStatus.HEALTHY,
                                                       "now": utcnow()}).all()
                application = find_app(conn, org, app)
                found = candidates.select_candidate(
                    healthy, app_version=app_version, exclude=exclude,
                    cross_version_allowed=application is not None and application.cross_version_recovery,
                    claims=claims, requests=managed, dead_executor_id=dead_executor_id,
                    carried=carried,
                )
            if found is None:
                return None
            peer, cross = found
            found_row = conn.execute(_PEER_ROW, {"org": org, "app": app, "id": peer.executor_id}).first()
            assert found_row is not None
            row = Executor.model_validate(found_row._mapping)
            if dead_executor_id:
                claim = {"c_org": org, "c_app": app, "dead": dead_executor_id, "peer": row.executor_id,
                         "at": utcnow()}
                if not conn.execute(_CLAIM_AGAIN, claim).rowcount and not _CLAIM(conn, {
                        "org": org, "app": app, "dead_executor_id": dead_executor_id,
                        "candidate_id": row.executor_id, "claimed_at": claim["at"]}):
                    # Claimed meanwhile, by another try of the same selection still running: this one's peer wins.
                    conn.execute(_CLAIM_AGAIN, claim)
                conn.execute(_TICKET_PEER, claim)  # none yet for a death the gate was not asked about
            return row, cross

    def management_candidates(self, org: str, app: str) -> Candidates:
        """The app's routable HEALTHY executors that are not drained, and the ids of those busy: a recovery or a
        slow operator's request is on them (claimed peers). Read on every management request."""
        with self.engine.connect() as c:
            return candidates_on(c, org, app)

    def drained_executors(self, org: str, app: str) -> list[tuple[str, str]]:
        """``(executor_id, app_version)`` of the app's routable HEALTHY executors that a drain in force keeps from
        being chosen (to carry an operator's request, to recover a peer), by id: read only to say so when none is
        left to choose."""
        with self.engine.connect() as c:
            rows = c.execute(_DRAINED, {"org": org, "app": app, "status": ExecutorStatus.HEALTHY, "now": utcnow()})
            return [(row.executor_id, row.app_version) for row in rows]

    def claim_for_management(self, *, org: str, app: str, executor_id: str, request_id: str) -> None:
        """An operator's request is taking a while on ``executor_id``: count it as work in flight there, so a
        recovery picks another peer while one is free (the SDKs answer one request at a time)."""
        with Session(self.engine) as s:
            _MANAGEMENT_CLAIMS.put(s, ManagementClaim(org=org, app=app, request_id=request_id,
                                                      candidate_id=executor_id, claimed_at=utcnow()))
            s.commit()

    def release_management_claim(self, *, org: str, app: str, request_id: str) -> None:
        with Session(self.engine) as s:
            claim = s.get(ManagementClaim, (org, app, request_id))
            if claim is not None:
                s.delete(claim)
                s.commit()
