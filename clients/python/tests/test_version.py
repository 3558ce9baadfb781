"""The dbos version check: the supported range is accepted, anything else refused at import, in one line."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

import relay_dbos
from relay_dbos import check_dbos_version
from tests.support import CLIENT_DIR


@pytest.mark.parametrize("found", ["3.3.0", "3.3.5", "3.4.0", "3.4.0.post1", "3.3", "3.4.12"])
def test_supported_versions_are_accepted(found: str) -> None:
    check_dbos_version(found)


@pytest.mark.parametrize("found", ["3.2.0", "3.2.99", "3.5.0", "4.0.0", "2.9.0", "3.4.0rc1", "3.3.0a1",
                                   "3.4.0.dev1", "3.4.0+local", "garbage", "", " 3.4.0", "3.4.0\n", "3"])
def test_other_versions_are_refused_in_one_line(found: str) -> None:
    with pytest.raises(ImportError) as raised:
        check_dbos_version(found)
    message = str(raised.value)
    assert message == f"relay-dbos {relay_dbos.__version__} supports dbos>=3.3,<3.5; dbos {found} is installed"
    if "\n" not in found:
        assert "\n" not in message


def _import_with_installed(dbos_version: str | None) -> subprocess.CompletedProcess[str]:
    """``import relay_dbos`` (this checkout's) in a child of this venv's Python, with ``importlib.metadata.version``
    telling ``dbos_version`` for dbos (None: not installed)."""
    script = textwrap.dedent(f"""
        import importlib.metadata, sys
        sys.path.insert(0, {str(CLIENT_DIR)!r})
        real = importlib.metadata.version
        def fake(name):
            if name == "dbos":
                if {dbos_version!r} is None:
                    raise importlib.metadata.PackageNotFoundError(name)
                return {dbos_version!r}
            return real(name)
        importlib.metadata.version = fake
        import relay_dbos
        print(relay_dbos.__file__)
    """)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                          cwd=CLIENT_DIR.parent, check=False)


@pytest.mark.parametrize("installed", ["3.2.0", "3.5.0"])
def test_import_is_refused_when_the_installed_dbos_is_not_supported(installed: str) -> None:
    child = _import_with_installed(installed)
    assert child.returncode == 1, child.stderr
    assert child.stdout == ""
    assert child.stderr.strip().splitlines()[-1] == (
        f"ImportError: relay-dbos {relay_dbos.__version__} supports dbos>=3.3,<3.5; dbos {installed} is installed")


def test_import_is_refused_when_dbos_is_not_installed() -> None:
    child = _import_with_installed(None)
    assert child.returncode == 1, child.stderr
    assert child.stderr.strip().splitlines()[-1] == (
        f"ImportError: relay-dbos {relay_dbos.__version__} supports dbos>=3.3,<3.5; dbos is not installed")


def test_import_succeeds_with_a_supported_dbos() -> None:
    """The control of the two above: the same child, told a supported version, imports this checkout's client."""
    child = _import_with_installed("3.4.0")
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == str(CLIENT_DIR / "relay_dbos" / "__init__.py")
