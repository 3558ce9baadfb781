"""`make test`'s pytest tiers, run so that both cores stay busy without the timed tests being measured against the
others: ``python -m tests.tiers``.

The e2e tests that measure time run one at a time, in the foreground; they leave most of a core idle (they wait on
grace timers, restarts, timeouts). Beside them, in a CPU cgroup marked idle, the tiers that measure no time run one
after the other: the tiers without real processes (``-n auto``), then the e2e tests marked ``concurrent`` (two at a
time). A task in an idle cgroup runs only on CPU time no other task wants (``cpu.idle``, Linux ≥ 5.15), so the timed
tests get the machine as if they ran alone. The idle group needs a cgroup ``cpu`` controller this process may write
(root, or a delegated subtree); where there is none, the tiers run one after another instead, as they did before.

The background tiers' output is kept in a file and printed once both are done; the exit status is non-zero if any
tier failed.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

PYTEST = [sys.executable, "-m", "pytest", "-q"]
UNTIMED = [
    [*PYTEST, "-m", "not e2e", "-n", "auto", "tests/unit", "tests/workflows", "tests/api"],
    [*PYTEST, "-m", "e2e and concurrent", "-n", "2", "--dist", "loadfile", "--durations=10"],
]
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


def _run_untimed(group: Path, log: Path, status: list[int]) -> None:
    """The untimed tiers, one after the other, in ``group``; their output goes to ``log``, their exit statuses to
    ``status``."""
    with open(log, "ab") as out:
        for argv in UNTIMED:
            out.write(f"$ {' '.join(argv[2:])}\n".encode())
            out.flush()
            status.append(subprocess.call(_in_group(group, argv), stdout=out, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL))


def _announce(argv: list[str]) -> None:
    print(f"$ {' '.join(argv[2:])}", flush=True)


def main() -> int:
    with idle_cgroup() as group:
        if group is None:
            print("tests.tiers: no idle CPU cgroup can be made here; the tiers run one after another", flush=True)
            failed = False
            for argv in (*UNTIMED, TIMED):
                _announce(argv)
                failed |= subprocess.call(argv) != 0
            return 1 if failed else 0

        with tempfile.TemporaryDirectory(prefix="relay-tiers-") as tmp:
            log = Path(tmp) / "untimed.log"
            print(f"tests.tiers: the untimed tiers run beside the timed one, in the idle cgroup {group}; their "
                  "output follows the timed tier's", flush=True)
            untimed: list[int] = []
            beside = threading.Thread(target=_run_untimed, args=(group, log, untimed), daemon=True)
            beside.start()
            _announce(TIMED)
            timed = subprocess.call(TIMED)
            beside.join()
            sys.stdout.write(log.read_text(errors="replace"))
        print(f"tests.tiers: exit statuses: timed tier {timed}, untimed tiers {untimed}", flush=True)
        return 1 if timed or any(untimed) else 0


if __name__ == "__main__":
    sys.exit(main())
