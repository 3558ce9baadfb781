"""How the admin CLI shows API objects to a person: aligned tables, instants in UTC to the millisecond (one
precision in every table), and durations as ``1d12h``. The audit table fits the terminal's width.

Input is the decoded JSON of the REST API (upstream Conductor field names); durations come back from seconds and
milliseconds through ``core.units`` only.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import timedelta
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


def utc_time(value: Json) -> str:
    """An API date-time in UTC to the millisecond, with its zone: ``2026-11-30 12:00:00.123Z`` (one without a zone
    is taken as UTC); ``-`` for null, anything else as it came."""
    instant = units.iso_to_utc(value)
    if instant is None:
        return _cell(value)
    return instant.strftime("%Y-%m-%d %H:%M:%S") + f".{instant.microsecond // 1000:03d}Z"


def terminal_width() -> int | None:
    """The columns of the terminal the output goes to (``COLUMNS`` wins, as for other tools); None when it goes to
    a pipe or a file, which nothing is cut for."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    try:
        return os.get_terminal_size(sys.stdout.fileno()).columns
    except (OSError, ValueError):
        return None


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
                   utc_time(e["createdAt"]), utc_time(e["updatedAt"])] for e in executors])


def tokens_table(tokens: list[dict[str, Json]]) -> str:
    return table(["NAME", "CREATED", "APPS", "PERMISSIONS"], [
        [t["tokenName"], utc_time(t["createdAt"]), t.get("appNames") or t.get("appIds") or "(all)",
         t.get("permissions")] for t in tokens])


_AUDIT_HEADERS = ["TIME", "OPERATION", "STATUS", "SUBJECT", "TARGET", "SOURCE IP"]
# --follow prints each row as it comes, so its columns are fixed: wide enough for every operation Relay writes
# (``executor.recovery.dispatched``), an app target (``application:`` and 30 characters) and a time with
# milliseconds.
_FOLLOW_WIDTHS = [24, 28, 7, 16, 42, 15]
# In a terminal too narrow for every column whole, columns give way in this order, down to these widths (a cell cut
# ends in "…"; 0 leaves the column out), until the row and at least DETAILS_MIN of details (or the longest kept part
# of a summary in the table) fit on one line. When even that does not fit (under about 150 columns), the details go
# on a line of their own under each row, indented, and the row gives way further (_STACKED) to fit. The kept part
# of a summary is never cut, even where that makes its line longer.
_ONE_LINE = [(4, 24), (3, 10), (5, 0), (4, 20)]  # (column, narrowest): TARGET, SUBJECT, SOURCE IP, TARGET
_STACKED = [(3, 0), (1, 20), (4, 12)]  # SUBJECT, OPERATION, TARGET
DETAILS_MIN = 48
INDENT = "    "
DETAILS_WIDTH = 100  # the summary's width when the output is no terminal; -o json prints the details whole
# Never cut from a summary: which executor, which attempt, how it ended.
KEPT_WHOLE = ("executorId", "attempt", "outcome")


@dataclass(frozen=True)
class _Layout:
    widths: list[int]  # of the columns above; 0: left out
    details: int  # the details' width
    stacked: bool  # the details on a line of their own


def _span(widths: list[int]) -> int:
    shown = [w for w in widths if w]
    return sum(shown) + 2 * (len(shown) - 1)


def _give_way(widths: list[int], steps: list[tuple[int, int]], budget: int) -> list[int]:
    widths = list(widths)
    for column, narrowest in steps:
        over = _span(widths) - budget
        if over <= 0:
            break
        widths[column] = 0 if narrowest == 0 else min(widths[column], max(narrowest, widths[column] - over))
    return widths


def _layout(natural: list[int], width: int | None, details: int = DETAILS_MIN) -> _Layout:
    """How the columns of ``natural`` widths, and at least ``details`` of details, fit ``width`` columns (None: no
    limit)."""
    if width is None:
        return _Layout(natural, DETAILS_WIDTH, stacked=False)
    one_line = _give_way(natural, _ONE_LINE, width - details - 2)
    if _span(one_line) + 2 + details <= width:
        return _Layout(one_line, width - _span(one_line) - 2, stacked=False)
    return _Layout(_give_way(natural, _ONE_LINE + _STACKED, width), width - len(INDENT), stacked=True)


def _audit_cells(entry: dict[str, Json]) -> list[str]:
    return [utc_time(entry.get("emitTime")), _cell(entry.get("operation")), _cell(entry.get("status")),
            _cell(_who(entry.get("subject"))), _cell(_who(entry.get("target"))), _cell(entry.get("sourceIp") or None)]


def _row(cells: list[str], details: str, layout: _Layout) -> str:
    row = "  ".join(_fit(c, w) for c, w in zip(cells, layout.widths, strict=True) if w)
    return f"{row.rstrip()}\n{INDENT}{details}" if layout.stacked else f"{row}  {details}".rstrip()


def audit_line(entry: dict[str, Json] | None, *, width: int | None = None) -> str:
    """One entry of ``relay audit --follow`` (the header for None), in the fixed columns above, fitted to ``width``
    (default: the terminal's)."""
    layout = _layout(_FOLLOW_WIDTHS, terminal_width() if width is None else width)
    if entry is None:
        return _row(_AUDIT_HEADERS, "DETAILS", layout)
    return _row(_audit_cells(entry), summarize(entry.get("details"), width=layout.details), layout)


def audit_table(entries: list[dict[str, Json]], *, width: int | None = None) -> str:
    """The entries oldest first (the API lists newest first, what a script paging back wants; a person reads a log
    oldest first), each column as wide as its longest cell, all of it fitted to ``width`` (default: the
    terminal's)."""
    rows = [(_audit_cells(e), e.get("details")) for e in entries[::-1]]
    natural = [max([len(h), *(len(cells[i]) for cells, _ in rows)]) for i, h in enumerate(_AUDIT_HEADERS)]
    kept = max([DETAILS_MIN, *(len(_parts(details)[0]) + 2 for _, details in rows)])
    layout = _layout(natural, terminal_width() if width is None else width, kept)
    return "\n".join([_row(_AUDIT_HEADERS, "DETAILS", layout),
                      *(_row(cells, summarize(details, width=layout.details), layout) for cells, details in rows)])


def _fit(cell: str, width: int) -> str:
    if len(cell) > width:
        return cell[:width - 1] + "…"
    return cell.ljust(width)


def summarize(details: Json, *, width: int = DETAILS_WIDTH) -> str:
    """Audit details on one line: ``executorId``, ``attempt`` and ``outcome`` first, then ``key=value`` in the API's
    order; a list of plain values joined by commas, a nested object as ``{…}``; cut at ``width`` characters, but
    never within the first three (``KEPT_WHOLE``)."""
    if not isinstance(details, dict) or not details:
        return _cell(details or None)
    kept, rest = _parts(details)
    text = " ".join(p for p in (kept, rest) if p)
    if len(text) <= width or not rest:
        return text
    room = width - len(kept) - (1 if kept else 0)
    cut = rest[:room - 1] + "…" if room >= 2 else "…"
    return f"{kept} {cut}" if kept else cut


def _parts(details: Json) -> tuple[str, str]:
    """A summary's two halves: the ``KEPT_WHOLE`` keys, and the others in the API's order."""
    if not isinstance(details, dict):
        return "", ""
    first = {k: details[k] for k in KEPT_WHOLE if k in details}
    parts = [f"{key}={_summary_value(value)}" for key, value in {**first, **details}.items()]
    return " ".join(parts[:len(first)]), " ".join(parts[len(first):])


def _summary_value(value: Json) -> str:
    if isinstance(value, dict):
        return "{…}" if value else "{}"
    if isinstance(value, list):
        flat = value and not any(isinstance(v, dict | list) for v in value)
        return ",".join(map(_cell, value)) if flat else "[…]" if value else "[]"
    if isinstance(value, str) and (not value or any(c.isspace() or c in "=\"" for c in value)):
        return json.dumps(value, ensure_ascii=False)  # quoted, so each key=value stays one word
    return _cell(value)


def _who(value: Json) -> Json:
    """An upstream ``AuditSubject`` by its display name, an ``AuditTarget`` as ``type:id``."""
    if not isinstance(value, dict):
        return value
    return value.get("display") or f"{value.get('type')}:{value.get('id')}"
