"""The ``relay alerts`` command: list, create and delete an application's alerting rules through the REST API
(listAlertingRules, createAlertingRule, deleteAlertingRule).

``--min-interval`` comes in as people write durations (``90s``, ``15m``) and goes to the API as
``minIntervalSecs``; ``--metadata`` is ``ruleMetadata`` as JSON (see ``core.alerts`` for the keys). The client,
``--url``/``--api-key``/``--org``/``-o`` and the errors are ``cli.admin``'s.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from cli.common import api_of, command, emit, parse_duration, path_part
from cli.tables import Json, format_duration, table, utc_time
from core import units
from core.settings import Settings
from core.types import RuleType


def _min_interval(text: str) -> int:
    """``--min-interval``: whole seconds (``minIntervalSecs``)."""
    value = parse_duration(text)
    secs = units.timedelta_to_seconds(value)
    if units.seconds_to_timedelta(secs) != value or secs < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: give whole seconds, e.g. 90s or 15m")
    return secs


def _metadata(text: str) -> Json:
    try:
        value: Json = json.loads(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"not JSON: {err}") from None
    return value


def rules_table(rules: list[dict[str, Json]]) -> str:
    def interval(secs: int | None) -> str:
        return "-" if secs is None else format_duration(units.seconds_to_timedelta(secs))

    return table(["ID", "TYPE", "METADATA", "MIN INTERVAL", "RECEIVING APP", "LAST FIRED"],
                 [[r["id"], r["ruleType"], json.dumps(r["ruleMetadata"]), interval(r["minIntervalSecs"]),
                   r.get("receivingAppName") or r["receivingAppId"],
                   utc_time(r["lastFiredAt"]) if r["lastFiredAt"] else "never"] for r in rules])


def _path(args: argparse.Namespace) -> str:
    return f"/apps{path_part(args.app)}/alerting-rules"


def _list(args: argparse.Namespace, settings: Settings) -> None:
    emit(args, api_of(args, settings).call("GET", _path(args)), rules_table)


def _create(args: argparse.Namespace, settings: Settings) -> None:
    body: dict[str, Json] = {"ruleType": args.type, "ruleMetadata": args.metadata}
    if args.min_interval is not None:
        body["minIntervalSecs"] = args.min_interval
    if args.receiving_app:
        body["receivingAppName"] = args.receiving_app
    rule = api_of(args, settings).call("POST", _path(args), body=body)
    emit(args, rule, lambda r: f"created {r['ruleType']} rule {r['id']}")


def _delete(args: argparse.Namespace, settings: Settings) -> None:
    api_of(args, settings).call("DELETE", _path(args) + path_part(args.rule_id))
    if args.output == "table":
        print(f"deleted rule {args.rule_id}", flush=True)



def add_commands(sub: Any) -> None:
    """Add ``alerts list|create|delete`` to the ``relay`` command's ``sub``."""
    alerts = sub.add_parser("alerts", help="alerting rules: WorkflowFailure, SlowQueue, UnresponsiveApplication")
    group = alerts.add_subparsers(dest="alerts_command", required=True)
    command(group, "list", _list, "list an application's alerting rules")
    create = command(group, "create", _create, "create an alerting rule")
    create.add_argument("--type", required=True, choices=[t.value for t in RuleType])
    create.add_argument("--metadata", type=_metadata, default={}, metavar="JSON",
                        help='ruleMetadata, e.g. \'{"queueName": "orders", "thresholdSecs": 120}\' (default {})')
    create.add_argument("--min-interval", type=_min_interval, metavar="DURATION",
                        help="fire at most once per this long: 90s, 15m, 1h (default: no minimum)")
    create.add_argument("--receiving-app", help="the application that receives the alerts (default: --app)")
    command(group, "delete", _delete, "delete an alerting rule", "rule_id")
