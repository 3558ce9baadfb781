"""The Temporal-actions count of the docs (guides/scaling.md) (``tests.bench.actions``), on recorded histories counted
by hand."""

from __future__ import annotations

import json

from tests.bench.actions import ENDED_BY_TEST, HISTORIES, actions_of, count


def _phases(fixture: str, after: str) -> dict[str, int]:
    events = json.loads((HISTORIES / fixture).read_text())["events"]
    return {p.name: p.total for p in count(events, after_connect=after)}


def test_a_death_costs_eleven_actions_after_a_connect_of_two() -> None:
    # connect: signal-with-start, the workflow task with the HEALTHY write's markers (a patch marker and its
    # TemporalChangeVersion upsert are free); no RelayExecutorStatus upsert: the gateway starts the run with
    # HEALTHY, so its first record leaves the attribute as it is. death: the disconnected signal, the
    # grace timer, two probes, dispatch_recovery (since lifecycle generation 5 the gateway asks the confirmation in
    # the same activity, not an exist_pending_workflows of its own, and writes the dispatched row, not a workflow
    # task's local activity), two status upserts, four workflow tasks with local activities.
    assert _phases("happy-recovery.json", "death") == {"connect": 2, "death": 11}
    before = json.loads((HISTORIES / "before-generation-5" / "happy-recovery.json").read_text())["events"]
    assert {p.name: p.total for p in count(before, after_connect="death")} == {"connect": 2, "death": 13}


def test_a_reconnect_within_grace_costs_seven_and_the_tests_removal_is_apart() -> None:
    # the disconnected and connected signals, the grace timer, the DISCONNECTED and HEALTHY writes' workflow tasks
    # and their two status upserts.
    phases = _phases("reconnect-within-grace.json", "reconnect")
    assert phases["connect"] == 2 and phases["reconnect"] == 7
    assert phases[ENDED_BY_TEST] >= 1


def test_a_second_socket_while_healthy_costs_two() -> None:
    # the connected signal and the workflow task with the HEALTHY write's markers; the RelayExecutorStatus
    # attribute already says HEALTHY, so no upsert.
    events = json.loads((HISTORIES / "superseded.json").read_text())["events"]
    signals = [n for n, e in enumerate(events) if e["eventType"] == "EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED"]
    second, removed = signals[1], signals[2]
    between = [what for n, what in actions_of(events) if second <= n < removed]
    assert sorted(between) == ["markers of a workflow task (local activities)", "signal connected"], between


def test_a_death_recovered_via_its_own_gateway_costs_ten() -> None:
    # As above, less the probe right before the request (lifecycle generation 6): the peer's gateway is the dead
    # executor's own, and looks for its socket as it picks the request up.
    assert _phases("recovered-via-its-own-gateway.json", "death") == {"connect": 2, "death": 10}
