"""The admin half of the ``relay`` command: ``apps``, ``executors``, ``audit`` and ``keys``, over the REST API.

Every command is a thin client of ``/v2/orgs/{org}/...`` (the upstream Conductor paths and field names), so the
CLI can do what the API can, with the API's checks and audit trail. One exception bootstraps the first key: with
no API key at all, ``keys create|list|revoke`` work on the local database.

App settings take dbos-ctl's flags in REST units (``--executor-timeout-secs 90``) or human durations
(``--executor-timeout 90s``). Either way the value is a ``timedelta`` from the moment it is parsed, and leaves as
seconds or milliseconds only through ``core.units``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cli import tables
from cli.common import (
    Api,
    Handler,
    api_key,
    api_of,
    app_argument,
    client_options,
    emit,
    fail,
    instant,
    iso,
    parse_duration,
    path_part,
)
from cli.tables import Json, format_duration
from core import units
from core.errors import RelayError
from core.settings import Settings

if TYPE_CHECKING:
    from core.store import Store

# The database's modules (SQLAlchemy, the store, the migrations) are imported by the commands that open it, not by
# every `relay` command: `relay workflows list` starts in a third of the time.

# Audit rows are stamped by their writer (gateway or worker) before they commit, so one may appear after a
# later-stamped one was already read: --follow re-reads this far back and skips the ids it has printed.
FOLLOW_OVERLAP = timedelta(seconds=30)
AUDIT_PAGE = 100
# A retention threshold or global timeout this short deletes (cancels) most of an app's workflows at the next round:
# the CLI asks before it sends one (--yes: do not ask). Under a second the REST API refuses it outright.
CONFIRM_BELOW = timedelta(hours=1)
# (args dest, flag, what the setting then does) of the settings that destroy data when too short.
_CONFIRMED = [
    ("gc_time_threshold", "gc-time-threshold", "finished workflows that completed more than {} ago are deleted"),
    ("global_timeout", "global-timeout",
     "PENDING, ENQUEUED and DELAYED workflows created more than {} ago are cancelled"),
]

# -- parsing ---------------------------------------------------------------------------------------------------




def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None


def _secs(text: str) -> timedelta:
    return units.seconds_to_timedelta(_integer(text))


def _ms(text: str) -> timedelta:
    return units.ms_to_timedelta(_integer(text))


def _whole_seconds(text: str) -> timedelta:
    try:
        value = parse_duration(text)
    except argparse.ArgumentTypeError as err:
        raise argparse.ArgumentTypeError(str(err).replace(", 500ms)", "; whole seconds)")) from None
    if units.seconds_to_timedelta(units.timedelta_to_seconds(value)) != value:
        raise argparse.ArgumentTypeError(f"{text!r}: executorTimeoutSecs takes whole seconds")
    return value


def _or_clear(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """Accept ``none`` too: the explicit null that clears a retention setting (a Relay extension)."""
    return lambda text: None if text.strip().lower() in ("none", "null") else parse(text)




def settings_body(args: argparse.Namespace) -> dict[str, Json]:
    """The ``PatchAppInputBody`` for the setting flags given; flags not given are absent, so unchanged."""
    given, body = vars(args), dict[str, Json]()
    if "executor_timeout" in given:
        body["executorTimeoutSecs"] = units.timedelta_to_seconds(args.executor_timeout)
    if "gc_time_threshold" in given:
        body["gcTimeThresholdMs"] = units.optional_timedelta_to_ms(args.gc_time_threshold)
    if "gc_rows_threshold" in given:
        body["gcRowsThreshold"] = args.gc_rows_threshold
    if "global_timeout" in given:
        body["globalTimeoutMs"] = units.optional_timedelta_to_ms(args.global_timeout)
    if "private_mode" in given:
        body["privateMode"] = args.private_mode
    return body


def confirm_short_thresholds(args: argparse.Namespace) -> None:
    """Ask before sending a retention threshold or global timeout under ``CONFIRM_BELOW`` (and at least the REST
    API's one second: below that it refuses with a hint, so there is nothing to confirm). ``--yes`` skips the
    question; without a terminal to ask on, such a value is refused unless ``--yes`` is given."""
    given = vars(args)
    short = [(flag, what.format(format_duration(value)), value) for dest, flag, what in _CONFIRMED
             if isinstance(value := given.get(dest), timedelta) and units.MIN_THRESHOLD <= value < CONFIRM_BELOW]
    if not short or getattr(args, "yes", False):
        return
    said = "; ".join(f"--{flag} {format_duration(value)} is under {format_duration(CONFIRM_BELOW)}: at the next "
                     f"retention round {what}" for flag, what, value in short)
    if sys.stdin is None or not sys.stdin.isatty():
        fail(f"{said}. Nothing was changed: pass --yes to confirm (there is no terminal to ask on)")
    print(f"{said}.\nContinue? [y/N] ", end="", file=sys.stderr, flush=True)  # stdout stays the command's output
    if sys.stdin.readline().strip().lower() not in ("y", "yes"):
        fail("nothing was changed")


# -- the REST client -------------------------------------------------------------------------------------------
















# -- commands --------------------------------------------------------------------------------------------------


def _apps_list(args: argparse.Namespace, settings: Settings) -> None:
    emit(args, api_of(args, settings).call("GET", "/apps"), tables.apps_table)


def _apps_get(args: argparse.Namespace, settings: Settings) -> None:
    emit(args, api_of(args, settings).call("GET", "/apps" + path_part(args.name)), tables.app_card)


def _apps_register(args: argparse.Namespace, settings: Settings) -> None:
    """registerApp, then the settings given (updateApp). As registerApp changes nothing of an app that exists but
    ``privateMode``, registering an existing app with other settings is refused, changing nothing: that is
    ``relay apps update``'s job. Either way the CLI says when the app already existed."""
    api, path, body = api_of(args, settings), "/apps" + path_part(args.name), settings_body(args)
    private = {"privateMode": body.pop("privateMode")} if "privateMode" in body else None
    existed = api.find(path) is not None
    if existed and body:
        fail(f"application {args.name!r} is already registered; registering it again changes only --private-mode, "
             f"so nothing was changed: use `relay apps update {args.name}` to change its settings")
    confirm_short_thresholds(args)
    api.call("PUT", path, body=private)
    if body:
        api.call("PATCH", path, body=body)
    if existed:
        print(f"relay: application {args.name!r} was already registered"
              + ("; --private-mode applied" if private else "; nothing changed"), file=sys.stderr, flush=True)
    emit(args, api.call("GET", path), tables.app_card)


def _apps_update(args: argparse.Namespace, settings: Settings) -> None:
    if not (body := settings_body(args)):
        fail("nothing to change: give at least one setting (see relay apps update --help)")
    confirm_short_thresholds(args)
    api, path = api_of(args, settings), "/apps" + path_part(args.name)
    api.call("PATCH", path, body=body)
    emit(args, api.call("GET", path), tables.app_card)


def _apps_delete(args: argparse.Namespace, settings: Settings) -> None:
    api_of(args, settings).call("DELETE", "/apps" + path_part(args.name))
    if args.output == "table":
        print(f"deleted {args.name}")


def _executors_list(args: argparse.Namespace, settings: Settings) -> None:
    emit(args, api_of(args, settings).call("GET", f"/apps{path_part(args.app)}/executors"), tables.executors_table)




def _emit_time(entry: dict[str, Json]) -> datetime:
    value = datetime.fromisoformat(entry["emitTime"])
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _audit(args: argparse.Namespace, settings: Settings) -> None:
    if args.follow and args.end_time:
        fail("--follow and --end-time do not go together")
    api = api_of(args, settings)
    filters = {k: v for k, v in [("operation", args.operation), ("subject", args.subject), ("target", args.target),
                                 ("startTime", args.start_time and iso(args.start_time)),
                                 ("endTime", args.end_time and iso(args.end_time))] if v}
    limit = 20 if args.follow and args.limit is None else args.limit
    page = {k: v for k, v in [("limit", limit), ("offset", args.offset)] if v is not None}
    entries = api.call("GET", "/audit-logs", params={**filters, **page})
    if not args.follow:
        return emit(args, entries, tables.audit_table)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how --follow ends
        _follow(api, filters, entries, json_lines=args.output == "json", interval=args.interval,
                floor=args.start_time)


def _follow(api: Api, filters: dict[str, Any], initial: list[dict[str, Json]], *, json_lines: bool,
            interval: timedelta, floor: datetime | None) -> None:
    """Print ``initial`` (given newest first) oldest first, then every entry that appears, until interrupted."""
    seen: dict[str, datetime] = {}

    def show(entry: dict[str, Json]) -> None:
        print(json.dumps(entry) if json_lines else tables.audit_line(entry), flush=True)
        seen[entry["id"]] = _emit_time(entry)

    def window() -> dict[str, Any]:
        if not seen:
            return filters
        start = max([max(seen.values()) - FOLLOW_OVERLAP, *([floor] if floor else [])])
        for old in [k for k, t in seen.items() if t < start]:  # never returned again: bounded memory
            del seen[old]
        return {**filters, "startTime": iso(start)}

    if not json_lines:
        print(tables.audit_line(None), flush=True)
    for entry in initial[::-1]:
        show(entry)
    if seen:  # entries in the overlap window beyond the initial limit are old news, not new ones
        seen.update((e["id"], _emit_time(e)) for e in _audit_pages(api, window()))
    while True:
        time.sleep(interval.total_seconds())
        for entry in sorted((e for e in _audit_pages(api, window()) if e["id"] not in seen), key=_emit_time):
            show(entry)


def _audit_pages(api: Api, filters: dict[str, Any]) -> Iterator[dict[str, Json]]:
    # Entries added while paging push older ones to higher offsets: a page may repeat one, never skip one.
    for offset in range(0, 1 << 62, AUDIT_PAGE):
        entries = api.call("GET", "/audit-logs", params={**filters, "limit": AUDIT_PAGE, "offset": offset})
        yield from entries
        if len(entries) < AUDIT_PAGE:
            return


def _keys_create(args: argparse.Namespace, settings: Settings) -> None:
    body = {"appNames": args.app} if args.app else {}
    emit(args, api_of(args, settings).call("POST", "/tokens" + path_part(args.name), body=body), lambda c: c["token"])


def _keys_list(args: argparse.Namespace, settings: Settings) -> None:
    local = api_key(args, settings) is None
    tokens = _local_tokens(settings, args.org) if local else api_of(args, settings).call("GET", "/tokens")
    emit(args, tokens, tables.tokens_table)


def _keys_revoke(args: argparse.Namespace, settings: Settings) -> None:
    if api_key(args, settings):
        api_of(args, settings).call("DELETE", "/tokens" + path_part(args.name))
    else:
        _local_revoke(settings, args.org, args.name)
    if args.output == "table":
        print(f"revoked {args.name}")


# -- the local database, for bootstrapping (no API key yet) ---------------------------------------------------


def database_shown(url: str) -> str:
    """Where a database is, for a person: a SQLite file's absolute path, any other URL without its password."""
    import sqlalchemy as sa

    from core.models import engine_url

    parsed = sa.make_url(engine_url(url))
    if parsed.get_backend_name() == "sqlite":
        return str(Path(parsed.database).resolve()) if parsed.database else "an in-memory SQLite database"
    return parsed.render_as_string(hide_password=True)


def database_exists(url: str) -> bool:
    """Whether ``url`` holds a database already (a schema revision, or tables from before migrations), found without
    creating anything: connecting to a SQLite file that is not there would create it."""
    import sqlalchemy as sa

    from core import migrations
    from core.models import engine_url

    parsed = sa.make_url(engine_url(url))
    if parsed.get_backend_name() == "sqlite" and not (parsed.database and Path(parsed.database).is_file()):
        return False
    engine = sa.create_engine(parsed)
    try:
        with engine.connect() as conn:
            return bool(migrations.current(conn) or sa.inspect(conn).get_table_names())
    finally:
        engine.dispose()


def _local_store(settings: Settings, *, init: bool = False) -> Store:
    """The local database (RELAY_DATA_DIR's, or RELAY_DATABASE_URL). One that does not exist yet is created only
    with ``init``: run from the wrong directory, the CLI would otherwise make a new, empty database there and work on
    it, and a key written to it is unknown to every Relay."""
    from core.models import open_engine
    from core.store import Store

    if not database_exists(settings.db_url):
        if not init:
            fail(f"no Relay database at {database_shown(settings.db_url)}, so nothing was done: run this where Relay "
                 "runs, or set RELAY_DATA_DIR or RELAY_DATABASE_URL to Relay's database (or call the REST API with "
                 "an API key); `relay keys create --init` creates a new database there")
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    return Store(open_engine(settings))


def keys_create_local(args: argparse.Namespace, settings: Settings) -> None:
    """``relay keys create`` with no API key: the key is made as ``createToken`` makes it (names unique among live
    tokens, audited), straight in the local database, which must exist unless ``--init``. The key goes to stdout,
    which database it was written to to stderr."""
    from core.store import SYSTEM_SUBJECT

    init = bool(getattr(args, "init", False))
    store = _local_store(settings, init=init)
    try:
        key = store.create_token(org=args.org, name=args.name, apps=args.app or None, subject=SYSTEM_SUBJECT,
                                 source_ip="")
    except RelayError as err:
        fail(err.detail)
    finally:
        store.engine.dispose()
    print(key, flush=True)
    print(f"relay: key {args.name!r} of org {args.org!r} written to the database at "
          f"{database_shown(settings.db_url)}", file=sys.stderr, flush=True)


def _local_tokens(settings: Settings, org: str) -> list[dict[str, Json]]:
    """The org's live keys in the ``Token`` shape ``listTokens`` answers with, so both paths print alike."""
    store = _local_store(settings)
    keys, app_ids = store.list_tokens(org)
    store.engine.dispose()
    return [{"tokenName": k.name, "createdAt": k.created_at.isoformat(), "permissions": [],
             "appIds": [app_ids[a] for a in k.apps or [] if a in app_ids], "appNames": k.apps} for k in keys]


def _local_revoke(settings: Settings, org: str, name: str) -> None:
    """The gateways' revocation watch closes the sockets that used the key, as after ``deleteToken``."""
    store = _local_store(settings)
    try:
        store.revoke_token(org, name, subject="system", source_ip="")
    except RelayError as err:
        fail(err.detail)
    finally:
        store.engine.dispose()


# -- the parser ------------------------------------------------------------------------------------------------










def _setting_options(p: argparse.ArgumentParser) -> None:
    """dbos-ctl's flags in REST units, or the same setting as a duration; ``none`` clears a retention one."""
    def pair(flag: str, unit: str, meaning: str) -> None:
        in_unit, human = (_secs, _whole_seconds) if unit == "secs" else (_or_clear(_ms), _or_clear(parse_duration))
        group, dest = p.add_mutually_exclusive_group(), flag.replace("-", "_")
        group.add_argument(f"--{flag}-{unit}", dest=dest, type=in_unit, default=argparse.SUPPRESS,
                           metavar=unit.upper(), help=f"{meaning}, in {'seconds' if unit == 'secs' else 'ms'}")
        examples = "90s, 15m, 1h30m (whole seconds)" if unit == "secs" else "500ms, 90s, 15m, 12h, 7d"
        group.add_argument(f"--{flag}", dest=dest, type=human, default=argparse.SUPPRESS, metavar="DURATION",
                           help=f"the same as a duration: {examples}")

    pair("executor-timeout", "secs", "grace between DISCONNECTED and DEAD")
    pair("gc-time-threshold", "ms", "garbage-collect workflows older than this (none: never)")
    p.add_argument("--gc-rows-threshold", type=_or_clear(_integer), default=argparse.SUPPRESS, metavar="ROWS",
                   help="keep at most this many workflows (none: no limit)")
    pair("global-timeout", "ms", "cancel workflows older than this (none: never)")
    p.add_argument("--private-mode", action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS)
    p.add_argument("--yes", "-y", action="store_true",
                   help=f"do not ask before setting a retention threshold or global timeout under "
                        f"{format_duration(CONFIRM_BELOW)}")


def add_commands(sub: Any, keys: Any) -> None:
    """Add ``apps``, ``executors`` and ``audit`` to ``sub``, ``list`` and ``revoke`` to ``keys``, and the client
    options to ``keys create`` (which goes through the API when it has a key)."""
    def command(parent: Any, name: str, handler: Handler, help: str, *positional: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = parent.add_parser(name, help=help)
        p.set_defaults(admin=handler)
        client_options(p)
        for arg in positional:
            p.add_argument(arg)
        return p

    apps = sub.add_parser("apps", help="applications").add_subparsers(dest="apps_command", required=True)
    command(apps, "list", _apps_list, "list applications")
    command(apps, "get", _apps_get, "show one application", "name")
    register = command(apps, "register", _apps_register, "register an application, settings optional", "name")
    register.epilog = ("An application that exists already keeps its settings: registering it again changes only "
                       "--private-mode (as registerApp does) and refuses other settings; use relay apps update.")
    _setting_options(register)
    _setting_options(command(apps, "update", _apps_update, "change an application's settings", "name"))
    command(apps, "delete", _apps_delete, "delete an application", "name")
    executors = sub.add_parser("executors", help="executors")
    app_argument(command(executors.add_subparsers(dest="executors_command", required=True), "list", _executors_list,
                         "list an application's executors"))

    audit = command(sub, "audit", _audit, "the audit log, oldest first; --follow prints new entries until Ctrl-C")
    audit.add_argument("--follow", "-f", action="store_true")
    audit.add_argument("--interval", type=parse_duration, default=timedelta(seconds=2), metavar="DURATION",
                       help="how often --follow polls (default 2s)")
    audit.add_argument("--start-time", type=instant, help="an ISO 8601 time, or a duration: 1h is an hour ago")
    audit.add_argument("--end-time", type=instant)
    for name in ("operation", "subject", "target"):
        audit.add_argument(f"--{name}")
    audit.add_argument("--limit", type=int)
    audit.add_argument("--offset", type=int)

    create = keys.choices["create"]
    create.set_defaults(admin=_keys_create)
    create.epilog = ("With an API key this calls createToken; with none, it writes to the local database "
                     "(RELAY_DATA_DIR's, or RELAY_DATABASE_URL), which must exist unless --init.")
    client_options(create, org=False)
    create.add_argument("--init", action="store_true",
                        help="with no API key: create the local database if there is none yet (else refused)")
    command(keys, "list", _keys_list, "list keys (never their secrets)")
    command(keys, "revoke", _keys_revoke, "revoke a key by name", "name")


def run(args: argparse.Namespace, settings: Settings) -> None:
    logging.getLogger("httpx").setLevel(logging.WARNING)  # its INFO line per request is noise on a terminal
    try:
        args.admin(args, settings)
    except BrokenPipeError:
        # The reader went away (``relay audit -o json | head``): stop quietly, as Unix tools do. Python's
        # recipe: point stdout at devnull so the flush at interpreter exit does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        raise SystemExit(1) from None
