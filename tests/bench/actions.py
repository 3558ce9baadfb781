"""Temporal Cloud actions of one executor's lifecycle, counted from the recorded histories (``tests/histories``).

    .venv/bin/python -m tests.bench.actions

Actions are what a Temporal Cloud bill is made of. The rules applied (docs.temporal.io, "Temporal Cloud Actions"):
a workflow start counts one, and a signal-with-start one in all, whether or not it started the workflow; every
other signal one; every timer, every scheduled activity (and every retry) one; every search-attribute upsert one,
except ``TemporalChangeVersion`` (patch markers); all markers of one workflow task (local activities, patches) one
together. Not in a history, so not counted here: queries, activity heartbeats (the fence's requests to a peer
heartbeat while they wait), and the gateway watch's heartbeats (per gateway, not per executor).

Each history is split into phases at the signals that begin them: ``connect`` runs from the start to the first
``disconnected``; what follows is named by the scenario.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HISTORIES = Path(__file__).resolve().parents[1] / "histories"
EXEMPT_ATTRIBUTES = {"TemporalChangeVersion"}
# A scenario that ends with the app deleted (``removed``) does so to end the recording: not part of a lifecycle.
ENDED_BY_TEST = "the scenario's end (app deleted)"


@dataclass
class Phase:
    name: str
    actions: Counter[str] = field(default_factory=Counter)

    @property
    def total(self) -> int:
        return sum(self.actions.values())


def _attributes(event: dict[str, Any]) -> dict[str, Any]:
    return next((v for k, v in event.items() if k.endswith("Attributes") and isinstance(v, dict)), {})


def count(events: list[dict[str, Any]], *, after_connect: str) -> list[Phase]:
    """The actions of one run's events, by phase: ``connect``, then ``after_connect`` from the first
    ``disconnected`` signal on, then ``ENDED_BY_TEST`` from a ``removed`` signal on."""
    phases = [Phase("connect")]
    marked_tasks: set[str] = set()  # workflow tasks whose markers were counted
    for index, event in enumerate(events):
        kind, attrs = event["eventType"].removeprefix("EVENT_TYPE_"), _attributes(event)
        if kind == "WORKFLOW_EXECUTION_SIGNALED" and attrs.get("signalName") == "disconnected" and len(phases) == 1:
            phases.append(Phase(after_connect))
        if kind == "WORKFLOW_EXECUTION_SIGNALED" and attrs.get("signalName") == "removed":
            phases.append(Phase(ENDED_BY_TEST))
        actions = phases[-1].actions
        if kind == "WORKFLOW_EXECUTION_STARTED":
            actions["workflow start (signal-with-start)"] += 1
        elif kind == "WORKFLOW_EXECUTION_SIGNALED":
            # The signal of the signal-with-start that started the run (``STARTED, WORKFLOW_TASK_SCHEDULED,
            # SIGNALED``) is in its one action; a signal-with-start to a running workflow counts as a signal.
            with_start = index == 2 and events[0]["eventType"].endswith("WORKFLOW_EXECUTION_STARTED")
            if not with_start:  # the signal of a signal-with-start that started the run is in its one action
                actions[f"signal {attrs.get('signalName')}"] += 1
        elif kind == "TIMER_STARTED":
            actions["timer"] += 1
        elif kind == "ACTIVITY_TASK_SCHEDULED":
            actions[f"activity {attrs['activityType']['name']}"] += 1
        elif kind == "ACTIVITY_TASK_STARTED":
            retries = int(attrs.get("attempt", 1)) - 1
            if retries > 0:
                actions["activity retry"] += retries
        elif kind == "UPSERT_WORKFLOW_SEARCH_ATTRIBUTES":
            names = set(attrs.get("searchAttributes", {}).get("indexedFields", {}))
            if names - EXEMPT_ATTRIBUTES:
                actions["search-attribute upsert"] += 1
        elif kind == "MARKER_RECORDED":
            task = str(attrs.get("workflowTaskCompletedEventId"))
            if task not in marked_tasks:
                marked_tasks.add(task)
                actions["markers of a workflow task (local activities)"] += 1
        elif kind == "WORKFLOW_EXECUTION_CONTINUED_AS_NEW":
            actions["continue-as-new"] += 1
    return phases


# The lifecycle scenarios an executor goes through: (fixture, the name of what follows its connect).
SCENARIOS = [("reconnect-within-grace.json", "disconnect, then reconnect within grace"),
             ("happy-recovery.json", "death, recovery, deletion")]


def main() -> None:
    for fixture, after in SCENARIOS:
        events = json.loads((HISTORIES / fixture).read_text())["events"]
        phases = count(events, after_connect=after)
        print(f"{fixture}: {sum(p.total for p in phases if p.name != ENDED_BY_TEST)} actions")
        for phase in phases:
            if phase.name == ENDED_BY_TEST:
                continue
            print(f"  {phase.name}: {phase.total}")
            for what, n in sorted(phase.actions.items()):
                print(f"    {n:3d}  {what}")


if __name__ == "__main__":
    main()
