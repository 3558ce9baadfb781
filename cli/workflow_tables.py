"""How ``relay workflows|queues|schedules|versions`` show API objects to a person: aligned tables, a card per
object, and instants as ``2026-11-30 21:40:05.123Z (3m ago)`` (to the millisecond, as in every table).

Input is the decoded JSON of the REST API (upstream Conductor's ``Workflow``, ``Step``, ``Queue``, ``Schedule`` and
``ApplicationVersion``); durations come back from seconds and milliseconds through ``core.units`` only. Every
renderer takes ``now``, so what a table says about age is decided by its caller (and by a test).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from cli import tables
from cli.tables import Json, format_duration, table
from core import units

CELL_WIDTH = 60  # inputs, outputs and errors in a table; the card and -o json show them whole
_COARSE = (("d", "days"), ("h", "hours"), ("m", "minutes"), ("s", "seconds"))


def instant(value: Json) -> datetime | None:
    """An API date-time as an aware datetime (one without a zone is taken as UTC); None if it is not one."""
    return units.iso_to_utc(value)


def age(value: Json, now: datetime) -> str:
    """How far ``value`` is from ``now`` in its largest whole unit: ``3m ago``, ``in 2h``, ``now``."""
    when = instant(value)
    if when is None:
        return "-" if value is None else str(value)
    delta = now - when
    span = next((f"{n}{unit}" for unit, name in _COARSE if (n := abs(delta) // timedelta(**{name: 1}))), None)
    return "now" if span is None else f"{span} ago" if delta > timedelta() else f"in {span}"


def human_time(value: Json, now: datetime) -> str:
    """``2026-11-30 21:40:05.123Z (3m ago)``: the instant in UTC with its zone (``tables.utc_time``), then its age."""
    if instant(value) is None:
        return "-" if value is None else str(value)
    return f"{tables.utc_time(value)} ({age(value, now)})"


def clip(value: Json, width: int = CELL_WIDTH) -> Json:
    """A long string on one line, cut at ``width`` characters."""
    if not isinstance(value, str):
        return value
    flat = " ".join(value.split())
    return flat if len(flat) <= width else flat[:width - 1] + "…"


def _duration(value: Json, to_timedelta: Callable[[Any], timedelta]) -> Json:
    return format_duration(to_timedelta(value)) if isinstance(value, int | float) else value


def _label(key: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", " ", key).lower()  # createdAt → created at


def card(obj: dict[str, Json], now: datetime, *, first: Sequence[str] = ()) -> str:
    """Every field of one object, one a line, ``first`` first: date-times with their age, ``…Ms`` and ``…Secs``
    as durations (labelled without the unit: ``timeoutMs`` 90000 is ``timeout: 1m30s``), the rest as the API
    sent them."""
    lines = []
    for key in [*(k for k in first if k in obj), *(k for k in obj if k not in first and k != "$schema")]:
        value, label = obj[key], key
        if key.endswith("Ms"):
            value, label = _duration(value, units.ms_to_timedelta), key.removesuffix("Ms")
        elif key.endswith("Secs"):
            value, label = _duration(value, units.seconds_to_timedelta), key.removesuffix("Secs")
        elif isinstance(value, str) and key.endswith(("At", "Until", "deadline", "Timestamp")):
            value = human_time(value, now)
        lines.append((_label(label) + ":", value))
    width = max((len(label) for label, _ in lines), default=0) + 2
    return "\n".join(f"{label:<{width}}{_text(value)}".rstrip() for label, value in lines)


def _text(value: Json) -> str:
    return tables._cell(value)  # as a table writes a cell: null as "-", lists joined, objects as compact JSON


# -- one renderer per answer ----------------------------------------------------------------------------------------


def workflows_table(workflows: list[dict[str, Json]], now: datetime) -> str:
    return table(["WORKFLOW ID", "STATUS", "NAME", "QUEUE", "VERSION", "EXECUTOR", "CREATED", "UPDATED"], [
        [w.get("workflowId"), w.get("status"), w.get("workflowName"), w.get("queueName"), w.get("appVersion"),
         w.get("executorId"), human_time(w.get("createdAt"), now), age(w.get("updatedAt"), now)] for w in workflows])


def workflow_card(workflow: dict[str, Json], now: datetime) -> str:
    return card(workflow, now, first=("workflowId", "status", "workflowName", "workflowClass", "queueName",
                                      "appVersion", "executorId", "createdAt", "updatedAt"))


def steps_table(steps: list[dict[str, Json]], now: datetime) -> str:
    def took(step: dict[str, Json]) -> str:
        start, end = instant(step.get("startedAt")), instant(step.get("completedAt"))
        return format_duration(end - start) if start and end else "-"

    def result(step: dict[str, Json]) -> Json:
        return clip(f"error: {step['error']}") if step.get("error") is not None else clip(step.get("output"))

    return table(["STEP", "NAME", "STARTED", "DURATION", "CHILD WORKFLOW", "OUTPUT"], [
        [s.get("stepId"), s.get("stepName"), human_time(s.get("startedAt"), now), took(s), s.get("childWorkflowId"),
         result(s)] for s in steps])


def _rate(queue: dict[str, Json]) -> Json:
    limit, period = queue.get("rateLimitMax"), queue.get("rateLimitPeriodSecs")
    return None if limit is None else f"{limit}/{_duration(period, units.seconds_to_timedelta)}"


def queues_table(queues: list[dict[str, Json]], now: datetime) -> str:
    return table(["NAME", "CONCURRENCY", "WORKER CONCURRENCY", "RATE LIMIT", "PRIORITY", "PARTITIONED", "POLLING"], [
        [q.get("name"), q.get("concurrency"), q.get("workerConcurrency"), _rate(q), q.get("priorityEnabled"),
         q.get("partitionQueue"), _duration(q.get("pollingIntervalSecs"), units.seconds_to_timedelta)]
        for q in queues])


def queue_card(queue: dict[str, Json], now: datetime) -> str:
    return card(queue, now, first=("name", "concurrency", "workerConcurrency"))


def schedules_table(schedules: list[dict[str, Json]], now: datetime) -> str:
    return table(["NAME", "STATUS", "WORKFLOW", "CRON", "TIME ZONE", "LAST FIRED", "BACKFILL"], [
        [s.get("scheduleName"), s.get("status"), s.get("workflowName"), s.get("cronExpression"),
         s.get("cronTimezone"), human_time(s.get("lastFiredAt"), now), s.get("automaticBackfill")] for s in schedules])


def schedule_card(schedule: dict[str, Json], now: datetime) -> str:
    return card(schedule, now, first=("scheduleName", "status", "workflowName", "cronExpression"))


def versions_table(versions: list[dict[str, Json]], now: datetime) -> str:
    return table(["VERSION", "VERSION ID", "TIMESTAMP", "CREATED"], [
        [v.get("versionName"), v.get("versionId"), human_time(v.get("versionTimestamp"), now),
         human_time(v.get("createdAt"), now)] for v in versions])
