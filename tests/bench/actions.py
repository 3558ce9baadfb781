"""Temporal Cloud actions of one executor's lifecycle, counted from the recorded histories (``tests/histories``).

    .venv/bin/python -m tests.bench.actions

Actions are what a Temporal Cloud bill is made of. The rules applied (docs.temporal.io, "Temporal Cloud Actions"):
a workflow start counts one, and a signal-with-start one in all, whether or not it started the workflow; every
other signal one; every timer, every scheduled activity (and every retry) one; every search-attribute upsert one,
except ``TemporalChangeVersion`` (patch markers); all markers of one workflow task (local activities, patches) one
together. Not in a history, so not counted here: queries, activity heartbeats (the fence's requests to a peer
heartbeat while they wait), and the gateway watch's heartbeats (per gateway, not per executor).

Each history is split into phases at the signals that begin them: ``connect`` runs from the start to the first
``disconnected``; what follows is named by the scenario. ``count_live`` applies the same rules to every history on a
running Temporal, by time window (``bench_scale``'s phases).
"""

from __future__ import annotations

import asyncio
import json
import time
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


def actions_of(events: list[dict[str, Any]]) -> list[tuple[int, str]]:
    """Each action in one run's events (a history as JSON, ``WorkflowHistory.to_json_dict()["events"]``): the index
    of the event that carries it and what it is, once per action (an activity retried twice: two entries)."""
    out: list[tuple[int, str]] = []
    marked_tasks: set[str] = set()  # workflow tasks whose markers were counted
    # The signal of the signal-with-start that started the run is in its one action: the run's first signal, before
    # its first workflow task started (the test server writes ``STARTED, WORKFLOW_TASK_SCHEDULED, SIGNALED``, the dev
    # server ``STARTED, SIGNALED, WORKFLOW_TASK_SCHEDULED``). A signal-with-start to a running workflow is a signal.
    with_start = bool(events) and events[0]["eventType"].endswith("WORKFLOW_EXECUTION_STARTED") and not _attributes(
        events[0]).get("continuedExecutionRunId")
    for index, event in enumerate(events):
        kind, attrs = event["eventType"].removeprefix("EVENT_TYPE_"), _attributes(event)
        if kind == "WORKFLOW_EXECUTION_STARTED":
            # A run continued-as-new was paid for by its predecessor's CONTINUED_AS_NEW, counted there.
            if not attrs.get("continuedExecutionRunId"):
                out.append((index, "workflow start (signal-with-start)"))
        elif kind == "WORKFLOW_TASK_STARTED":
            with_start = False
        elif kind == "WORKFLOW_EXECUTION_SIGNALED":
            if not with_start:
                out.append((index, f"signal {attrs.get('signalName')}"))
            with_start = False
        elif kind == "TIMER_STARTED":
            out.append((index, "timer"))
        elif kind == "ACTIVITY_TASK_SCHEDULED":
            out.append((index, f"activity {attrs['activityType']['name']}"))
        elif kind == "ACTIVITY_TASK_STARTED":
            out += [(index, "activity retry")] * (int(attrs.get("attempt", 1)) - 1)
        elif kind == "UPSERT_WORKFLOW_SEARCH_ATTRIBUTES":
            names = set(attrs.get("searchAttributes", {}).get("indexedFields", {}))
            if names - EXEMPT_ATTRIBUTES:
                out.append((index, "search-attribute upsert"))
        elif kind == "MARKER_RECORDED":
            task = str(attrs.get("workflowTaskCompletedEventId"))
            if task not in marked_tasks:
                marked_tasks.add(task)
                out.append((index, "markers of a workflow task (local activities)"))
        elif kind == "WORKFLOW_EXECUTION_CONTINUED_AS_NEW":
            out.append((index, "continue-as-new"))
    return out


def count(events: list[dict[str, Any]], *, after_connect: str) -> list[Phase]:
    """The actions of one run's events, by phase: ``connect``, then ``after_connect`` from the first
    ``disconnected`` signal on, then ``ENDED_BY_TEST`` from a ``removed`` signal on."""
    by_event: dict[int, list[str]] = {}
    for index, what in actions_of(events):
        by_event.setdefault(index, []).append(what)
    phases = [Phase("connect")]
    for index, event in enumerate(events):
        kind, attrs = event["eventType"].removeprefix("EVENT_TYPE_"), _attributes(event)
        if kind == "WORKFLOW_EXECUTION_SIGNALED" and attrs.get("signalName") == "disconnected" and len(phases) == 1:
            phases.append(Phase(after_connect))
        if kind == "WORKFLOW_EXECUTION_SIGNALED" and attrs.get("signalName") == "removed":
            phases.append(Phase(ENDED_BY_TEST))
        phases[-1].actions.update(by_event.get(index, []))
    return phases


def count_live(address: str, windows: dict[str, tuple[float, float]]) -> dict[str, Any]:
    """The actions of every run on the Temporal at ``address`` (its default namespace), counted by the rules above
    and bucketed by event time into each window ``[start, end]`` (epoch seconds): ``{window: {what: n}}``, with
    ``runs`` counted, ``seconds_to_count``, and the workflow tasks that timed out in each window
    (``workflow_tasks_timed_out``: ``{window: n}``)."""
    from temporalio.api.enums.v1 import EventType
    from temporalio.client import Client

    async def collect() -> tuple[int, list[tuple[float, str]], list[float]]:
        client = await Client.connect(address)
        runs = [(w.id, w.run_id) async for w in client.list_workflows()]
        gate = asyncio.Semaphore(16)

        async def one(workflow_id: str, run_id: str | None) -> tuple[list[tuple[float, str]], list[float]]:
            async with gate:
                history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
            events = history.to_json_dict()["events"]
            timed_out = [e.event_time.ToMicroseconds() / 1e6 for e in history.events
                         if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT]
            return [(history.events[i].event_time.ToMicroseconds() / 1e6, what)
                    for i, what in actions_of(events)], timed_out

        found = await asyncio.gather(*(one(w, r) for w, r in runs))
        return len(runs), [a for run, _ in found for a in run], [t for _, run in found for t in run]

    began = time.monotonic()
    runs, every, timed_out = asyncio.run(collect())
    out: dict[str, Any] = {"runs": runs, "seconds_to_count": round(time.monotonic() - began, 1),
                           "workflow_tasks_timed_out": {}}
    for name, (start, end) in windows.items():
        out[name] = dict(Counter(what for at, what in every if start <= at <= end).most_common())
        # Not actions: a task left on a worker's sticky queue past its schedule-to-start timeout, handed to any.
        out["workflow_tasks_timed_out"][name] = sum(start <= at <= end for at in timed_out)
    return out


# The lifecycle scenarios an executor goes through: (fixture, the name of what follows its connect).
SCENARIOS = [("reconnect-within-grace.json", "disconnect, then reconnect within grace"),
             ("happy-recovery.json", "death, recovery, deletion"),
             ("recovered-via-its-own-gateway.json", "death, recovery via a peer on its gateway, deletion")]


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
