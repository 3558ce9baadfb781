"""How the admin CLI shows API objects to a person: aligned tables, and durations as ``1d12h``.

Input is the decoded JSON of the REST API (upstream Conductor field names); durations come back from seconds and
milliseconds through ``core.units`` only.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from core import units

Json = Any  # a decoded JSON value
DURATION_UNITS = {"d": "days", "h": "hours", "m": "minutes", "s": "seconds", "ms": "milliseconds"}


def format_duration(value: timedelta) -> str:
    """The inverse of ``parse_duration`` for whole milliseconds: ``timedelta(hours=36)`` → ``1d12h``."""
    rest, out = abs(value), []
    for unit, name in DURATION_UNITS.items():
        count, rest = divmod(rest, timedelta(**{name: 1}))
        out += [f"{count}{unit}"] if count else []
    return ("-" if value < timedelta() else "") + ("".join(out) or "0s")


def _cell(value: Json) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return ",".join(map(str, value)) or "-"
    return json.dumps(value, separators=(",", ":")) if isinstance(value, dict) else str(value)


def table(headers: Sequence[str], rows: Iterable[Sequence[Json]]) -> str:
    cells = [[_cell(v) for v in row] for row in rows]
    widths = [max([len(h), *(len(r[i]) for r in cells)]) for i, h in enumerate(headers)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip()
                     for line in [list(headers), *cells])


def _time(value: Json, *, ms: bool = False) -> str:
    """An instant in UTC, with its zone: ``2026-11-30 12:00:00Z`` (``ms``: ``12:00:00.123Z``)."""
    try:
        instant = datetime.fromisoformat(str(value)).astimezone(UTC)
    except ValueError:
        return str(value)
    return instant.strftime("%Y-%m-%d %H:%M:%S") + (f".{instant.microsecond // 1000:03d}" if ms else "") + "Z"


def _app_fields(app: dict[str, Json]) -> list[tuple[str, Json]]:
    def ms(value: int | None) -> str | None:
        return None if value is None else format_duration(units.ms_to_timedelta(value))

    return [("NAME", app["name"]), ("STATUS", app["status"]),
            ("EXECUTOR TIMEOUT", format_duration(units.seconds_to_timedelta(app["executorTimeoutSecs"]))),
            ("GC TIME", ms(app["gcTimeThresholdMs"])), ("GC ROWS", app["gcRowsThreshold"]),
            ("GLOBAL TIMEOUT", ms(app["globalTimeoutMs"])), ("PRIVATE", app["privateMode"]),
            ("LANGUAGE", app["language"]), ("ID", app["id"])]


def apps_table(apps: list[dict[str, Json]]) -> str:
    headers = [h for h, _ in _app_fields(apps[0])] if apps else ["NAME", "STATUS"]
    return table(headers, [[v for _, v in _app_fields(a)] for a in apps])


def app_card(app: dict[str, Json]) -> str:
    return "\n".join(f"{h.lower() + ':':<18}{_cell(v)}" for h, v in _app_fields(app))


def executors_table(executors: list[dict[str, Json]]) -> str:
    return table(["EXECUTOR ID", "STATUS", "VERSION", "HOSTNAME", "LANGUAGE", "DBOS", "CREATED", "UPDATED"],
                 [[e["executorId"], e["status"], e["appVersion"], e["hostname"], e["language"], e["dbosVersion"],
                   _time(e["createdAt"]), _time(e["updatedAt"])] for e in executors])


def tokens_table(tokens: list[dict[str, Json]]) -> str:
    return table(["NAME", "CREATED", "APPS", "PERMISSIONS"], [
        [t["tokenName"], _time(t["createdAt"]), t.get("appNames") or t.get("appIds") or "(all)", t.get("permissions")]
        for t in tokens])


_AUDIT_HEADERS = ["TIME", "OPERATION", "STATUS", "SUBJECT", "TARGET", "SOURCE IP", "DETAILS"]
# --follow prints each row as it comes, so its columns are fixed: wide enough for every operation Relay writes
# (``executor.recovery.dispatched``), an app target (``application:`` and 30 characters) and a time with
# milliseconds; a longer cell is cut with "…".
_AUDIT_WIDTHS = [24, 28, 7, 16, 42, 15, 0]
DETAILS_WIDTH = 100  # a summary; -o json prints the details whole


def _audit_cells(entry: dict[str, Json]) -> list[str]:
    return [_time(entry.get("emitTime"), ms=True), _cell(entry.get("operation")), _cell(entry.get("status")),
            _cell(_who(entry.get("subject"))), _cell(_who(entry.get("target"))), _cell(entry.get("sourceIp") or None),
            summarize(entry.get("details"))]


def audit_line(entry: dict[str, Json] | None) -> str:
    """One row of ``relay audit --follow`` (the header for None), in the fixed columns above."""
    cells = _AUDIT_HEADERS if entry is None else _audit_cells(entry)
    return "  ".join(_fit(c, w) for c, w in zip(cells, _AUDIT_WIDTHS, strict=True)).rstrip()


def _fit(cell: str, width: int) -> str:
    if width and len(cell) > width:
        return cell[:width - 1] + "…"
    return cell.ljust(width)


def summarize(details: Json, *, width: int = DETAILS_WIDTH) -> str:
    """Audit details on one line: ``executorId`` first, then ``key=value`` in the API's order; a list of plain
    values joined by commas, a nested object as ``{…}``; cut at ``width`` characters."""
    if not isinstance(details, dict) or not details:
        return _cell(details or None)
    first = {k: details[k] for k in ("executorId",) if k in details}
    parts = []
    for key, value in {**first, **details}.items():
        if isinstance(value, dict):
            shown = "{…}" if value else "{}"
        elif isinstance(value, list):
            flat = value and not any(isinstance(v, dict | list) for v in value)
            shown = ",".join(map(_cell, value)) if flat else "[…]" if value else "[]"
        elif isinstance(value, str) and (not value or any(c.isspace() or c in "=\"" for c in value)):
            shown = json.dumps(value, ensure_ascii=False)  # quoted, so each key=value stays one word
        else:
            shown = _cell(value)
        parts.append(f"{key}={shown}")
    text = " ".join(parts)
    return text if len(text) <= width else text[:width - 1] + "…"


def _who(value: Json) -> Json:
    """An upstream ``AuditSubject`` by its display name, an ``AuditTarget`` as ``type:id``."""
    if not isinstance(value, dict):
        return value
    return value.get("display") or f"{value.get('type')}:{value.get('id')}"


def audit_table(entries: list[dict[str, Json]]) -> str:
    # The API lists newest first (what a script paging back wants); a person reads a log oldest first.
    return table(_AUDIT_HEADERS, [_audit_cells(e) for e in entries[::-1]])
