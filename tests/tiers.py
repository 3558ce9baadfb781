"""`make test`'s pytest tiers, run so that both cores stay busy without the timed tests being measured against the
others: ``python -m tests.tiers``.

First the tiers without real processes, alone, over every core (``-n auto``). Then the e2e tests that measure time,
one at a time, in the foreground: they leave most of the machine idle (they wait on grace timers, restarts and
timeouts; about 40 % of two cores, measured). Beside them, in a CPU cgroup marked idle, the e2e tests marked
``concurrent`` (they assert no timing), two at a time. A task in an idle cgroup runs only on CPU time no other task
wants (``cpu.idle``, Linux ≥ 5.15), so the timed tests keep the machine almost as if they ran alone.

The tiers without real processes do not go in the idle group: two of their workers keep both cores busy, and
starved for as long as the timed tier's busiest moments they miss their own wall-clock bounds (the time-skipping
server's RPC timeouts, "no result within 6 s": three gate workflow tests failed so). The idle group needs a cgroup
``cpu`` controller this process may write (root, or a delegated subtree); where there is none, the e2e tiers run one
after the other instead, as they did before.

The concurrent tier's output is kept in a file and printed after the timed tier's; the exit status is non-zero if
any tier failed.
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
# Where a cpu controller may be mounted: cgroup v1's own hierarchy, or the unified one (v2).
CPU_HIERARCHIES = (Path("/sys/fs/cgroup/cpu"), Path("/sys/fs/cgroup"))


@contextlib.contextmanager
def idle_cgroup() -> Iterator[Path | None]:
    """A new cgroup whose tasks run only on CPU time nothing else wants, removed after the block; None where this
    process cannot make one."""
    group = None
    for root in CPU_HIERARCHIES:
        if not (root / "cgroup.procs").exists():  # not a cgroup file system (a tmpfs holding the v1 mounts)
            continue
        candidate = root / f"relay-tests-{os.getpid()}"
        try:
            candidate.mkdir()
        except OSError:
            continue
        try:  # the kernel makes cpu.idle in a new group where the cpu controller is on; never create it ourselves
            with open(candidate / "cpu.idle", "r+") as idle:
                idle.write("1\n")
        except OSError:
            candidate.rmdir()
            continue
        group = candidate
        break
    try:
        yield group
    finally:
        if group is not None:
            _remove(group)


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


def main() -> int:
    _announce(FAST)
    fast = subprocess.call(FAST)
    with idle_cgroup() as group:
        if group is None:
            print("tests.tiers: no idle CPU cgroup can be made here; the e2e tiers run one after the other", flush=True)
            _announce(CONCURRENT)
            concurrent = subprocess.call(CONCURRENT)
            _announce(TIMED)
            timed = subprocess.call(TIMED)
        else:
            with tempfile.TemporaryDirectory(prefix="relay-tiers-") as tmp, open(Path(tmp) / "log", "w+b") as log:
                print(f"tests.tiers: the concurrent e2e tier runs beside the timed one, in the idle cgroup {group}; "
                      "its output follows the timed tier's", flush=True)
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
    print(f"tests.tiers: exit statuses: not e2e {fast}, e2e concurrent {concurrent}, e2e timed {timed}", flush=True)
    return 1 if fast or concurrent or timed else 0


if __name__ == "__main__":
    sys.exit(main())
