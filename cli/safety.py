"""The ``relay drain`` and ``relay recovery`` commands: drain an executor (never chosen to recover others or to
carry an operator's request), pause an app's recoveries for a maintenance window, and show the app's recovery gate.

Durations come in as people write them (``30m``, ``1h``) and go to the REST API as ``expiresInSecs``; the client,
``--url``/``--api-key``/``--org``/``-o`` and the errors are ``cli.admin``'s.
"""

from __future__ import annotations

import argparse
from datetime import datetime, timedelta
from typing import Any

from cli import workflow_tables as show
from cli.common import api_of, app_path, command, emit, parse_duration, path_part, say
from cli.tables import Json, table
from core import units
from core.settings import Settings
from core.units import utcnow

MAX_FOR = timedelta(days=30)  # the REST API's bound on expiresInSecs


def _expiry(text: str) -> int:
    """``--for``: a duration of whole seconds, at least 1 s, at most 30 days, as ``expiresInSecs``."""
    value = parse_duration(text)
    secs = units.timedelta_to_seconds(value)
    if units.seconds_to_timedelta(secs) != value or not timedelta(seconds=1) <= value <= MAX_FOR:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole seconds, from 1s to 30d")
    return secs



def _body(args: argparse.Namespace) -> dict[str, Json]:
    return {"expiresInSecs": args.expires_in_secs, **({"reason": args.reason} if args.reason else {})}


def _until(value: Json, now: datetime) -> str:
    return show.human_time(value, now)


def _by(row: dict[str, Json]) -> Json:
    """Who set a drain or pause: the key's name, as the audit log shows it (``subjectName``)."""
    return row.get("subjectName") or row["subject"]


def drains_table(drains: list[dict[str, Json]], now: datetime) -> str:
    return table(["EXECUTOR ID", "ACTIVE", "UNTIL", "REASON", "BY"],
                 [[d["executorId"], d["active"], _until(d["until"], now), d["reason"] or "-", _by(d)]
                  for d in drains])


def status_card(status: dict[str, Json], now: datetime, *, app: str = "<app>") -> str:
    pause, breaker = status["pause"], status["breaker"]
    lines = []
    if pause is None or not pause["active"]:
        lines.append("pause:    none")
    else:
        lines.append(f"pause:    until {_until(pause['until'], now)}, by {_by(pause)}"
                     + (f": {pause['reason']}" if pause["reason"] else ""))
    if breaker["tripped"]:
        lines.append(f"breaker:  TRIPPED at {_until(breaker['trippedAt'], now)} (trips: {breaker['trips']})")
    else:
        lines.append(f"breaker:  closed (trips: {breaker['trips']})")
    waiting = status["waiting"]
    lines.append(f"waiting:  {len(waiting)}")
    if waiting:
        lines.append(table(["EXECUTOR ID", "DIED", "SLOT", "HELD"],
                           [[w["executorId"], _until(w["diedAt"], now),
                             _until(w["slotAt"], now) if w["slotAt"] else "-", w["reason"] or "-"]
                            for w in waiting]))
    blocked = status.get("blocked") or []
    lines.append(f"blocked:  {len(blocked)}" + (" (DEAD, waiting for a HEALTHY, undrained executor of their "
                                                "version)" if blocked else ""))
    if blocked:
        lines.append(table(["EXECUTOR ID", "VERSION", "DIED", "BLOCKED", "DRAINED PEERS"],
                           [[b["executorId"], b["appVersion"], _until(b["diedAt"], now), _until(b["blockedAt"], now),
                             b["drainedPeers"]] for b in blocked]))
        drained = sorted({p for b in blocked for p in b["drainedPeers"]})
        if drained:
            lines.append(f"a drained peer could recover them: relay drain clear {drained[0]} --app {app}")
    return "\n".join(lines)



def _drain_set(args: argparse.Namespace, settings: Settings) -> None:
    drain = api_of(args, settings).call("PUT", f"{app_path(args)}/executors{path_part(args.executor_id)}/drain",
                                      body=_body(args))
    emit(args, drain, lambda d: f"drained {d['executorId']} until {_until(d['until'], utcnow())}")


def _drain_clear(args: argparse.Namespace, settings: Settings) -> None:
    api_of(args, settings).call("DELETE", f"{app_path(args)}/executors{path_part(args.executor_id)}/drain")
    say(args, f"undrained {args.executor_id}")


def _drain_list(args: argparse.Namespace, settings: Settings) -> None:
    now = utcnow()
    emit(args, api_of(args, settings).call("GET", f"{app_path(args)}/drains"), lambda d: drains_table(d, now))


def _pause(args: argparse.Namespace, settings: Settings) -> None:
    pause = api_of(args, settings).call("PUT", f"{app_path(args)}/recovery-pause", body=_body(args))
    emit(args, pause, lambda p: f"recovery of {args.app} paused until {_until(p['until'], utcnow())}")


def _resume(args: argparse.Namespace, settings: Settings) -> None:
    api_of(args, settings).call("DELETE", f"{app_path(args)}/recovery-pause")
    say(args, f"recovery of {args.app} resumed")


def _status(args: argparse.Namespace, settings: Settings) -> None:
    now = utcnow()
    emit(args, api_of(args, settings).call("GET", f"{app_path(args)}/recovery"),
          lambda s: status_card(s, now, app=args.app))



def _expiring(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--for", dest="expires_in_secs", type=_expiry, required=True, metavar="DURATION",
                   help=f"how long the {what} lasts, then ends by itself: 90s, 30m, 2h, 1d (at most 30d)")
    p.add_argument("--reason", help="said in the audit log and the listing")


def add_commands(sub: Any) -> None:
    """Add ``drain set|clear|list`` and ``recovery pause|resume|status`` to the ``relay`` command's ``sub``."""
    drain = sub.add_parser("drain", help="drained executors: never chosen to recover others or to carry requests")
    group = drain.add_subparsers(dest="drain_command", required=True)
    _expiring(command(group, "set", _drain_set, "drain an executor", "executor_id"), "drain")
    command(group, "clear", _drain_clear, "end an executor's drain", "executor_id")
    command(group, "list", _drain_list, "list an application's drains, expired ones included")

    recovery = sub.add_parser("recovery", help="an application's recovery gate: pause, resume, breaker")
    group = recovery.add_subparsers(dest="recovery_command", required=True)
    _expiring(command(group, "pause", _pause, "pause recoveries (a maintenance window)"), "pause")
    command(group, "resume", _resume, "lift the pause: held recoveries go, paced")
    command(group, "status", _status, "show the pause, the storm breaker and the held recoveries")
