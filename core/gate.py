"""The recovery gate: whether a DEAD executor's recovery may go now, or must wait, and until when.

Pure logic, no I/O: ``core.store.Store.admit_recovery`` loads an app's gate, pause and the asking executor's ticket
under the gate's row lock, calls ``admit`` with a ``Fleet`` that counts the storm in the database, and writes back
what it changed. ``InMemory`` is the same fleet as plain mappings (the decision's tests, and its definition). The
lifecycle workflow asks before a recovery's first request and, told to wait, waits durably (a Temporal timer) and
asks again.

- **Pause.** While an operator's pause lasts, nothing is let through; a held recovery asks again at the pause's end
  or every ``pause_recheck``, whichever is sooner (so a pause lifted early is noticed soon). Its ticket is marked
  ``paused``: when the pause ends it is paced, and deaths during a pause (expected: maintenance) never trip the
  breaker.
- **Breaker.** A storm is at least ``storm_share`` of the app's executors, and at least ``storm_min``, gone down
  within ``window``: dead (a ticket), or DEAD or DISCONNECTED in the registry since the window began. Executors
  that die together reach DEAD one after the other, so those still in their grace count as well; otherwise the
  first few would be let through before the storm could be seen. Tripping is one transaction that also writes the
  alert, so there is exactly one per storm. The breaker resets when no death came for a window and every DEAD
  executor's ticket was let through.
- **Pacing.** Only while tripped, or for a ticket that waited for a pause, each new ticket gets the next slot:
  ``pace`` after the last one. Below the storm share nothing is held, however the askers' clocks differ: each
  workflow asks with its own workflow task's start, and under load those of one burst of deaths lag by seconds, so
  a slot handed out a moment ago says nothing of a queue. Slots are handed out under the row lock, so the
  workflows of a storm's dead executors (one each) are serialized. A paced ticket is also let through no sooner
  than ``SPACING`` of a pace after the last one let through: a timer that fired late pushes the one behind it back
  instead of sending two recoveries at once.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

# A paced recovery is let through no sooner than this share of the pace after the last one let through.
SPACING = 0.75
PAUSED = "paused"
PACED = "paced"
# Statuses that count as gone down in the registry (the plain strings of ExecutorStatus).
DOWN = frozenset({"DISCONNECTED", "DEAD"})


@dataclass(frozen=True)
class GatePolicy:
    """``RELAY_RECOVERY_*`` (``core.settings.Settings.recovery_policy``)."""

    storm_share: float = 0.5
    storm_min: int = 3
    window: timedelta = timedelta(seconds=60)
    pace: timedelta = timedelta(seconds=5)
    pause_recheck: timedelta = timedelta(seconds=15)


@dataclass
class Ticket:
    """One death's passage through the gate (``core.models.RecoveryTicket``)."""

    key: str
    died_at: datetime
    slot_at: datetime | None = None
    granted_at: datetime | None = None
    paused: bool = False
    held: str = ""


@dataclass
class Breaker:
    """The app's gate row (``core.models.RecoveryGate``)."""

    tripped_at: datetime | None = None
    trips: int = 0
    last_slot_at: datetime | None = None
    last_granted_at: datetime | None = None


@dataclass(frozen=True)
class Registered:
    """What the gate reads of a registry row."""

    status: str
    updated_at: datetime


@dataclass(frozen=True)
class Decision:
    go: bool
    until: datetime | None = None  # when to ask again (when not ``go``)
    reason: str = ""  # PAUSED or PACED (when not ``go``)
    first_hold: bool = False  # the first time this ticket is held for ``reason``: worth an audit row
    tripped: bool = False  # this admission tripped the breaker: write the alert
    reset: bool = False  # this admission found the breaker's storm over and reset it
    storm: dict[str, int] = field(default_factory=dict)  # down / population, when it tripped
    trip: int = 0  # when it tripped: the app's trip number (``breaker_event_key``)


def breaker_event_key(org: str, app: str, trip: int) -> str:
    """The key of a trip's ``app.recovery.breaker_tripped`` row: one row, and one alert, per trip."""
    return f"recovery-breaker/{org}/{app}/{trip}"


def storm_size(since: datetime, registry: Mapping[str, Registered], tickets: Mapping[str, Ticket], *,
               healthy_left_out: int = 0) -> tuple[int, int]:
    """``(down, population)``: the executors gone down since ``since`` (the window's start), and the app's executors
    then.

    ``healthy_left_out``: HEALTHY executors without a ticket that ``registry`` leaves out (they only count)."""
    recent = {i for i, t in tickets.items() if t.died_at >= since}
    down = {i for i in recent if not tickets[i].paused}
    down |= {i for i, row in registry.items()
             if row.status in DOWN and row.updated_at >= since and not (i in recent and tickets[i].paused)}
    return len(down), len(set(registry) | recent) + healthy_left_out


def tripping(down: int, population: int, policy: GatePolicy) -> bool:
    return down >= policy.storm_min and down >= policy.storm_share * population


def storm_over(since: datetime, executor_id: str, registry: Mapping[str, Registered],
               tickets: Mapping[str, Ticket]) -> bool:
    """No other death since ``since`` (the window's start), and every other DEAD executor's ticket let through."""
    others = {i: t for i, t in tickets.items() if i != executor_id}
    quiet = all(t.died_at < since for t in others.values())
    done = all(t.granted_at is not None for i, t in others.items()
               if i in registry and registry[i].status == "DEAD")
    return quiet and done


class Fleet(Protocol):
    """What the breaker reads of the app beyond the asking executor's own ticket: the other deaths, as two
    questions. ``InMemory`` answers them from mappings; the store (``core.store.gate``) with counts in the
    database, so that an admission costs the same whatever the size of the storm."""

    def storm_size(self, since: datetime, executor_id: str, ticket: Ticket) -> tuple[int, int]:
        """``storm_size`` with ``executor_id``'s ticket being ``ticket`` (whatever is stored)."""
        ...

    def storm_over(self, since: datetime, executor_id: str) -> bool:
        """``storm_over``: no other death since ``since``, every other DEAD executor's ticket let through."""
        ...


@dataclass(frozen=True)
class InMemory:
    """The app as mappings (``Fleet``).

    Attributes:
        registry: the app's executors by id: at least every one not HEALTHY and every one with a ticket.
        tickets: the app's stored tickets by id.
        healthy_left_out: how many of the app's executors ``registry`` leaves out (HEALTHY, without a ticket).
    """

    registry: Mapping[str, Registered]
    tickets: Mapping[str, Ticket]
    healthy_left_out: int = 0

    def storm_size(self, since: datetime, executor_id: str, ticket: Ticket) -> tuple[int, int]:
        tickets = {**{i: t for i, t in self.tickets.items() if i != executor_id}, executor_id: ticket}
        return storm_size(since, self.registry, tickets, healthy_left_out=self.healthy_left_out)

    def storm_over(self, since: datetime, executor_id: str) -> bool:
        return storm_over(since, executor_id, self.registry, self.tickets)


def admit(*, executor_id: str, key: str, now: datetime, ticket: Ticket | None, breaker: Breaker,
          pause_until: datetime | None, fleet: Fleet, policy: GatePolicy) -> tuple[Ticket, Decision]:
    """Decide for ``executor_id``'s death ``key`` at ``now``. Updates ``breaker`` in place; returns the ticket to
    store (new when ``ticket`` is None or about an earlier death) and the decision.

    Args:
        ticket: the executor's stored ticket, if any.
        breaker: the app's gate.
        pause_until: the app's pause, if any (expired or not).
        fleet: the app's other executors and tickets, as the breaker reads them.
    """
    if ticket is None or ticket.key != key:
        ticket = Ticket(key=key, died_at=now)
    if ticket.granted_at is not None:
        return ticket, Decision(go=True)  # asked again (a retried activity, or a run continued-as-new)
    if pause_until is not None and pause_until > now:
        ticket.paused, ticket.slot_at = True, None  # a slot given before the pause is void: paced afterwards
        return ticket, _hold(ticket, PAUSED, min(pause_until, now + policy.pause_recheck))
    reset = tripped = False
    storm: dict[str, int] = {}
    trip = 0
    if ticket.slot_at is None:
        since = now - policy.window
        if breaker.tripped_at is not None and fleet.storm_over(since, executor_id):
            breaker.tripped_at, reset = None, True
        if breaker.tripped_at is None and not ticket.paused:
            down, population = fleet.storm_size(since, executor_id, ticket)
            if tripping(down, population, policy):
                breaker.tripped_at, breaker.trips, tripped = now, breaker.trips + 1, True
                storm, trip = {"down": down, "population": population}, breaker.trips
        ticket.slot_at = _slot(now, breaker, paced=breaker.tripped_at is not None or ticket.paused, policy=policy)
    wait = ticket.slot_at
    if wait <= now and _spaced(ticket, breaker) and breaker.last_granted_at is not None:
        # A timer that fired late must not bunch two recoveries behind it. Not a whole pace: the next timer, on
        # time, would then be sent back for a moment, and Temporal fires a timer under a second about a second late.
        wait = max(wait, breaker.last_granted_at + policy.pace * SPACING)
    if wait <= now:
        ticket.granted_at = breaker.last_granted_at = now
        return ticket, Decision(go=True, tripped=tripped, reset=reset, storm=storm, trip=trip)
    held = _hold(ticket, PACED, wait)
    return ticket, Decision(go=False, until=held.until, reason=PACED, first_hold=held.first_hold, tripped=tripped,
                            reset=reset, storm=storm, trip=trip)


def _spaced(ticket: Ticket, breaker: Breaker) -> bool:
    return breaker.tripped_at is not None or ticket.paused or ticket.held == PACED


def _slot(now: datetime, breaker: Breaker, *, paced: bool, policy: GatePolicy) -> datetime:
    """The ticket's slot: ``pace`` after the last one when ``paced``, else now.

    An unpaced slot still moves ``last_slot_at``, so the first paced one after a trip keeps a pace behind it."""
    last = breaker.last_slot_at
    slot = max(now, last + policy.pace) if paced and last is not None else now
    breaker.last_slot_at = slot if last is None else max(last, slot)
    return slot


def _hold(ticket: Ticket, reason: str, until: datetime) -> Decision:
    first = ticket.held != reason
    ticket.held = reason
    return Decision(go=False, until=until, reason=reason, first_hold=first)
