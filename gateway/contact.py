"""Whether this gateway process is in contact with Temporal, and what it does when it is not.

A gateway can lose Temporal while the worker and the other gateways still reach it (a partition). To them it
looks exactly like a dead gateway — its watch stops hearing from it and, once a probe goes unanswered, its
executors are disconnected and, a grace later, recovered — yet its executors still hold live sockets to it. So a
gateway out of contact for ``fence_after`` (shorter than the time its watch needs to declare it gone) fences
itself: it closes its executor sockets with a code that makes the SDKs reconnect, and refuses upgrades until
contact is back, so the executors reach a gateway that can speak for them. When contact comes back it reconciles
the sockets it holds with the registry and makes sure its watch runs.

``ContactState`` is the bookkeeping (no I/O, the caller supplies the clock); ``Contact`` runs the check loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import timedelta

log = logging.getLogger("relay.contact")

Clock = Callable[[], float]


class Change(enum.Enum):
    LOST = "lost"  # the first check that failed: logged once
    FENCED = "fenced"  # out of contact for ``fence_after``: close the sockets, refuse upgrades
    REGAINED = "regained"  # a check succeeded after failures: unfence, reconcile


@dataclass
class ContactState:
    """Contact stretches on a monotonic clock (wall-clock jumps change nothing)."""

    fence_after: timedelta
    clock: Clock = time.monotonic
    in_contact: bool = True  # the gateway starts right after connecting to Temporal
    fenced: bool = False
    since: float = field(default=0.0)  # start of the current stretch, in contact or not
    last_ok: float = field(default=0.0)
    reason: str = ""

    def __post_init__(self) -> None:
        self.since = self.last_ok = self.clock()

    def observe(self, ok: bool, reason: str = "") -> Change | None:
        """One check's outcome; the change it makes, if any."""
        now = self.clock()
        if ok:
            self.last_ok = now
            if self.in_contact:
                return None
            self.in_contact, self.fenced, self.since, self.reason = True, False, now, ""
            return Change.REGAINED
        self.reason = reason
        if self.in_contact:
            self.in_contact, self.since = False, self.last_ok
            return Change.LOST if now - self.last_ok < self.fence_after.total_seconds() else self._fence()
        if not self.fenced and now - self.last_ok >= self.fence_after.total_seconds():
            return self._fence()
        return None

    def _fence(self) -> Change:
        self.fenced = True
        return Change.FENCED

    def contact_for(self) -> timedelta:
        """How long contact has lasted without a break (zero while out of contact)."""
        return timedelta(seconds=self.clock() - self.since) if self.in_contact else timedelta(0)

    def away_for(self) -> timedelta:
        return timedelta(0) if self.in_contact else timedelta(seconds=self.clock() - self.last_ok)


@dataclass
class Contact:
    """Checks Temporal every ``every`` and calls ``on_change`` for each change (fence, regain)."""

    check: Callable[[], Awaitable[object]]
    on_change: Callable[[Change], Awaitable[None]]
    state: ContactState
    target: str
    every: timedelta = timedelta(seconds=1)
    # A frozen server (SIGSTOP) answers nothing: a check must fail on its own, well within the fence time.
    timeout: timedelta = timedelta(seconds=1)

    async def _check(self) -> str | None:
        """None when Temporal answered; otherwise why not. A quick failure is tried once more: the server closes
        each client connection at its maximum age (5 minutes by default), failing a check in flight once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout.total_seconds()
        reason = "no answer"
        for _ in range(2):
            try:
                await asyncio.wait_for(self.check(), max(0.05, deadline - loop.time()))
                return None
            except Exception as err:  # any failure to reach Temporal counts, whatever its type
                reason = f"{type(err).__name__}: {err}".strip(": ") or "no answer"
            if deadline - loop.time() < 0.1:
                break
            await asyncio.sleep(0.05)
        return reason

    async def once(self) -> None:
        failure = await self._check()
        ok, reason = failure is None, failure or ""
        away = self.state.away_for()
        change = self.state.observe(ok, reason[:200])
        if change is Change.LOST:
            log.warning("Temporal at %s is unreachable: %s", self.target, self.state.reason)
        elif change is Change.FENCED:
            log.warning("Temporal at %s unreachable for %.1f s: fencing this gateway (executor sockets closed, "
                        "upgrades refused until it is back)", self.target, self.state.away_for().total_seconds())
        elif change is Change.REGAINED:
            log.info("Temporal at %s is reachable again (away %.1f s)", self.target, away.total_seconds())
        if change is not None:
            try:
                await self.on_change(change)
            except Exception:  # a failed reaction must not end the loop: the next change must still be handled
                log.exception("reacting to contact %s failed", change.value)

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Contact]:
        async def loop() -> None:
            while True:
                started = asyncio.get_running_loop().time()
                await self.once()
                elapsed = asyncio.get_running_loop().time() - started
                await asyncio.sleep(max(0.0, self.every.total_seconds() - elapsed))

        task = asyncio.create_task(loop(), name="relay-temporal-contact")
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
