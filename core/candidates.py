"""Choosing which HEALTHY executor carries a request: the peer that recovers a dead executor, and the executor that
runs an app's retention round.

Pure functions over rows already loaded: ``core.store`` reads the app's HEALTHY executors (and the recovery and
management claims), calls these, and writes the claim. Rows are anything with the attributes of ``Peer``, so the
tests pass plain dataclasses and the store its ``Executor`` rows, and each gets back what it passed in.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import Protocol, TypeVar


class Peer(Protocol):
    """What choosing a recovery's peer reads of an executor."""

    @property
    def executor_id(self) -> str: ...

    @property
    def app_version(self) -> str: ...


class Registered(Peer, Protocol):
    """What choosing a retention round's executor reads of one, too."""

    @property
    def created_at(self) -> datetime: ...


PeerT = TypeVar("PeerT", bound=Peer)
RegisteredT = TypeVar("RegisteredT", bound=Registered)


def select_candidate(healthy: Sequence[PeerT], *, app_version: str, exclude: Collection[str] = (),
                     cross_version_allowed: bool = False, claims: Mapping[str, str] | None = None,
                     requests: Collection[str] = (), dead_executor_id: str = "",
                     carried: Mapping[str, int] | None = None,
                     rng: random.Random | None = None) -> tuple[PeerT, bool] | None:
    """The peer to recover ``dead_executor_id``, and whether it runs another version; None when there is none.

    Args:
        healthy: the app's HEALTHY executors that a request can be routed to.
        app_version: the dead executor's version. Peers of that version come first; only when none is left
            (after ``exclude``) and ``cross_version_allowed`` are the others candidates.
        exclude: executor ids not to choose (the dead one, peers that already failed this recovery).
        claims: which peer each dead executor's recovery is on (dead executor id -> peer id). The peer with the
            fewest recoveries in flight is chosen, so a crowd of dead executors spreads evenly; the claim of
            ``dead_executor_id`` itself does not count (it is being moved).
        requests: the peer of each operator's request in flight (one entry per request): each counts as a
            recovery in flight on it.
        carried: recoveries each peer carried recently, finished ones included (peer id -> count). Among the
            least busy, the peer that carried the fewest is chosen: recoveries paced one at a time each find no
            recovery in flight, and would otherwise land on a random peer every time.
        rng: breaks ties between equally loaded peers (``random`` when None).
    """
    left = [peer for peer in healthy if peer.executor_id not in exclude]
    chosen = [peer for peer in left if peer.app_version == app_version]
    cross_version = not chosen and cross_version_allowed and bool(left)
    if cross_version:
        chosen = left
    if not chosen:
        return None
    load = Counter(peer for dead, peer in (claims or {}).items() if dead != dead_executor_id)
    load.update(requests)
    done = carried or {}
    # One pass, with dict.get (a Counter's missing key goes through __missing__): an app may have thousands of peers.
    keyed = [((load.get(peer.executor_id, 0), done.get(peer.executor_id, 0)), peer) for peer in chosen]
    least = min(key for key, _ in keyed)
    tied = [peer for key, peer in keyed if key == least]
    return (rng or random).choice(tied), cross_version


def select_retention_executor(healthy: Sequence[RegisteredT], *, exclude: Collection[str] = (),
                              latest: str | None = None) -> RegisteredT | None:
    """The executor to run an app's retention round: newest application version first; None when none is left.

    ``latest`` is the latest version as the app's SDK reports it (``list_application_versions``): its executors
    come first. Otherwise, and once none of it is left, version strings being opaque (often a hash), the newest
    version is the one whose most recent executor registered last; within a version, the executor registered
    last goes first. Versions are ranked over every HEALTHY executor, so excluding one (it failed this round) does
    not demote its version.
    """
    newest: dict[str, datetime] = {}
    for peer in healthy:
        newest[peer.app_version] = max(peer.created_at, newest.get(peer.app_version, peer.created_at))
    left = [peer for peer in healthy if peer.executor_id not in exclude]
    if not left:
        return None
    return max(left, key=lambda peer: (peer.app_version == latest, newest[peer.app_version], peer.created_at,
                                       peer.executor_id))
