"""What ``relay recovery status`` prints for an app's recovery gate (``cli.safety.status_card``), from the REST API's
``RecoveryStatus``, and ``relay drain list``'s table."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from cli.safety import drains_table, status_card

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
QUIET: dict[str, Any] = {"pause": None, "breaker": {"tripped": False, "trippedAt": None, "trips": 0,
                                                    "lastSlotAt": None}, "waiting": []}


def test_a_recovery_blocked_for_lack_of_a_peer_is_shown_with_the_drain_that_blocks_it() -> None:
    """It once said "waiting: 0" and nothing else while a DEAD executor waited for a peer."""
    blocked = {"executorId": "dead-1", "appVersion": "v1", "diedAt": "2026-11-30T11:50:00Z",
               "blockedAt": "2026-11-30T11:50:01Z", "reason": "no HEALTHY executor of version 'v1'",
               "drainedPeers": ["peer-1"]}
    card = status_card({**QUIET, "blocked": [blocked]}, NOW, app="orders").splitlines()
    assert card[2:4] == ["waiting:  0", "blocked:  1 (DEAD, waiting for a HEALTHY, undrained executor of their "
                                        "version)"]
    assert card[4].split() == ["EXECUTOR", "ID", "VERSION", "DIED", "BLOCKED", "DRAINED", "PEERS"]
    assert card[5].split()[:2] == ["dead-1", "v1"] and card[5].endswith("peer-1")
    assert card[-1] == "a drained peer could recover them: relay drain clear peer-1 --app orders"


def test_nothing_blocked_says_so() -> None:
    assert status_card({**QUIET, "blocked": []}, NOW).splitlines()[-1] == "blocked:  0"


def test_drains_and_pauses_are_by_the_key_name_as_in_the_audit() -> None:
    """The BY column once said ``api_key:<key id>`` where ``relay audit`` names the key."""
    drain = {"executorId": "ex-1", "active": True, "until": "2026-11-30T12:30:00Z", "reason": "",
             "subject": "api_key:0b5e6c1e", "subjectName": "ops-ana", "createdAt": "2026-11-30T12:00:00Z"}
    header, row = drains_table([drain], NOW).splitlines()
    assert header.split()[-1] == "BY" and row.split()[-1] == "ops-ana"
    pause = {key: drain[key] for key in ("active", "until", "subject", "subjectName", "createdAt")}
    card = status_card({**QUIET, "pause": {**pause, "reason": "db maintenance"}, "blocked": []}, NOW)
    assert card.splitlines()[0].endswith(", by ops-ana: db maintenance")
