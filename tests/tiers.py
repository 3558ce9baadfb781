"""`make test`'s pytest tiers: ``python -m tests.tiers``. By default one after the other: the tiers without real
processes, the e2e tests marked ``concurrent``, then the timed e2e tests. With ``RELAY_TEST_TIERS=beside`` (an
experiment, not yet reliable: see ``BESIDE``), the concurrent tier runs beside the timed one, as below.

First the tiers without real processes, alone, over every core (``-n auto``). Then the e2e tests that measure time,
one at a time, in the foreground: they leave most of the machine idle (they wait on grace timers, restarts and
timeouts; about 40 % of two cores, measured). Beside them, in a CPU cgroup of low weight (an eighth of any other
session's), the e2e tests marked ``concurrent`` (they assert no timing), two at a time: they take what the timed
tests leave, and where both want a core the timed tests get eight parts in nine or more.

A low weight, not an idle group (``cpu.idle``): idle, the concurrent tests' processes were starved for whole seconds
whenever the timed tier was busiest, and a Relay starved that long is rightly seen as away (a grace extended for a
late gateway heartbeat, a peer's socket dropped for a late pong): two database-outage tests failed so. For the same
reason the tiers without real processes never run beside the timed tier: two workers of theirs keep both cores busy,
and in the background they missed their own wall-clock bounds (the time-skipping server's RPC timeouts).

The group needs a cgroup ``cpu`` controller this process may write (root, or a delegated subtree); where there is
none, the e2e tiers run one after the other instead, as they did before. The concurrent tier's output is kept in a
file and printed after the timed tier's; the exit status is non-zero if any tier failed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

PYTEST = [sys.executable, "-m", "pytest", "-q"]
FAST = [*PYTEST, "-m", "not e2e", "-n", "auto", "tests/unit", "tests/workflows", "tests/api"]
CONCURRENT = [*PYTEST, "-m", "e2e and concurrent", "-n", "2", "--dist", "loadfile", "--durations=10"]
TIMED = [*PYTEST, "-m", "e2e and not concurrent", "--durations=25"]
# Opt-in (RELAY_TEST_TIERS=beside): in one of two clean-clone runs so, the concurrent tier failed even at a low
# weight (a one-second bound in test_rest, a `relay dev` slower to stop than its test allows). Off, the tiers run one
# after the other, as `make test` always did.
BESIDE = os.environ.get("RELAY_TEST_TIERS") == "beside"
# Where a cpu controller may be mounted: cgroup v1's own hierarchy, or the unified one (v2).
CPU_HIERARCHIES = (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup"))
# The background group's weight, an eighth of the default: v1's cpu.shares (default 1024), v2's cpu.weight (100).
WEIGHTS = {"cpu.shares": "128", "cpu.weight": "12"}


@contextlib.contextmanager
def background_cgroup() -> Iterator[Path | None]:
    """A new cgroup of low CPU weight, removed after the block; None where this process cannot make one."""
    group = None
    for root in CPU_HIERARCHIES:
        if not (root / "cgroup.procs").exists():  # not a cgroup file system (a tmpfs holding the v1 mounts)
            continue
        candidate = root / f"relay-tests-{os.getpid()}"
        try:
            candidate.mkdir()
        except OSError:
            continue
        if _weigh(candidate):
            group = candidate
            break
        candidate.rmdir()
    try:
        yield group
    finally:
        if group is not None:
            _remove(group)


def _weigh(group: Path) -> bool:
    """Give ``group`` its low weight, in whichever file the kernel made for it where the cpu controller is on; never
    create one ourselves (it would be a plain file)."""
    for name, weight in WEIGHTS.items():
        try:
            control = os.open(group / name, os.O_WRONLY | os.O_TRUNC)  # no O_CREAT: only a file the kernel made
        except OSError:
            continue
        try:
            os.write(control, f"{weight}\n".encode())
            return True
        except OSError:
            continue
        finally:
            os.close(control)
    return False


def _remove(group: Path) -> None:
    """rmdir the group once its last task has gone (a killed process may take a moment to be reaped)."""
    for _ in range(50):
        try:
            group.rmdir()
            return
        except OSError:
            time.sleep(0.1)
    print(f"tests.tiers: could not remove {group}: tasks are left in it", file=sys.stderr)


def _in_group(group: Path, argv: list[str]) -> list[str]:
    """``argv`` run by a shell that first moves itself into ``group``: pytest, and every process a test starts,
    inherit it."""
    return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(group), *argv]


def _announce(argv: list[str]) -> None:
    print(f"$ {' '.join(argv[2:])}", flush=True)


def _one_after_another() -> tuple[int, int]:
    """The concurrent e2e tier, then the timed one; their exit statuses."""
    _announce(CONCURRENT)
    concurrent = subprocess.call(CONCURRENT)
    _announce(TIMED)
    return concurrent, subprocess.call(TIMED)


def _beside(group: Path) -> tuple[int, int]:
    """The concurrent e2e tier in ``group``, beside the timed one; its output printed after the timed tier's; their
    exit statuses."""
    print(f"tests.tiers: the concurrent e2e tier runs beside the timed one, in the low-weight cgroup {group}; its "
          "output follows the timed tier's", flush=True)
    with tempfile.TemporaryFile() as log:
        beside = subprocess.Popen(_in_group(group, CONCURRENT), stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL)
        try:
            _announce(TIMED)
            timed = subprocess.call(TIMED)
            concurrent = beside.wait()
        finally:
            if beside.poll() is None:  # interrupted: pytest stops what its tests started
                beside.send_signal(signal.SIGINT)
                beside.wait()
        log.seek(0)
        _announce(CONCURRENT)
        sys.stdout.buffer.write(log.read())
    return concurrent, timed


def main() -> int:
    """Every tier, each run even when one before it failed; non-zero if any failed."""
    _announce(FAST)
    fast = subprocess.call(FAST)
    with background_cgroup() if BESIDE else contextlib.nullcontext() as group:
        if group is not None:
            concurrent, timed = _beside(group)
        else:
            if BESIDE:
                print("tests.tiers: no CPU cgroup can be made here; the e2e tiers run one after the other", flush=True)
            concurrent, timed = _one_after_another()
    print(f"tests.tiers: exit statuses: not e2e {fast}, e2e concurrent {concurrent}, e2e timed {timed}", flush=True)
    return 1 if fast or concurrent or timed else 0


if __name__ == "__main__":
    sys.exit(main())
