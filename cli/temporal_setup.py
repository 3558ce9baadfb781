"""``relay temporal setup``: what Relay needs in the Temporal the environment names (``core.temporal``): its
namespace and its search attributes (``core.types.SEARCH_ATTRIBUTES``), created where missing; the steps are in
``cli.temporal_setup_steps``.

Idempotent: what exists is left alone, so it may run at every deploy (a Job, the compose one-shot). Temporal Cloud
refuses the operator API and namespace registration (PermissionDenied, Unimplemented): there it prints what to
create by hand and exits 1, as it does for an attribute that exists with another type (a type cannot change).
"""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any

from cli.common import parse_duration
from core.settings import Settings


def add_commands(sub: Any) -> None:
    """Add ``temporal setup`` to the ``relay`` command's ``sub``."""
    temporal = sub.add_parser("temporal", help="the Temporal Relay runs on (TEMPORAL_*, RELAY_TEMPORAL_*)")
    group = temporal.add_subparsers(dest="temporal_command", required=True)
    setup = group.add_parser("setup", help="create Relay's namespace and search attributes where missing "
                                           "(idempotent)")
    setup.add_argument("--retention", type=parse_duration, default=timedelta(days=3), metavar="DURATION",
                       help="workflow retention of a namespace it creates: 72h, 7d (default 3d)")
    setup.set_defaults(admin=_setup)


def _setup(args: argparse.Namespace, settings: Settings) -> None:
    from cli import temporal_setup_steps  # Temporal's modules: loaded when the command runs, not by the parser

    temporal_setup_steps.setup(args.retention, settings)
