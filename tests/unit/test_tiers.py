"""`make test`'s tier runner (tests/tiers.py): every test in exactly one tier, and a low-weight cgroup only
where the kernel made one."""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import tiers
from tests.support import starts_processes


def _marks(argv: list[str]) -> str:
    return argv[argv.index("-m", 3) + 1]  # after `python -m pytest`


def test_the_tiers_split_every_test_once() -> None:
    """The fast tier takes what is not e2e (tests/unit, workflows, api), the concurrent one the e2e tests marked
    concurrent, the timed one the other e2e tests: as the three commands `make test` ran before."""
    assert _marks(tiers.FAST) == "not e2e" and tiers.FAST[-3:] == ["tests/unit", "tests/workflows", "tests/api"]
    assert _marks(tiers.CONCURRENT) == "e2e and concurrent" and "--dist" in tiers.CONCURRENT
    assert _marks(tiers.TIMED) == "e2e and not concurrent" and "-n" not in tiers.TIMED


def test_no_group_where_no_cgroup_file_system_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A plain directory (as the tmpfs that holds cgroup v1's mounts) is not a cgroup: nothing is made in it."""
    monkeypatch.setattr(tiers, "CPU_HIERARCHIES", (tmp_path,))
    with tiers.background_cgroup() as group:
        assert group is None
    assert list(tmp_path.iterdir()) == []


def test_no_group_where_the_kernel_made_no_weight(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hierarchy without the cpu controller: the new group has no weight file, so none is written (it would be a
    plain file) and the group is removed again."""
    (tmp_path / "cgroup.procs").touch()
    monkeypatch.setattr(tiers, "CPU_HIERARCHIES", (tmp_path,))
    with tiers.background_cgroup() as group:
        assert group is None
    assert [p.name for p in tmp_path.iterdir()] == ["cgroup.procs"]


@pytest.mark.parametrize(("control", "weight"), [("cpu.shares", "128"), ("cpu.weight", "12")])
def test_a_group_gets_an_eighth_of_the_weight_and_goes_after(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             control: str, weight: str) -> None:
    """Where the kernel makes v1's cpu.shares or v2's cpu.weight in a new group, it is set to an eighth of its
    default; the group goes when the block ends."""
    (tmp_path / "cgroup.procs").touch()
    monkeypatch.setattr(tiers, "CPU_HIERARCHIES", (tmp_path,))
    real_mkdir = Path.mkdir

    def kernel_mkdir(self: Path, *args: object, **kwargs: object) -> None:  # as cgroupfs: the control file appears
        real_mkdir(self)
        (self / control).write_text("default\n")

    monkeypatch.setattr(Path, "mkdir", kernel_mkdir)
    monkeypatch.setattr(tiers, "_remove", lambda group: [p.unlink() for p in group.iterdir()] and group.rmdir())
    with tiers.background_cgroup() as group:
        assert group is not None and group.parent == tmp_path
        assert (group / control).read_text() == f"{weight}\n"
        assert [p.name for p in group.iterdir()] == [control]  # the other weight file was not made
    assert [p.name for p in tmp_path.iterdir()] == ["cgroup.procs"]


def _tier(name: str, code: int) -> list[str]:
    """A stand-in tier: ``python -c`` printing its name, exiting ``code`` (``argv[2:]`` is what is announced)."""
    return [sys.executable, "-c", f"print('ran {name}'); raise SystemExit({code})"]


@starts_processes
@pytest.mark.parametrize("layout", ["sequential", "apart", "default"])
def test_every_tier_runs_and_any_failure_fails_the_run(layout: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capfd: pytest.CaptureFixture[str]) -> None:
    """A failing tier does not stop the others; the run fails. By default mypy runs in the group (a plain directory
    stands in for the cgroup: the shell writes its pid into its cgroup.procs), its output after the fast tier's, and
    the concurrent tier too, its output after the timed tier's; apart, the concurrent tier runs before the timed."""
    monkeypatch.setattr(tiers, "MYPY", _tier("mypy", 0))
    monkeypatch.setattr(tiers, "FAST", _tier("fast", 1))
    monkeypatch.setattr(tiers, "CONCURRENT", _tier("concurrent", 0))
    monkeypatch.setattr(tiers, "TIMED", _tier("timed", 0))
    monkeypatch.setattr(tiers, "BESIDE", layout != "sequential")
    monkeypatch.setattr(tiers, "E2E_BESIDE", layout == "default")

    @contextlib.contextmanager
    def fake_group() -> Iterator[Path]:
        yield tmp_path

    monkeypatch.setattr(tiers, "background_cgroup", fake_group)
    assert tiers.main() == 1
    out = capfd.readouterr().out
    ran = [line for line in out.splitlines() if line.startswith("ran ")]
    assert ran == {"sequential": ["ran mypy", "ran fast", "ran concurrent", "ran timed"],
                   "apart": ["ran fast", "ran mypy", "ran concurrent", "ran timed"],
                   "default": ["ran fast", "ran mypy", "ran timed", "ran concurrent"]}[layout]
    assert "exit statuses: mypy 0, not e2e 1, e2e concurrent 0, e2e timed 0" in out
    assert (tmp_path / "cgroup.procs").exists() == (layout != "sequential")

    monkeypatch.setattr(tiers, "FAST", _tier("fast", 0))
    assert tiers.main() == 0
    monkeypatch.setattr(tiers, "MYPY", _tier("mypy", 1))  # a type error fails the run too
    assert tiers.main() == 1


@pytest.mark.parametrize(("setting", "beside", "e2e_beside"), [
    ("", True, True), ("apart", True, False), ("sequential", False, False)])
def test_the_layout_is_read_from_relay_test_tiers(setting: str, beside: bool, e2e_beside: bool,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAY_TEST_TIERS", setting)
    try:
        reloaded = importlib.reload(tiers)
        assert reloaded.BESIDE is beside and reloaded.E2E_BESIDE is e2e_beside
    finally:
        monkeypatch.undo()  # the environment as it was, and the module read from it again
        importlib.reload(tiers)
