"""Gateways that stay balanced: a gateway holding more than its share of the live gateways' executor sockets closes
the excess, a few at a time, so the load balancer sends them to the others.

A load balancer spreads new sockets (HAProxy's ``leastconn``), but executor sockets live for hours: after a rolling
restart every one of them sits on the gateway restarted first, and nothing moves them back. So every
``RELAY_GATEWAY_REBALANCE_CHECK_SECS`` each gateway reports its socket count and whether it takes new ones to the
gateway registry (``core.gateways``), and reads the others'. One over its share (``excess``) closes that many of its
executors with 1012 (every SDK reconnects after any close, through the load balancer, to the gateway holding fewest):

- idle ones only: never an executor with a request in flight (a recovery, an operator's request), checked at the
  moment of the close; never one whose ``connected`` has not landed; never one closed for this in the last minutes;
- at most ``RELAY_GATEWAY_REBALANCE_PER_SECOND``, and a batch only once the one before was taken in (every executor
  of it back on a gateway, or its handoff over) and every peer has reported since: never faster than the others
  take them, never on counts from before the last batch moved; and a pause of a few checks when the load balancer
  sent one straight back here (a new peer not yet in its rotation);
- not while it drains, is fenced, or is alone.

A socket closed for this is not a disconnect that starts a grace: its ``disconnected`` is held for
``RELAY_GATEWAY_REBALANCE_HANDOFF_SECS`` (the handoff) and dropped once the registry names another connection of
the executor (its new gateway wrote it). One not back within the handoff is disconnected then, as any closed
socket: the first rule holds, its grace only starts that much later. If this process stops meanwhile, what it still
holds back is disconnected as it drains (``stop``); if it dies, its watch disconnects every executor the registry
still places on it, as for any gateway found gone.

Each rebalance (from the first close until the spread is within the tolerance) is one audit row per org whose
executors moved (``gateway.rebalanced``) and one log line; ``relay_gateway_rebalance_shed_total``, the handoffs'
outcomes and ``relay_gateway_fair_share`` show it as it goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from core import metrics
from core.settings import Settings
from core.store import Store
from core.units import utcnow
from gateway.hub import Connection, ConnectionKey, Hub

log = logging.getLogger("relay.gateway")

REBALANCE_CLOSE_CODE = 1012  # "Service Restart": every SDK reconnects after it (as after the drain's)
REBALANCE_CLOSE_REASON = "rebalancing gateways; reconnect"
REBALANCED_OPERATION = "gateway.rebalanced"
# A peer that has not reported for this many checks is not counted on (crashed, cut off, or from before reports).
FRESH_CHECKS = 3
# An executor closed for balance is not chosen again for this many checks (the load balancer may send it back here).
SPARED_CHECKS = 60
# How often held-back disconnects look at the registry for the executors' new connections.
HANDOFF_POLL = timedelta(milliseconds=250)
# Executor ids named in a rebalance's audit row, at most (the count is always whole).
AUDITED_IDS = 100
# An executor closed for balance that the load balancer sent straight back here (the peers not in its rotation yet: a
# replacement is UP in HAProxy only after its `rise` checks) pauses the shedding for this many checks.
RETURNED_PAUSE_CHECKS = 3


def excess(counts: dict[str, int], mine: str, tolerance: float) -> int:
    """How many sockets the gateway ``mine`` should close, given every live gateway's count (``mine`` included): the
    whole sockets it holds over the even share, once the spread (largest minus smallest) is more than ``tolerance``
    of that share. Zero when it is alone, at or under its share, or the spread is within the tolerance."""
    if len(counts) < 2 or mine not in counts:
        return 0
    share = sum(counts.values()) / len(counts)
    if max(counts.values()) - min(counts.values()) <= tolerance * share:
        return 0
    return max(0, math.floor(counts[mine] - share))


@dataclass
class _Rebalance:
    """One rebalance in progress: from its first close until the spread is within the tolerance."""

    started: float
    before: dict[str, int]
    shed: dict[str, list[str]] = field(default_factory=dict)  # executor ids closed, by org


@dataclass(frozen=True)
class _Held:
    """A disconnect held back for the handoff."""

    org: str
    app: str
    executor_id: str
    connection_id: str
    closed_at: float


class Balancer:
    """Reports this gateway's count, sheds its excess, and holds back the disconnects of what it shed."""

    def __init__(self, *, settings: Settings, store: Store, hub: Hub, task_queue: str,
                 accepting: Callable[[], bool], disconnect: Callable[[str, str, str, str], None]) -> None:
        self.settings = settings
        self.store = store
        self.hub = hub
        self.task_queue = task_queue
        self._accepting = accepting
        self._disconnect = disconnect  # ``Gateway.spawn_disconnected``
        self._held: dict[ConnectionKey, _Held] = {}
        self._spared: dict[ConnectionKey, float] = {}
        self._rebalance: _Rebalance | None = None
        self._batch_settled_at: datetime | None = None  # when the last batch was all taken in
        self._reported_at: datetime | None = None  # when this gateway last reported (its previous check)
        self._paused_until = 0.0  # monotonic: a batch came back here (``RETURNED_PAUSE_CHECKS``)
        self._first_seen: dict[str, float] = {}  # monotonic: when each peer was first seen taking sockets
        self._watching: asyncio.Task[None] | None = None

    @property
    def check(self) -> timedelta:
        return self.settings.gateway_rebalance_check

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        task = asyncio.create_task(self._run(), name="relay-gateway-balance")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while True:
            try:
                await self.tick()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # the database away: reported elsewhere; a report missed is only stale
                log.debug("balance check failed: %s", err)
            await asyncio.sleep(self.check.total_seconds())

    async def tick(self) -> int:
        """One check: report, then shed what is over the share (spaced by the rate). How many it closed."""
        accepting = self._accepting()
        reported = utcnow()
        await asyncio.to_thread(self.store.gateways.report, self.task_queue, sockets=len(self.hub),
                                accepting=accepting)
        previous, self._reported_at = self._reported_at, reported
        if not (accepting and self.settings.gateway_rebalance):
            metrics.FAIR_SHARE.set(0)
            await self._end()
            return 0
        if self._held or time.monotonic() < self._paused_until:  # the last batch still being taken in, or back
            return 0
        reports = await asyncio.to_thread(self.store.gateways.live_counts, self.check * FRESH_CHECKS)
        reported_by_peers = [at for queue, (_, at) in reports.items() if queue != self.task_queue]
        settled = self._batch_settled_at
        if settled is not None and any(at < settled for at in reported_by_peers):
            return 0  # a peer's count from before the last batch moved: wait for its next report
        if previous is not None and any(at < previous for at in reported_by_peers):
            # A peer silent since this gateway's last check may have just died: a crash is known only once its watch
            # finds it gone, and its last report counts for FRESH_CHECKS. What is shed toward a dead gateway comes
            # straight back; so nothing is shed until it reports again or its report goes stale.
            return 0
        # A peer counts once it has been seen taking sockets for a whole check: a load balancer puts a new gateway
        # in its rotation only after a few health checks (HAProxy's `rise 2`, `inter 2s`), and what is shed before
        # then comes straight back.
        now = time.monotonic()
        self._first_seen = {queue: self._first_seen.get(queue, now) for queue in reports}
        counts = {queue: sockets for queue, (sockets, _) in reports.items()
                  if now - self._first_seen[queue] >= self.check.total_seconds()} | {self.task_queue: len(self.hub)}
        metrics.FAIR_SHARE.set(sum(counts.values()) / len(counts) if len(counts) > 1 else 0)
        over = excess(counts, self.task_queue, self.settings.gateway_rebalance_tolerance)
        if over == 0:
            await self._end(counts)
            return 0
        if self._rebalance is None:
            self._rebalance = _Rebalance(started=time.monotonic(), before=counts)
            log.info("rebalancing: %d executor sockets here, %.1f the share of %d live gateways; closing %d, at "
                     "most %g a second", counts[self.task_queue], sum(counts.values()) / len(counts), len(counts),
                     over, self.settings.gateway_rebalance_per_second)
        batch = min(over, max(1, math.floor(self.settings.gateway_rebalance_per_second * self.check.total_seconds())))
        return await self._shed(batch)

    async def _shed(self, batch: int) -> int:
        now = time.monotonic()
        spared_for = self.check.total_seconds() * SPARED_CHECKS
        self._spared = {key: at for key, at in self._spared.items() if now - at < spared_for}
        chosen = [c for c in self.hub.connections() if c.landed and (c.org, c.app, c.executor_id) not in self._spared]
        random.shuffle(chosen)
        gap = 1 / self.settings.gateway_rebalance_per_second
        closed = 0
        for conn in chosen:
            if closed == batch or not self._accepting():
                break
            # Checked at the close itself (no await between): a request sent to it from here on finds it closing.
            if not conn.idle or self.hub.find(conn.org, conn.app, conn.executor_id) is not conn:
                continue
            if closed:
                await asyncio.sleep(gap)
                if not conn.idle or self.hub.find(conn.org, conn.app, conn.executor_id) is not conn:
                    continue
            conn.shed = True
            self._spared[(conn.org, conn.app, conn.executor_id)] = time.monotonic()
            await conn.close(REBALANCE_CLOSE_CODE, REBALANCE_CLOSE_REASON)
            metrics.REBALANCE_SHED.inc()
            if self._rebalance is not None:
                self._rebalance.shed.setdefault(conn.org, []).append(conn.executor_id)
            closed += 1
        return closed

    async def _end(self, counts: dict[str, int] | None = None) -> None:
        """The rebalance in progress is over (within the tolerance, or this gateway stopped taking sockets): one
        line and one audit row per org whose executors moved."""
        done, self._rebalance = self._rebalance, None
        if done is None:
            return
        seconds = round(time.monotonic() - done.started, 3)
        total = sum(len(ids) for ids in done.shed.values())
        after = counts or {}
        log.info("rebalanced: closed %d executor sockets in %.1f s; gateways' sockets %s -> %s", total, seconds,
                 sorted(done.before.values(), reverse=True), sorted(after.values(), reverse=True) or "(stopped)")
        for org, ids in done.shed.items():
            details = {"gatewayId": self.settings.gateway_identity, "gatewayQueue": self.task_queue,
                       "closed": len(ids), "closedTotal": total, "seconds": seconds,
                       "executors": ids[:AUDITED_IDS], "before": done.before, "after": after}
            try:
                await asyncio.to_thread(self.store.write_audit, org=org, operation=REBALANCED_OPERATION,
                                        details=details)
            except Exception as err:  # the database away: the log line above must do
                log.warning("could not audit the rebalance for org %s: %s", org, type(err).__name__)

    # -- the handoff --------------------------------------------------------------------------------------------

    def hand_off(self, conn: Connection) -> None:
        """``conn`` was closed for balance and is now gone: hold its disconnect back for the handoff."""
        key = (conn.org, conn.app, conn.executor_id)
        self._held[key] = _Held(conn.org, conn.app, conn.executor_id, conn.connection_id, time.monotonic())
        if self._watching is None or self._watching.done():
            self._watching = asyncio.create_task(self._watch(), name="relay-gateway-handoff")

    async def _watch(self) -> None:
        handoff = self.settings.gateway_rebalance_handoff.total_seconds()
        while self._held:
            await asyncio.sleep(HANDOFF_POLL.total_seconds())
            keys = list(self._held)
            try:
                rows = await self.store.call(self.store.rows_seen, keys)
            except Exception as err:  # the database away: held until the handoff ends, then disconnected
                log.debug("handoff check failed: %s", err)
                rows = None
            now = time.monotonic()
            for key in keys:
                held = self._held.get(key)
                if held is None:
                    continue
                row = rows.get(key) if rows is not None else None
                # Another connection named (by its new gateway, or its workflow), or no row at all any more: the
                # workflow is past this socket, and its disconnect would be stale.
                if rows is not None and (row is None or row.connection_id != held.connection_id):
                    returned = self.hub.find(*key) is not None
                    metrics.REBALANCE_HANDOFFS.labels("returned" if returned else "moved").inc()
                    if returned:
                        self._paused_until = time.monotonic() + self.check.total_seconds() * RETURNED_PAUSE_CHECKS
                    del self._held[key]
                elif now - held.closed_at >= handoff:
                    self._release(key, held)
        self._batch_settled_at = utcnow()

    def _release(self, key: ConnectionKey, held: _Held) -> None:
        del self._held[key]
        metrics.REBALANCE_HANDOFFS.labels("disconnected").inc()
        self._disconnect(held.org, held.app, held.executor_id, held.connection_id)

    def holding(self) -> int:
        """How many disconnects are held back now."""
        return len(self._held)

    async def stop(self) -> int:
        """This process stops: every disconnect still held back is sent now, and a rebalance in progress is over
        (audited as far as it went). How many disconnects were held back."""
        held = list(self._held.items())
        for key, one in held:
            self._release(key, one)
        if self._watching is not None:
            self._watching.cancel()
        await self._end()
        return len(held)
