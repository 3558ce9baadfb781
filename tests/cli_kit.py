"""What the command line's unit tests share: ``relay``'s parser, built once per process.

Building it (every subcommand, argparse's gettext look-ups) takes tens of milliseconds, and the CLI's tests parse
a command line each; parsing leaves the parser as it was, so one serves them all.
"""

from __future__ import annotations

import argparse
import functools

from cli import main


@functools.cache
def parser() -> argparse.ArgumentParser:
    return main.parser()
