"""`make test`'s type check and pytest tiers, after ruff: ``python -m tests.tiers``. By default mypy runs beside
the tiers without real processes (over every core, ``-n auto``), in a CPU cgroup of low weight (an eighth of any other
session's); then the e2e tests that measure time, one at a time, and beside them, in the group, the e2e tests marked
``concurrent`` (they assert no timing), two at a time. With ``RELAY_TEST_TIERS=apart`` the concurrent tier runs
before the timed one instead (see ``LAYOUT``).

Neither foreground run keeps the machine busy: the timed e2e tests wait on grace timers, restarts and timeouts (about
40 % of two cores, measured), and the fast tiers on the time-skipping server (about 65 %). The background takes what
they leave, and where both want a core the foreground gets eight parts in nine or more. The timed tier's bounds are
its own; a test whose bound or race the background could break is not marked ``concurrent`` (five clean-clone runs
of this layout each found one, now mended: a one-second revocation, an operator's query held 4.5 s, a flooded
gateway's 0.5 s header timeout, a restarted gateway's watch, a refused TLS handshake's retry).

A low weight, not an idle group (``cpu.idle``): idle, the concurrent tests' processes were starved for whole seconds
whenever the timed tier was busiest, and a Relay starved that long is rightly seen as away (a grace extended for a
late gateway heartbeat, a peer's socket dropped for a late pong): two database-outage tests failed so. For the same
reason the tiers without real processes never run in the background: there they missed their own wall-clock bounds
(the time-skipping server's RPC timeouts). And a test that bounds a time is not marked ``concurrent``.

The group needs a cgroup ``cpu`` controller this process may write (root, or a delegated subtree); where there is
none, or with ``RELAY_TEST_TIERS=sequential``, everything runs one after the other instead: mypy, the fast tiers,
the concurrent tier, the timed one. A background run's output is kept in a file and printed after its foreground's;
the exit status is non-zero if anything failed.
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
MYPY = [sys.executable, "-m", "mypy", "."]
# worksteal: an idle worker takes tests queued on the other. With xdist's default (load) the last 40 tests, the slow
# API fuzz cases, were all queued on one worker while the other sat idle: 194 s, against 164 s so (same machine).
FAST = [*PYTEST, "-m", "not e2e", "-n", "auto", "--dist", "worksteal", "tests/unit", "tests/workflows", "tests/api"]
CONCURRENT = [*PYTEST, "-m", "e2e and concurrent", "-n", "2", "--dist", "loadfile", "--durations=10"]
TIMED = [*PYTEST, "-m", "e2e and not concurrent", "--durations=25"]
# RELAY_TEST_TIERS: unset, mypy runs beside the fast tiers and the concurrent e2e tier beside the timed one; `apart`,
# the e2e tiers one after the other (mypy still beside the fast tiers); `sequential`, everything one after the
# other, as `make test` ran before tests/tiers.py.
LAYOUT = os.environ.get("RELAY_TEST_TIERS", "")
BESIDE = LAYOUT != "sequential"
E2E_BESIDE = LAYOUT not in ("sequential", "apart")
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


def _one_after_another(*tiers: list[str]) -> list[int]:
    """Each tier in turn; their exit statuses."""
    codes = []
    for argv in tiers:
        _announce(argv)
        codes.append(subprocess.call(argv))
    return codes


def _beside(group: Path, foreground: list[str], background: list[str]) -> tuple[int, int]:
    """``background`` in ``group``, beside ``foreground``; its output printed after the foreground's; their exit
    statuses (background, foreground)."""
    print(f"tests.tiers: `{' '.join(background[2:])}` runs beside `{' '.join(foreground[2:])}`, in the low-weight "
          f"cgroup {group}; its output follows", flush=True)
    with tempfile.TemporaryFile() as log:
        beside = subprocess.Popen(_in_group(group, background), stdout=log, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL)
        try:
            _announce(foreground)
            front = subprocess.call(foreground)
            behind = beside.wait()
        finally:
            if beside.poll() is None:  # interrupted: pytest stops what its tests started
                beside.send_signal(signal.SIGINT)
                beside.wait()
        log.seek(0)
        _announce(background)
        sys.stdout.buffer.write(log.read())
    return behind, front


def main() -> int:
    """Every tier, each run even when one before it failed; non-zero if any failed."""
    with background_cgroup() if BESIDE else contextlib.nullcontext() as group:
        if group is not None:
            types, fast = _beside(group, FAST, MYPY)
            if E2E_BESIDE:
                concurrent, timed = _beside(group, TIMED, CONCURRENT)
            else:
                concurrent, timed = _one_after_another(CONCURRENT, TIMED)
        else:
            if BESIDE:
                print("tests.tiers: no CPU cgroup can be made here; the tiers run one after the other", flush=True)
            types, fast, concurrent, timed = _one_after_another(MYPY, FAST, CONCURRENT, TIMED)
    print(f"tests.tiers: exit statuses: mypy {types}, not e2e {fast}, e2e concurrent {concurrent}, e2e timed {timed}",
          flush=True)
    return 1 if types or fast or concurrent or timed else 0


if __name__ == "__main__":
    sys.exit(main())
