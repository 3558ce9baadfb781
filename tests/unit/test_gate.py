"""The recovery gate (``core.gate``): pause, pacing slots, storm detection and reset, as pure decisions; then the
store around it (``Store.admit_recovery``: one transaction under the gate's row lock, the breaker's alert once) and
the drain's exclusion from recovery candidates and management candidates."""

from __future__ import annotations

import contextlib
import random
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import delete as sa_delete
from sqlmodel import Session, select

from core import gate
from core.candidates import select_candidate
from core.gate import PACED, PAUSED, Breaker, GatePolicy, Registered, Ticket
from core.models import AuditLog, Executor, ExecutorDrain, RecoveryTicket, make_engine
from core.store import Store
from tests.postgres import postgres_cluster
from workflows.contracts.common import ExecutorInfo, ExecutorStatus

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
POLICY = GatePolicy(storm_share=0.5, storm_min=3, window=timedelta(seconds=60), pace=timedelta(seconds=2),
                    pause_recheck=timedelta(seconds=15))
S = timedelta(seconds=1)


class Gate:
    """One app's gate in memory, fed deaths the way the store feeds it."""

    def __init__(self, healthy: int, policy: GatePolicy = POLICY) -> None:
        self.registry = {f"e{n}": Registered("HEALTHY", T0 - timedelta(hours=1)) for n in range(healthy)}
        self.tickets: dict[str, Ticket] = {}
        self.breaker = Breaker()
        self.pause_until: datetime | None = None
        self.policy = policy

    def dies(self, executor_id: str, at: datetime, status: str = "DEAD") -> None:
        self.registry[executor_id] = Registered(status, at)

    def ask(self, executor_id: str, now: datetime, key: str = "k1") -> gate.Decision:
        ticket, decision = gate.admit(
            executor_id=executor_id, key=key, now=now, ticket=self.tickets.get(executor_id), breaker=self.breaker,
            pause_until=self.pause_until, fleet=gate.InMemory(self.registry, self.tickets), policy=self.policy)
        self.tickets[executor_id] = ticket
        return decision

    def recovered(self, executor_id: str) -> None:
        del self.registry[executor_id]


def test_a_lone_death_goes_at_once() -> None:
    g = Gate(healthy=10)
    g.dies("e0", T0)
    decision = g.ask("e0", T0)
    assert decision.go and not decision.tripped
    assert g.ask("e0", T0 + S).go  # asking again about the same death: still let through


def test_deaths_below_the_storm_go_at_once_whatever_order_their_clocks_come_in() -> None:
    """Each workflow asks with its own clock (its workflow task's start), so a later question may carry an earlier
    time: without a storm or a pause, that is no paced backlog to queue behind."""
    g = Gate(healthy=10)
    for n in range(2):
        g.dies(f"e{n}", T0)
    assert g.ask("e0", T0 + timedelta(milliseconds=300)).go
    assert g.ask("e1", T0 + timedelta(milliseconds=100)).go


def _drifting_clocks(count: int, at: datetime) -> list[datetime]:
    """The clocks a burst of ``count`` deaths asks the gate with, in the order they ask: each is its workflow task's
    start, and under load later askers carry earlier clocks, up to 10 s behind (more than half a pace, more than a
    second). Seeded: the same drift every run."""
    rng = random.Random(19)
    clocks = [at + timedelta(milliseconds=rng.randrange(10_000)) for _ in range(count)]
    assert any(clocks[i] - clocks[j] > 3 * S for i in range(count) for j in range(i + 1, count))
    return clocks


def test_deaths_below_the_storm_are_never_held_however_far_their_clocks_drift() -> None:
    """14 of 30 executors (under half) die together and their workflows ask with clocks seconds apart.
    Below the storm share nothing is held: every one goes at once, the breaker never trips."""
    g = Gate(healthy=30)
    for n in range(14):
        g.dies(f"e{n}", T0)
    decisions = [g.ask(f"e{n}", now) for n, now in enumerate(_drifting_clocks(14, T0 + 3 * S))]
    assert [(d.go, d.reason, d.until) for d in decisions] == [(True, "", None)] * 14
    assert not any(d.tripped for d in decisions) and g.breaker.trips == 0


def _assert_paced(g: Gate, asked: list[tuple[str, datetime, gate.Decision]]) -> None:
    """One slot per pace, in the order they asked: each is a pace after the one before or, when the asker's clock is
    later still, its clock (it goes at once); the others are held until their slot."""
    slots = [g.tickets[executor_id].slot_at for executor_id, _, _ in asked]
    assert all(a is not None and b is not None and b - a >= POLICY.pace
               for a, b in zip(slots, slots[1:], strict=False))
    for (_, now, decision), slot in zip(asked, slots, strict=True):
        assert (decision.go, decision.reason, decision.until) == ((True, "", None) if slot == now else
                                                                  (False, PACED, slot))


def test_a_tripped_breaker_paces_one_per_pace_however_far_the_clocks_drift() -> None:
    """The companion: the same 14 deaths with the same clocks, but of 20 executors (over half). The breaker trips
    once, and the recoveries are paced one per pace, most of them held."""
    g = Gate(healthy=20)
    for n in range(14):
        g.dies(f"e{n}", T0)
    asked = [(f"e{n}", now, g.ask(f"e{n}", now)) for n, now in enumerate(_drifting_clocks(14, T0 + 3 * S))]
    assert asked[0][2].go and asked[0][2].tripped and g.breaker.trips == 1
    _assert_paced(g, asked)
    assert sum(not d.go for _, _, d in asked) >= 10


def test_after_a_pause_the_paused_are_paced_and_a_fresh_death_below_the_storm_is_not() -> None:
    """Tickets that waited for a pause are paced when it ends, whatever their clocks; an executor that dies after
    it, below the storm share, goes at once instead of queuing behind them."""
    g = Gate(healthy=30)
    g.pause_until = end = T0 + timedelta(minutes=5)
    for n in range(14):
        g.dies(f"e{n}", T0)
        assert g.ask(f"e{n}", T0).reason == PAUSED
    asked = [(f"e{n}", now, g.ask(f"e{n}", now)) for n, now in enumerate(_drifting_clocks(14, end))]
    assert not any(d.tripped for _, _, d in asked)
    _assert_paced(g, asked)
    assert sum(not d.go for _, _, d in asked) >= 10
    g.dies("e20", end + S)
    fresh = g.ask("e20", end + S)
    assert fresh.go and not fresh.tripped


def test_a_pause_holds_until_its_end_rechecking_and_then_paces_the_backlog() -> None:
    g = Gate(healthy=10)
    g.pause_until = T0 + timedelta(minutes=5)
    for n in range(3):
        g.dies(f"e{n}", T0)
    first = g.ask("e0", T0)
    assert (first.go, first.reason, first.until, first.first_hold) == (False, PAUSED, T0 + 15 * S, True)
    again = g.ask("e0", T0 + 15 * S)
    assert (again.go, again.first_hold) == (False, False)  # held for the same reason: audited once
    g.ask("e1", T0 + S)
    g.ask("e2", T0 + S)
    near_end = g.ask("e0", T0 + timedelta(minutes=4, seconds=55))
    assert near_end.until == T0 + timedelta(minutes=5)  # never past the pause's end
    end = T0 + timedelta(minutes=5)
    decisions = [g.ask(f"e{n}", end) for n in range(3)]
    assert [d.go for d in decisions] == [True, False, False]
    assert [d.until for d in decisions[1:]] == [end + 2 * S, end + 4 * S]
    assert not any(d.tripped for d in decisions)  # deaths during a pause are expected: no storm
    assert g.ask("e1", end + 2 * S).go and not g.ask("e2", end + 3 * S).go and g.ask("e2", end + 4 * S).go


def test_a_pause_lifted_early_is_seen_at_the_next_look() -> None:
    g = Gate(healthy=10)
    g.pause_until = T0 + timedelta(hours=1)
    g.dies("e0", T0)
    assert g.ask("e0", T0).until == T0 + 15 * S
    g.pause_until = None  # DELETE /recovery-pause
    assert g.ask("e0", T0 + 15 * S).go


def test_a_slot_given_before_a_pause_is_void() -> None:
    g = Gate(healthy=4)
    for n in range(3):
        g.dies(f"e{n}", T0)
    assert [g.ask(f"e{n}", T0).go for n in range(3)] == [True, False, False]  # tripped: 3 of 4
    g.pause_until = T0 + timedelta(seconds=30)
    assert g.ask("e1", T0 + 2 * S).reason == PAUSED  # each asks again at its slot: within the pause
    assert g.ask("e2", T0 + 4 * S).reason == PAUSED
    end = T0 + 30 * S
    assert g.ask("e1", end).go
    after = g.ask("e2", end)
    assert (after.go, after.reason, after.until) == (False, PACED, end + 2 * S)  # not both at once


def test_the_storm_trips_once_and_paces_every_death_at_the_rate() -> None:
    g = Gate(healthy=12)
    for n in range(10):
        g.dies(f"e{n}", T0, status="DISCONNECTED")  # they die together: still in their grace
    g.dies("e0", T0 + timedelta(seconds=60))
    first = g.ask("e0", T0 + timedelta(seconds=60))
    assert first.go and first.tripped and first.storm == {"down": 10, "population": 12}
    slots = []
    now = T0 + timedelta(seconds=60)
    for n in range(1, 10):
        g.dies(f"e{n}", now)
        decision = g.ask(f"e{n}", now)
        assert not decision.go and decision.reason == PACED and not decision.tripped
        slots.append(decision.until)
    assert slots == [now + 2 * S * k for k in range(1, 10)]
    assert g.breaker.trips == 1
    for n, slot in enumerate(slots, start=1):
        assert slot is not None
        assert not g.ask(f"e{n}", slot - timedelta(milliseconds=1)).go
        assert g.ask(f"e{n}", slot).go


def test_a_late_timer_does_not_bunch_two_recoveries() -> None:
    g = Gate(healthy=4)
    for n in range(3):
        g.dies(f"e{n}", T0)
    assert [g.ask(f"e{n}", T0).until for n in range(3)] == [None, T0 + 2 * S, T0 + 4 * S]
    late = T0 + 3.9 * S  # e1's timer fired 1.9 s late
    assert g.ask("e1", late).go
    on_time = g.ask("e2", T0 + 4 * S)
    assert (on_time.go, on_time.until) == (False, late + 1.5 * S)  # pushed back, not let through 0.1 s after e1
    assert g.ask("e2", late + 1.5 * S).go


@pytest.mark.parametrize(("healthy", "dead", "trips"), [
    (12, 5, False),  # 5 of 12: under half
    (12, 6, True),  # 6 of 12: half
    (4, 2, False),  # half, but fewer than the minimum of 3
    (4, 3, True),
])
def test_storm_thresholds(healthy: int, dead: int, trips: bool) -> None:
    g = Gate(healthy=healthy)
    for n in range(dead):
        g.dies(f"e{n}", T0)
    decisions = [g.ask(f"e{n}", T0) for n in range(dead)]
    assert any(d.tripped for d in decisions) is trips
    assert sum(d.tripped for d in decisions) == (1 if trips else 0)


def test_deaths_outside_the_window_are_no_storm() -> None:
    g = Gate(healthy=6)
    for n in range(4):  # one a minute and a half: never 3 within a minute
        at = T0 + n * timedelta(seconds=90)
        g.dies(f"e{n}", at)
        decision = g.ask(f"e{n}", at)
        assert decision.go and not decision.tripped
        g.recovered(f"e{n}")


def test_the_breaker_resets_once_quiet_and_through_and_trips_again_on_a_new_storm() -> None:
    g = Gate(healthy=6)
    for n in range(3):
        g.dies(f"e{n}", T0)
        g.ask(f"e{n}", T0)
    assert g.breaker.tripped_at == T0
    later = T0 + timedelta(seconds=30)
    g.dies("e3", later)
    assert not g.ask("e3", later).reset  # deaths within the window: still the same storm
    for n in range(1, 4):  # the backlog goes through
        g.ask(f"e{n}", later + timedelta(seconds=10))
    quiet = later + timedelta(seconds=61)
    g.dies("e4", quiet)
    decision = g.ask("e4", quiet)
    assert decision.reset and decision.go and g.breaker.tripped_at is None


def test_the_breaker_stays_while_a_dead_executor_still_waits() -> None:
    g = Gate(healthy=4)
    for n in range(3):
        g.dies(f"e{n}", T0)
        g.ask(f"e{n}", T0)
    assert g.tickets["e2"].granted_at is None  # still waiting for its slot
    g.dies("e3", T0 + timedelta(minutes=5))
    assert not g.ask("e3", T0 + timedelta(minutes=5)).reset


def test_a_new_death_of_a_revived_executor_asks_anew() -> None:
    g = Gate(healthy=10)
    g.pause_until = T0 + timedelta(minutes=1)
    g.dies("e0", T0)
    assert g.ask("e0", T0 + 2 * timedelta(minutes=1), key="first").go
    g.pause_until = T0 + timedelta(minutes=10)
    assert not g.ask("e0", T0 + timedelta(minutes=3), key="second").go  # not let through on the old ticket


def test_candidates_spread_recoveries_by_what_each_peer_carried() -> None:
    peers = [_Peer("a"), _Peer("b"), _Peer("c")]
    carried: dict[str, int] = {}
    for n in range(10):
        found = select_candidate(peers, app_version="v1", carried=carried, dead_executor_id=f"d{n}")
        assert found is not None
        carried[found[0].executor_id] = carried.get(found[0].executor_id, 0) + 1
    assert sorted(carried.values()) == [3, 3, 4]


class _Peer:
    def __init__(self, executor_id: str) -> None:
        self.executor_id, self.app_version, self.created_at = executor_id, "v1", T0


# -- the store ------------------------------------------------------------------------------------------------

ORG, APP = "local", "orders"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.e2e)])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """On SQLite, and on PostgreSQL (a private cluster: Debian's server binaries, so in the e2e tier)."""
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            url = f"sqlite:///{tmp_path / 'relay.db'}"
        else:
            url = stack.enter_context(postgres_cluster()).create_database("gate")
        store = Store(make_engine(url))
        store.ensure_app(ORG, APP)
        yield store
        store.engine.dispose()


def _record(store: Store, executor_id: str, status: ExecutorStatus = ExecutorStatus.HEALTHY) -> None:
    store.record_status(org=ORG, app=APP, executor_id=executor_id, status=status, operation="executor.x",
                        event_key=uuid.uuid4().hex, info=ExecutorInfo(executor_id, application_version="v1"),
                        connection_id=f"c-{executor_id}", gateway_queue="q", details={})


def _audits(store: Store, operation: str) -> list[AuditLog]:
    with Session(store.engine) as s:
        return list(s.exec(select(AuditLog).where(AuditLog.operation == operation)).all())


def test_drained_executors_are_neither_recovery_nor_management_nor_retention_candidates(store: Store) -> None:
    for name in ("a", "b", "c"):
        _record(store, name)
    _record(store, "dead", ExecutorStatus.DEAD)
    now = datetime.now(UTC)
    store.set_drain(org=ORG, app=APP, executor_id="a", until=now + timedelta(hours=1), reason="deploy",
                    subject="system", source_ip="", details={})
    store.set_drain(org=ORG, app=APP, executor_id="b", until=now - timedelta(seconds=1), reason="expired",
                    subject="system", source_ip="", details={})
    assert sorted(e.executor_id for e in store.management_candidates(ORG, APP).executors) == ["b", "c"]
    chosen = {store.select_candidate(org=ORG, app=APP, app_version="v1", exclude=["dead"])[0].executor_id  # type: ignore[index]
              for _ in range(20)}
    assert chosen == {"b", "c"}
    store.set_drain(org=ORG, app=APP, executor_id="c", until=now + timedelta(hours=1), reason="", subject="system",
                    source_ip="", details={})
    store.set_drain(org=ORG, app=APP, executor_id="b", until=now + timedelta(hours=1), reason="", subject="system",
                    source_ip="", details={})
    assert store.select_candidate(org=ORG, app=APP, app_version="v1", exclude=["dead"]) is None
    assert store.management_candidates(ORG, APP).executors == []
    assert store.select_retention_executor(org=ORG, app=APP, exclude=[]) is None  # nor do they run retention
    store.clear_drain(org=ORG, app=APP, executor_id="c", subject="system", source_ip="")
    assert [e.executor_id for e in store.management_candidates(ORG, APP).executors] == ["c"]
    # A status write (the lifecycle rewrites the registry row) leaves the drain in force.
    _record(store, "a")
    assert "a" not in {e.executor_id for e in store.management_candidates(ORG, APP).executors}
    with Session(store.engine) as s:
        assert sorted(d.executor_id for d in s.exec(select(ExecutorDrain)).all()) == ["a", "b"]


def test_admissions_of_a_storm_are_serialized_and_alert_once(store: Store) -> None:
    """Ten dead executors' workflows ask at once, from ten threads: one trip, one alert, distinct paced slots."""
    for n in range(12):
        _record(store, f"e{n}")
    for n in range(10):
        _record(store, f"e{n}", ExecutorStatus.DEAD)
    now = datetime.now(UTC)

    def ask(n: int) -> gate.Decision:
        return store.admit_recovery(org=ORG, app=APP, executor_id=f"e{n}", ticket=f"t{n}", now=now, policy=POLICY,
                                    event_key=f"wf-{n}")

    with ThreadPoolExecutor(10) as pool:
        decisions = list(pool.map(ask, range(10)))
    assert sum(d.go for d in decisions) == 1
    assert sum(d.tripped for d in decisions) == 1
    slots = sorted(d.until for d in decisions if d.until is not None)
    assert slots == [now + 2 * S * k for k in range(1, 10)]
    assert len(_audits(store, "app.recovery.breaker_tripped")) == 1
    assert len(_audits(store, "executor.recovery.held")) == 9
    [went] = [n for n, d in enumerate(decisions) if d.go]
    assert ask(went).go and len(_audits(store, "app.recovery.breaker_tripped")) == 1  # asked again: nothing new


def test_held_again_for_a_reason_held_before_is_audited_again(store: Store) -> None:
    """paused, then paced, then paused again (a second pause): three held rows, and no duplicate-key failure."""
    for n in range(4):
        _record(store, f"e{n}", ExecutorStatus.DEAD if n < 3 else ExecutorStatus.HEALTHY)
    now = datetime.now(UTC)
    for n in range(3):  # tripped: e1 and e2 paced
        store.admit_recovery(org=ORG, app=APP, executor_id=f"e{n}", ticket="t", now=now, policy=POLICY, event_key="k")
    store.set_pause(org=ORG, app=APP, until=now + 3 * S, reason="", subject="system", source_ip="", details={})
    assert store.admit_recovery(org=ORG, app=APP, executor_id="e2", ticket="t", now=now + S, policy=POLICY,
                                event_key="k").reason == PAUSED
    assert store.admit_recovery(org=ORG, app=APP, executor_id="e2", ticket="t", now=now + 3 * S, policy=POLICY,
                                event_key="k").reason == PACED  # paced again, after the pause
    store.set_pause(org=ORG, app=APP, until=now + 9 * S, reason="", subject="system", source_ip="", details={})
    assert store.admit_recovery(org=ORG, app=APP, executor_id="e1", ticket="t", now=now + 4 * S, policy=POLICY,
                                event_key="k").reason == PAUSED
    held = [(a.executor_id, a.details["reason"]) for a in _audits(store, "executor.recovery.held")
            if a.details is not None]
    assert sorted(held) == [("e1", PACED), ("e1", PAUSED), ("e2", PACED), ("e2", PACED), ("e2", PAUSED)]


def test_the_chosen_peer_is_recorded_on_the_ticket_and_spreads_paced_recoveries(store: Store) -> None:
    for name in ("s1", "s2"):
        _record(store, name)
    for n in range(6):
        _record(store, f"d{n}", ExecutorStatus.DEAD)
    now = datetime.now(UTC)
    carried: dict[str, int] = {}
    for n in range(6):  # one at a time, each recovery finished before the next: no claim in flight
        store.admit_recovery(org=ORG, app=APP, executor_id=f"d{n}", ticket="t", now=now + n * 2 * S, policy=POLICY)
        found = store.select_candidate(org=ORG, app=APP, app_version="v1", exclude=[f"d{n}"],
                                       dead_executor_id=f"d{n}")
        assert found is not None
        carried[found[0].executor_id] = carried.get(found[0].executor_id, 0) + 1
        store.delete_executor(org=ORG, app=APP, executor_id=f"d{n}", event_key=uuid.uuid4().hex, details={})
    assert carried == {"s1": 3, "s2": 3}
    with Session(store.engine) as s:
        assert {t.candidate_id for t in s.exec(select(RecoveryTicket)).all()} == {"s1", "s2"}


def test_an_executor_back_before_its_recovery_leaves_the_gate(store: Store) -> None:
    """Held (a pause), then back: recorded HEALTHY, it is no longer listed as waiting at the gate nor counted as
    gone down; a ticket that was let through stays (it names the peer that carried the recovery)."""
    for name in ("s1", "held", "went"):
        _record(store, name)
    for name in ("held", "went"):
        _record(store, name, ExecutorStatus.DEAD)
    now = datetime.now(UTC)
    assert store.admit_recovery(org=ORG, app=APP, executor_id="went", ticket="t", now=now, policy=POLICY).go
    store.set_pause(org=ORG, app=APP, until=now + 9 * S, reason="", subject="system", source_ip="", details={})
    held = store.admit_recovery(org=ORG, app=APP, executor_id="held", ticket="t", now=now, policy=POLICY)
    assert held.reason == PAUSED
    assert [t.executor_id for t in store.recovery_state(ORG, APP)[2]] == ["held"]

    for name in ("held", "went"):
        _record(store, name)  # back: the called-off one, and (for contrast) one whose recovery had gone out

    assert store.recovery_state(ORG, APP)[2] == []
    with Session(store.engine) as s:
        assert [t.executor_id for t in s.exec(select(RecoveryTicket)).all()] == ["went"]


@pytest.mark.parametrize(("dead", "trips"), [(14, 0), (15, 1)])
def test_the_store_counts_the_healthy_it_does_not_load(store: Store, dead: int, trips: int) -> None:
    """The admission reads only the executors that are down or hold a ticket, and the rest as a count: the storm
    share is still taken of the whole app (30 executors here, a share of 0.5)."""
    for n in range(30):
        _record(store, f"e{n}")
    for n in range(dead):
        _record(store, f"e{n}", ExecutorStatus.DEAD)
    now = datetime.now(UTC)
    for n in range(dead):
        store.admit_recovery(org=ORG, app=APP, executor_id=f"e{n}", ticket="t", now=now, policy=POLICY)
    assert len(_audits(store, "app.recovery.breaker_tripped")) == trips


def test_an_admission_prunes_old_finished_tickets_and_ignores_those_outside_the_window(store: Store) -> None:
    """Finished tickets older than the window change no decision; they are kept for the peers' tie-break until
    ``TICKETS_KEPT`` and deleted after; a ticket not yet let through is kept whatever its age."""
    for n in range(4):
        _record(store, f"e{n}")
    _record(store, "e0", ExecutorStatus.DEAD)
    _record(store, "stuck", ExecutorStatus.DEAD)
    now = datetime.now(UTC)
    with Session(store.engine) as s:
        for n in range(30):  # recovered half an hour ago: outside the window, inside TICKETS_KEPT
            s.add(RecoveryTicket(org=ORG, app=APP, executor_id=f"old{n}", ticket="t", died_at=now - 30 * 60 * S,
                                 slot_at=now - 30 * 60 * S, granted_at=now - 30 * 60 * S, candidate_id="e1"))
        for n in range(5):  # two hours ago: past TICKETS_KEPT
            s.add(RecoveryTicket(org=ORG, app=APP, executor_id=f"older{n}", ticket="t", died_at=now - 7200 * S,
                                 slot_at=now - 7200 * S, granted_at=now - 7200 * S))
        s.add(RecoveryTicket(org=ORG, app=APP, executor_id="stuck", ticket="t", died_at=now - 30 * 60 * S,
                             slot_at=now - 30 * 60 * S))  # never let through (a pause): kept
        s.commit()
    decision = store.admit_recovery(org=ORG, app=APP, executor_id="e0", ticket="t", now=now, policy=POLICY)
    assert decision.go and not decision.tripped  # 2 of 5 down (e0, stuck): 36 old tickets are no storm
    with Session(store.engine) as s:
        left = {t.executor_id for t in s.exec(select(RecoveryTicket)).all()}
    assert left == {f"old{n}" for n in range(30)} | {"stuck", "e0"}


def _random_app(store: Store, rng: random.Random, now: datetime) -> tuple[gate.InMemory, list[str]]:
    """An app of random registry rows and tickets, written to ``store`` and returned as ``gate.InMemory``, and the
    ids worth asking about (registered or not, with a ticket or not)."""
    registry: dict[str, Registered] = {}
    tickets: dict[str, Ticket] = {}
    ago = [timedelta(seconds=s) for s in (-5, 0, 1, 30, 59, 60, 61, 120, 4000)]
    with Session(store.engine) as s:
        for n in range(rng.randrange(1, 40)):
            executor_id = f"x{n}"
            status = rng.choice(["HEALTHY", "HEALTHY", "DISCONNECTED", "DEAD"])
            at = now - rng.choice(ago)
            if rng.random() < 0.85:
                registry[executor_id] = Registered(status, at)
                s.add(Executor(org=ORG, app=APP, executor_id=executor_id, status=ExecutorStatus(status),
                               created_at=at, updated_at=at))
            if rng.random() < 0.5:
                died = now - rng.choice(ago)
                granted = died if rng.random() < 0.5 else None
                ticket = Ticket(key=f"k{n}", died_at=died, slot_at=died, granted_at=granted,
                                paused=rng.random() < 0.3)
                tickets[executor_id] = ticket
                s.add(RecoveryTicket(org=ORG, app=APP, executor_id=executor_id, ticket=ticket.key, died_at=died,
                                     slot_at=died, granted_at=granted, paused=ticket.paused))
        s.commit()
    return gate.InMemory(registry, tickets), [*sorted(set(registry) | set(tickets)), "unknown"]


def test_the_store_counts_a_storm_as_the_gate_defines_it(store: Store) -> None:
    """The store's counting fleet (SQL counts, so an admission does not read the storm) answers as
    ``gate.InMemory`` does (the definition), on 40 random apps: every executor asked about, with its stored ticket,
    a fresh one, and a paused one."""
    from core.store.gate import _Counted

    rng = random.Random(51)
    now = datetime.now(UTC)
    since = now - POLICY.window
    compared = 0
    for _ in range(40):
        with Session(store.engine) as s:
            s.exec(sa_delete(RecoveryTicket))
            s.exec(sa_delete(Executor))
            s.commit()
        fleet, asked = _random_app(store, rng, now)
        with store.engine.connect() as c:
            counted = _Counted(c, ORG, APP)
            for executor_id in asked:
                for ticket in (fleet.tickets.get(executor_id), Ticket(key="fresh", died_at=now),
                               Ticket(key="paused", died_at=now - 5 * S, paused=True)):
                    if ticket is None:
                        continue
                    assert counted.storm_size(since, executor_id, ticket) == fleet.storm_size(
                        since, executor_id, ticket), (executor_id, ticket)
                    compared += 1
                assert counted.storm_over(since, executor_id) == fleet.storm_over(since, executor_id), executor_id
    assert compared > 500
