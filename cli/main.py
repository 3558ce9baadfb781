"""The ``relay`` command: ``dev``, ``gateway``, ``worker``, ``keys create``; the admin commands are in ``admin_cli``."""

from __future__ import annotations

import argparse
import asyncio
import difflib
import logging
import re
import traceback
from collections.abc import Sequence
from typing import Any, NoReturn

from pydantic import ValidationError

from cli import admin as admin_cli
from cli import alerts as alerts_cli
from cli import migrate as migrate_cli
from cli import patches as patches_cli
from cli import safety as safety_cli
from cli import temporal_setup as temporal_setup_cli
from cli import workflows as workflows_cli
from cli.common import AFTER_PARSE, api_key
from core.errors import SchemaVersionError
from core.logs import configure_from_environment as configure_logging
from core.logs import install_redaction
from core.names import DEFAULT_ORG
from core.settings import Settings

log = logging.getLogger("relay")


class RelayParser(argparse.ArgumentParser):
    """argparse, and every subcommand's parser (``add_parser`` makes them of this class), with two additions: a
    mistyped subcommand, choice or option is answered with the closest valid one ("did you mean"), from the parser
    of the command it was typed for; and a command's check of what it parsed (``cli.common.AFTER_PARSE``) runs."""

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        parsed, extras = super().parse_known_args(args, namespace)
        if extras:  # said here, by the innermost parser that saw them: it knows the options they were meant as
            self.error(f"unrecognized arguments: {' '.join(extras)}{self._suggest(extras)}")
        check = self.get_default(AFTER_PARSE)
        if check is not None and (problem := check(parsed)):
            self.error(problem)
        return parsed, extras

    def add_subparsers(self, **kwargs: Any) -> Any:
        """argparse's, remembering the subcommands' parsers by name (``subcommands``): the CLI reference
        (docs/reference.py) walks the command tree by it."""
        action = super().add_subparsers(**kwargs)
        self.subcommands: dict[str, argparse.ArgumentParser] = action.choices
        return action

    def error(self, message: str) -> NoReturn:
        choice = re.search(r"invalid choice: '?([^' ]*)'? \(choose from (.*)\)$", message)
        if choice is not None:
            offered = [c.strip("'\" ") for c in choice.group(2).split(",")]
            message += _did_you_mean(choice.group(1), offered)
        super().error(message)

    def _suggest(self, extras: list[str]) -> str:
        options = [o for action in self._actions for o in action.option_strings]
        return "".join(_did_you_mean(extra.split("=", 1)[0], options) for extra in extras if extra.startswith("-"))


def _did_you_mean(typed: str, offered: list[str]) -> str:
    close = difflib.get_close_matches(typed, offered, n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def parser() -> argparse.ArgumentParser:
    p = RelayParser(prog="relay", description="Self-hosted control plane for DBOS executors.")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("dev", help="embedded Temporal dev server + worker + gateway, in one process tree")
    sub.add_parser("gateway", help="executor WebSocket and REST API (RELAY_TEMPORAL_ADDRESS)")
    sub.add_parser("worker", help="Temporal worker for workflows and database activities")
    keys = sub.add_parser("keys", help="API keys").add_subparsers(dest="keys_command", required=True)
    create = keys.add_parser("create", help="print one new key; only its hash is stored")
    create.add_argument("--org", default=DEFAULT_ORG)
    create.add_argument("--app", action="append", help="restrict the key to this app (repeatable)")
    create.add_argument("--name", default="cli", help="a label for the key")
    admin_cli.add_commands(sub, keys)
    workflows_cli.add_commands(sub)
    safety_cli.add_commands(sub)
    alerts_cli.add_commands(sub)
    temporal_setup_cli.add_commands(sub)
    migrate_cli.add_commands(sub)
    patches_cli.add_commands(sub)
    return p


def main(argv: Sequence[str] | None = None) -> None:
    args = parser().parse_args(argv)
    try:
        configure_logging()
    except ValueError as err:  # an unknown level or format: say which, without a traceback
        raise SystemExit(f"relay: {err}") from None
    install_redaction()
    try:
        settings = Settings()
    except ValidationError as err:  # which setting and why, in one line, without a traceback
        raise SystemExit(f"relay: {settings_error(err)}") from None
    if args.command in ("dev", "gateway", "worker"):
        _check_schema(settings)
        from cli import serve  # the server stack: only the commands that run it pay for importing it
        from core.temporal import exit_now

        entry = {"dev": serve.dev, "gateway": serve.gateway, "worker": serve.run_worker}[args.command]
        try:
            asyncio.run(entry(settings))
        except Exception:
            traceback.print_exc()
            exit_now(1)
        exit_now(0)  # past the SDK's Rust threads, which can abort the interpreter's finalization
    try:
        if args.command == "keys" and args.keys_command == "create" and not api_key(args, settings):
            admin_cli.keys_create_local(args, settings)  # no key to call the API with: the local database
        else:
            admin_cli.run(args, settings)
    except SchemaVersionError as err:  # the local database, opened by a CLI command
        raise SystemExit(f"relay: {err.detail}") from None


def settings_error(err: ValidationError) -> str:
    """Each invalid setting named as its variable, with pydantic's reason (the settings hide their input: it may be
    a secret)."""
    reasons = []
    for e in err.errors():
        reason = e["msg"].removeprefix("Value error, ")
        loc = "_".join(str(part) for part in e["loc"]).upper()
        reasons.append(f"RELAY_{loc}: {reason}" if loc else reason)
    return "; ".join(reasons)


def _check_schema(settings: Settings) -> None:
    """Open the store once before a process starts anything (the embedded Temporal, a Temporal client, uvicorn,
    whose lifespan would bury the line under a traceback): a database at another schema revision than this code's
    (``SchemaVersionError``) stops it here with one line and exit status 1. With RELAY_MIGRATE_ON_START an older
    one is upgraded here. A database that cannot be reached is the process's own to meet, as before."""
    from core.models import open_engine  # the database's modules: only for the commands that open it

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    try:
        open_engine(settings).dispose()
    except SchemaVersionError as err:
        log.error("cannot start: %s", err.detail)
        raise SystemExit(1) from None
    except Exception as err:
        log.debug("schema not checked before start: %s", type(err).__name__)


if __name__ == "__main__":
    main()
