"""Relay's own alerts as they happen (``core.own_alerts``): the alert an audit row makes and its id, the rate per
(org, app, kind) as a pure decision and on SQLite (claims from many threads at once: one goes out), the bounds on
stored rule metadata, and the round's read skipping a rule it cannot carry (logged once)."""

from __future__ import annotations

import logging
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from activities.alerts import AlertActivities, own_event, uncarried
from core import alerts, own_alerts
from core.models import make_engine
from core.own_alerts import Claim, OwnAlertRates, Rate, claim
from core.store import Store
from workflows.contracts.alerts import LoadAlertRoundInput, OwnAlertEvent, RuleState, RuleType

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def _event(operation: str, key: str = "k1", **details: Any) -> OwnAlertEvent:
    return OwnAlertEvent("acme", "shop", operation, key, NOW, "e9", details)


def test_an_audit_row_makes_one_alert_of_its_kind() -> None:
    blocked = own_alerts.alert_of(_event("executor.recovery.blocked", reason="no HEALTHY executor of version 'v1'"))
    assert blocked.alert_id == own_alerts.alert_of(_event("executor.recovery.blocked")).alert_id  # same row
    assert blocked.alert_id != own_alerts.alert_of(_event("executor.recovery.blocked", "k2")).alert_id
    assert (blocked.kind, blocked.org, blocked.app, blocked.receiving_app, blocked.rule_id, blocked.time) == (
        "RecoveryBlocked", "acme", "shop", "shop", None, NOW)
    assert blocked.message == ("RecoveryBlocked in app 'shop': executor.recovery.blocked (executors: e9): "
                               "no HEALTHY executor of version 'v1'")
    kinds = {op: own_alerts.alert_of(_event(op)).kind for op in alerts.OWN_OPERATIONS}
    assert kinds == {"executor.recovery.blocked": "RecoveryBlocked", "executor.recovery.unblocked": "RecoveryUnblocked",
                     "app.recovery.breaker_tripped": "RecoveryBreaker", "orphans.found": "OrphansFound"}
    breaker = own_alerts.alert_of(_event("app.recovery.breaker_tripped", down=5, population=6, trip=1))
    assert "5 of 6 executors went down at once" in breaker.message


def test_the_rate_sends_one_per_interval_and_the_first_held_back_late() -> None:
    rate, first = claim(Rate(), alert_id="a", now=NOW, min_interval=MINUTE)
    assert first == Claim(send=True)
    rate, second = claim(rate, alert_id="b", now=NOW + timedelta(seconds=5), min_interval=MINUTE)
    assert second == Claim(send=False, flush_at=NOW + MINUTE, held_behind=NOW)  # the first held back: it waits
    rate, third = claim(rate, alert_id="c", now=NOW + timedelta(seconds=6), min_interval=MINUTE)
    assert third == Claim(send=False, held_behind=NOW)  # counted, no wait of its own
    retried = claim(rate, alert_id="a", now=NOW + timedelta(seconds=7), min_interval=MINUTE)
    assert retried == (rate, Claim(send=True))  # a retried claim of the one sent keeps it
    rate, flushed = claim(rate, alert_id="b", now=NOW + MINUTE, min_interval=MINUTE, held_behind=NOW)
    assert flushed == Claim(send=True, held_back=1) and rate == Rate(NOW + MINUTE, "b", 0)
    rate, held = claim(rate, alert_id="d", now=NOW + MINUTE, min_interval=MINUTE)
    assert not held.send and held.flush_at == NOW + 2 * MINUTE
    # A new alert after the interval goes first and counts the one waiting, which then has nothing left to say.
    rate, fresh = claim(rate, alert_id="e", now=NOW + 2 * MINUTE, min_interval=MINUTE)
    assert fresh == Claim(send=True, held_back=1)
    assert claim(rate, alert_id="d", now=NOW + 2 * MINUTE, min_interval=MINUTE, held_behind=NOW + MINUTE)[1] == \
        Claim(send=False)
    for no_minimum in (None, timedelta(0)):
        assert claim(rate, alert_id="f", now=NOW + 2 * MINUTE, min_interval=no_minimum)[1].send


def test_the_message_says_what_was_held_back() -> None:
    alert = own_alerts.alert_of(_event("orphans.found", reason="2 executor id(s)"))
    assert own_alerts.message(alert, Claim(send=True), flushed=False) == alert.message
    assert "3 earlier OrphansFound alert(s) of this app held back" in own_alerts.message(
        alert, Claim(send=True, held_back=3), flushed=False)
    late = own_alerts.message(alert, Claim(send=True, held_back=2), flushed=True)
    assert "sent late" in late and "2 more OrphansFound alert(s)" in late


def test_claims_at_once_on_the_database_send_one(tmp_path: Path) -> None:
    """Eight deliveries of one kind claim at the same moment, each in its own thread: exactly one goes out, one
    waits to go out late, and the rate row says six more were held back."""
    engine = make_engine(f"sqlite:///{tmp_path / 'relay.db'}")
    rates = OwnAlertRates(engine)
    outcomes: list[Claim] = []
    start = threading.Barrier(8)

    def deliver(n: int) -> None:
        start.wait()
        outcomes.append(rates.claim(org="acme", app="shop", kind="RecoveryBlocked", alert_id=f"a{n}", now=NOW,
                                    min_interval=MINUTE))

    threads = [threading.Thread(target=deliver, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sum(o.send for o in outcomes) == 1
    assert [o.flush_at for o in outcomes if o.flush_at is not None] == [NOW + MINUTE]
    flushed = rates.claim(org="acme", app="shop", kind="RecoveryBlocked", alert_id="late", now=NOW + MINUTE,
                          min_interval=MINUTE, held_behind=NOW)
    assert flushed == Claim(send=True, held_back=6)
    # Another kind, or another app, has a rate of its own.
    assert rates.claim(org="acme", app="shop", kind="OrphansFound", alert_id="o", now=NOW, min_interval=MINUTE).send
    assert rates.claim(org="acme", app="cart", kind="RecoveryBlocked", alert_id="c", now=NOW,
                       min_interval=MINUTE).send
    engine.dispose()


# -- rules that cannot be carried ---------------------------------------------------------------------------------


def _nested(depth: int) -> Any:
    value: Any = {"thresholdSecs": 5}
    for _ in range(depth - 1):
        value = {"x": value}
    return value


def test_metadata_is_bounded_in_depth_and_size() -> None:
    alerts.check_metadata_bounds(_nested(alerts.MAX_METADATA_DEPTH))
    alerts.check_metadata_bounds([[[]]])
    alerts.check_metadata_bounds(None)
    with pytest.raises(ValueError, match="nested deeper than 32 levels"):
        alerts.check_metadata_bounds(_nested(alerts.MAX_METADATA_DEPTH + 1))
    with pytest.raises(ValueError, match="nested deeper"):
        alerts.check_metadata_bounds(_nested(100_000))  # measured without recursion
    with pytest.raises(ValueError, match=r"bytes as JSON, more than 8192"):
        alerts.check_metadata_bounds({"note": "x" * alerts.MAX_METADATA_BYTES})
    assert alerts.stored_rule_problem("UnresponsiveApplication", _nested(300)) is not None
    assert alerts.stored_rule_problem("Nope", {}) is not None  # a row edited by hand
    assert alerts.stored_rule_problem("WorkflowFailure", {"minFailures": 2}) is None


def test_a_rule_temporals_converter_cannot_carry_is_found_alone() -> None:
    """What failed every round (``PydanticSerializationError: Maximum serialization depth exceeded``, for the whole
    batch) is asked of each rule by itself, whatever the bounds say."""
    def rule(metadata: Any) -> RuleState:
        return RuleState("r1", "acme", "shop", "shop", RuleType.UNRESPONSIVE_APPLICATION, metadata, NOW)

    assert uncarried(rule({"thresholdSecs": 5})) is None
    problem = uncarried(rule(_nested(300)))
    assert problem is not None and "not serializable" in problem and "depth" in problem


async def test_the_rounds_read_skips_a_rule_it_cannot_carry_and_says_so_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = Store(make_engine(f"sqlite:///{tmp_path / 'relay.db'}"))
    for app, metadata in [("greedy", _nested(300)), ("shop", {"thresholdSecs": 5})]:
        store.ensure_app("acme", app)
        store.create_alert_rule(org="acme", app=app, receiving_app=app, rule_type="UnresponsiveApplication",
                                metadata=metadata, min_interval=None, subject="system", source_ip="")
    store.write_audit(org="acme", app="shop", operation="executor.recovery.blocked", executor_id="e1",
                      details={"reason": "no peer"}, event_key="relay-executor/acme/shop/e1/blocked/1")
    activities = AlertActivities(store)
    caplog.set_level(logging.WARNING, logger="relay.worker")
    for _ in range(2):
        batch = await activities.load_alert_round(LoadAlertRoundInput(now=datetime.now(UTC) + timedelta(seconds=5)))
        assert [r.app for r in batch.rules] == ["shop"]
    [line] = [r.getMessage() for r in caplog.records if "skipped by every alerts round" in r.getMessage()]
    assert "acme/greedy" in line and "nested deeper than 32 levels" in line
    [event] = batch.own_events
    assert (event.event_key, event.operation, event.executor_id) == ("relay-executor/acme/shop/e1/blocked/1",
                                                                   "executor.recovery.blocked", "e1")
    [row] = store.own_alert_events(["executor.recovery.blocked"], until=datetime.now(UTC) + timedelta(seconds=5),
                                   lookback=timedelta(hours=1))[0]
    assert own_event(row).event_key == event.event_key
    store.engine.dispose()
