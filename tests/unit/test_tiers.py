"""`make test`'s tier runner (tests/tiers.py): every test in exactly one tier, and an idle cgroup only where the
kernel made one."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import tiers


def _marks(argv: list[str]) -> str:
    return argv[argv.index("-m", 3) + 1]  # after `python -m pytest`


def test_the_tiers_split_every_test_once() -> None:
    """The fast tier takes what is not e2e (tests/unit, workflows, api), the concurrent one the e2e tests marked
    concurrent, the timed one the other e2e tests: as the three commands `make test` ran before."""
    assert _marks(tiers.FAST) == "not e2e" and tiers.FAST[-3:] == ["tests/unit", "tests/workflows", "tests/api"]
    assert _marks(tiers.CONCURRENT) == "e2e and concurrent" and "--dist" in tiers.CONCURRENT
    assert _marks(tiers.TIMED) == "e2e and not concurrent" and "-n" not in tiers.TIMED


def test_no_idle_group_where_no_cgroup_file_system_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain directory (as the tmpfs that holds cgroup v1's mounts) is not a cgroup: nothing is made in it."""
    monkeypatch.setattr(tiers, "CPU_HIERARCHIES", (tmp_path,))
    with tiers.idle_cgroup() as group:
        assert group is None
    assert list(tmp_path.iterdir()) == []


def test_no_idle_group_where_the_kernel_made_no_cpu_idle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hierarchy without the cpu controller: the new group has no cpu.idle, so none is written (it would be a
    plain file) and the group is removed again."""
    (tmp_path / "cgroup.procs").touch()
    monkeypatch.setattr(tiers, "CPU_HIERARCHIES", (tmp_path,))
    with tiers.idle_cgroup() as group:
        assert group is None
    assert [p.name for p in tmp_path.iterdir()] == ["cgroup.procs"]


def test_an_idle_group_is_marked_idle_and_removed_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the kernel makes cpu.idle in a new group, it is set to 1; the group goes when the block ends."""
    (tmp_path / "cgroup.procs").touch()
    monkeypatch.setattr(tiers, "CPU_HIERARCHIES", (tmp_path,))
    real_mkdir = Path.mkdir

    def kernel_mkdir(self: Path, *args: object, **kwargs: object) -> None:  # as cgroupfs: the control files appear
        real_mkdir(self)
        (self / "cpu.idle").write_text("0\n")

    monkeypatch.setattr(Path, "mkdir", kernel_mkdir)
    monkeypatch.setattr(tiers, "_remove", lambda group: [p.unlink() for p in group.iterdir()] and group.rmdir())
    with tiers.idle_cgroup() as group:
        assert group is not None and group.parent == tmp_path
        assert (group / "cpu.idle").read_text() == "1\n"
    assert [p.name for p in tmp_path.iterdir()] == ["cgroup.procs"]
