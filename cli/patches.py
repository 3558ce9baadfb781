"""``relay patches check``: whether the next release can replay every open lifecycle run, before upgrading to it
(docs/pages/contributing/patch-policy.md).

A release that drops a lifecycle generation (``workflows.lifecycle_generations``) cannot replay a run of that
generation: the run's next workflow task fails with nondeterminism on the new workers, and retries for ever, so
its executor's death would go unheard. The check lists the open lifecycle runs from Temporal's visibility (one
query by workflow type) and reads each one's generation off its own history: the first patch marker it recorded,
which for every run started since generation 1 is its generation's marker (the workflow asks for it before it
does anything else), and for an older run one of the patches before generation 1, or none. That is the fact the
replay itself decides on, so the answer cannot disagree with it, unlike a start time (which says nothing of the
code that ran the first workflow task) or the ``TemporalChangeVersion`` search attribute the SDK upserts beside a
marker (visibility, which replay never reads, and which lags). It costs one history page per open run, read a few
at a time.
"""

from __future__ import annotations

import argparse
from typing import Any

from core.settings import Settings
from workflows.lifecycle_generations import NEWEST_GENERATION, NEXT_RELEASE_REPLAYS_FROM


def add_commands(sub: Any) -> None:
    """Add ``patches check`` to the ``relay`` command's ``sub``."""
    patches = sub.add_parser("patches", help="the workflow patches the open lifecycle runs depend on")
    group = patches.add_subparsers(dest="patches_command", required=True)
    check = group.add_parser(
        "check", help="exit 1 if an open lifecycle run is of a generation the next release no longer replays",
        description="Lists the open lifecycle runs by generation (Temporal's RELAY_TEMPORAL_* / TEMPORAL_*) and "
                    "exits 1 while any is older than the generation given (by default the oldest the next "
                    f"release replays: {NEXT_RELEASE_REPLAYS_FROM}). Run it with the release the workers run, "
                    "right before upgrading them.")
    check.add_argument("--replays-from", type=int, choices=range(NEWEST_GENERATION + 1),
                       default=NEXT_RELEASE_REPLAYS_FROM, metavar="GENERATION",
                       help=f"the oldest generation the target code replays (default {NEXT_RELEASE_REPLAYS_FROM}, "
                            "the next release's)")
    check.add_argument("-o", "--output", choices=["table", "json"], default="table")
    check.set_defaults(admin=_check)


def _check(args: argparse.Namespace, settings: Settings) -> None:
    from cli import patches_check  # Temporal's modules: loaded when the command runs, not by the parser

    patches_check.check(args.replays_from, args.output, settings)
