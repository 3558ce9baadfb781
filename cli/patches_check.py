"""What ``relay patches check`` does (``cli.patches`` parses it, and says why it reads what it reads): every open
lifecycle run listed, its generation read off its history, and a report of those the target code cannot replay. A
module of its own so that Temporal's modules load when the command runs, not with every `relay` command's parser.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from collections.abc import AsyncIterable, Iterable
from dataclasses import asdict, dataclass
from datetime import datetime

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client
from temporalio.service import RPCError

from cli.tables import table, utc_time
from core.settings import Settings
from core.temporal import TemporalStartError, exit_now, reach, temporal_connection
from workflows.contracts.common import LIFECYCLE_WORKFLOW_TYPE, RELAY_EXECUTOR_STATUS
from workflows.lifecycle_generations import GENERATIONS, NEWEST_GENERATION, OLDEST_REPLAYED_GENERATION

# Histories read at once; each read is one page of ``HISTORY_PAGE`` events, enough to reach the first workflow
# task's commands unless signals piled up before it (then the next page is read).
READ_CONCURRENCY = 16
HISTORY_PAGE = 32
# A patch marker's details hold its id under this key (Core's patch marker).
_PATCH_DATA = "patch-data"


@dataclass
class OpenRun:
    """An open lifecycle run, as visibility lists it, with the generation its history says."""

    workflow_id: str
    run_id: str
    started: datetime
    executor_status: str | None  # RelayExecutorStatus, as the run last recorded it
    # None: no workflow task has completed, so no code has run and nothing recorded can disagree with the code
    # that runs it first (the one the workers run: a new run of the newest generation it knows).
    generation: int | None


class _Reading:
    """A lifecycle run's generation, told its history's events in order until it knows (``see``)."""

    def __init__(self) -> None:
        self.completed = False  # a workflow task completed: the run's code ran
        self.found: int | None = None

    def see(self, event: HistoryEvent) -> bool:
        """Take the next event; True once the generation is known (the run's first patch marker)."""
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            self.completed = True
        elif event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:
            data = event.marker_recorded_event_attributes.details.get(_PATCH_DATA)
            if data is not None and data.payloads:
                self.found = GENERATIONS.get(str(json.loads(data.payloads[0].data).get("id")), 0)
        return self.found is not None

    def generation(self) -> int | None:
        """What the events seen say: the first patch marker's generation (0 for a marker of a patch before
        generation 1), 0 when a workflow task completed without any, None when none has completed."""
        return self.found if self.found is not None else 0 if self.completed else None


def generation_of(events: Iterable[HistoryEvent]) -> int | None:
    """A lifecycle run's generation from its history's events (``_Reading.generation``)."""
    reading = _Reading()
    for event in events:
        if reading.see(event):
            break
    return reading.generation()


async def _generation_from(events: AsyncIterable[HistoryEvent]) -> int | None:
    """``generation_of`` over a history read page by page: no page is read once the generation is known."""
    reading = _Reading()
    async for event in events:
        if reading.see(event):
            break
    return reading.generation()


async def open_runs(client: Client) -> list[OpenRun]:
    """Every open lifecycle run with its generation, oldest first. The latest run of each workflow id is read, so
    a run that continued as new since it was listed is read as the run it continued into."""
    query = f"WorkflowType = '{LIFECYCLE_WORKFLOW_TYPE}' AND ExecutionStatus = 'Running'"
    listed = [execution async for execution in client.list_workflows(query, page_size=1000)]
    reads = asyncio.Semaphore(READ_CONCURRENCY)

    async def read(workflow_id: str) -> int | None:
        async with reads:
            events = client.get_workflow_handle(workflow_id).fetch_history_events(page_size=HISTORY_PAGE)
            return await _generation_from(events)

    generations = await asyncio.gather(*(read(e.id) for e in listed))
    runs = [OpenRun(e.id, e.run_id, e.start_time, e.typed_search_attributes.get(RELAY_EXECUTOR_STATUS), generation)
            for e, generation in zip(listed, generations, strict=True)]
    return sorted(runs, key=lambda run: (run.started, run.workflow_id))


def stranded(runs: list[OpenRun], replays_from: int) -> list[OpenRun]:
    """The runs code that replays ``replays_from`` and newer cannot replay."""
    return [run for run in runs if run.generation is not None and run.generation < replays_from]


def report(runs: list[OpenRun], replays_from: int) -> str:
    """The generations of the open runs, and each run the target code cannot replay, as tables."""
    counts = Counter(run.generation for run in runs)
    markers = {number: marker for marker, number in GENERATIONS.items()}

    def replays(generation: int, oldest: int) -> str:
        return "replays" if generation >= oldest else "CANNOT REPLAY"

    seen = {run.generation for run in runs if run.generation is not None} | {NEWEST_GENERATION}
    rows: list[list[object]] = [
        [generation, markers.get(generation, "(none: before generation 1)"), counts[generation],
         replays(generation, OLDEST_REPLAYED_GENERATION), replays(generation, replays_from)]
        for generation in sorted(seen, reverse=True)]
    if counts[None]:
        rows.append(["-", "(no workflow task yet)", counts[None], "replays", "replays"])
    lines = [table(["GENERATION", "MARKER", "OPEN RUNS", "THIS RELEASE", f"REPLAYING FROM {replays_from}"], rows)]
    blocking = stranded(runs, replays_from)
    if blocking:
        lines += ["", table(["WORKFLOW ID", "RUN ID", "STARTED", "EXECUTOR", "GENERATION"],
                            [[r.workflow_id, r.run_id, utc_time(r.started.isoformat()), r.executor_status,
                              r.generation] for r in blocking]),
                  "", f"not safe yet: {len(blocking)} open lifecycle run(s) older than generation {replays_from}. "
                      "Wait for them to end or continue as new; a HEALTHY executor's run may be terminated, and "
                      "the reconciliation starts it again on the current code (docs: Concepts, Reconciliation)."]
    else:
        lines += ["", f"safe: every open lifecycle run ({len(runs)}) is of generation {replays_from} or newer, or "
                      "has run no code yet"]
    return "\n".join(lines)


def check(replays_from: int, output: str, settings: Settings) -> None:
    """`relay patches check`: the report, then exit 1 while a run blocks (or Temporal could not be read)."""
    async def run() -> list[OpenRun]:
        client = await reach(temporal_connection(settings), timeout=settings.temporal_connect_timeout)
        return await open_runs(client)

    try:
        runs = asyncio.run(run())
    except (TemporalStartError, RPCError) as err:  # not checked is never "safe"
        why = f"Temporal answered {err.status.name}: {err.message}" if isinstance(err, RPCError) else str(err)
        print(f"relay patches check: {why}", file=sys.stderr)
        exit_now(1)
    blocking = stranded(runs, replays_from)
    if output == "json":
        print(json.dumps({"replaysFrom": replays_from, "safe": not blocking,
                          "runs": [{**asdict(r), "started": r.started.isoformat()} for r in runs]}, indent=2))
    else:
        print(report(runs, replays_from))
    exit_now(1 if blocking else 0)
