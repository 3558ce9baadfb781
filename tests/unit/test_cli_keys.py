"""``relay keys create|list|revoke`` with no API key, on the local database: a database that is not there is
never created unless ``--init`` asks for it (run outside the checkout, ``keys create`` once silently made a
new ``.relay/relay.db`` whose key no Relay knew), and ``keys create`` says which database it wrote to."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from cli import admin
from cli.main import main
from core.settings import Settings
from tests.cli_kit import parser

Run = Callable[..., tuple[str, str]]


@pytest.fixture
def elsewhere(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A directory with no Relay in it, as the working directory; no RELAY_* setting and no key."""
    for name in ("RELAY_DATA_DIR", "RELAY_DATABASE_URL", "RELAY_API_KEY", "RELAY_API_KEY_FILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _create(*argv: str) -> None:
    admin.keys_create_local(parser().parse_args(["keys", "create", *argv]), Settings())


def test_keys_create_refuses_to_make_a_new_database(elsewhere: Path) -> None:
    with pytest.raises(SystemExit) as refused:
        _create("--name", "ci")
    message = str(refused.value.code)
    assert f"no Relay database at {elsewhere / '.relay' / 'relay.db'}, so nothing was done" in message
    assert "--init" in message and "RELAY_DATA_DIR" in message
    assert list(elsewhere.iterdir()) == []  # not even the data dir


def test_keys_create_init_makes_the_database_and_says_where(elsewhere: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    _create("--name", "ci", "--init")
    out, err = capsys.readouterr()
    db = elsewhere / ".relay" / "relay.db"
    assert out.startswith("dbos_") and len(out.splitlines()) == 1
    assert err == f"relay: key 'ci' of org 'local' written to the database at {db}\n"
    _create("--name", "second")  # it exists now: no --init needed
    out, err = capsys.readouterr()
    assert out.startswith("dbos_") and str(db) in err


def test_keys_list_and_revoke_refuse_a_database_that_is_not_there(elsewhere: Path) -> None:
    for argv in (["keys", "list"], ["keys", "revoke", "ci"]):
        with pytest.raises(SystemExit) as refused:
            admin.run(parser().parse_args(argv), Settings())
        assert "no Relay database at" in str(refused.value.code)
    assert list(elsewhere.iterdir()) == []


def test_relay_keys_create_outside_the_checkout_creates_nothing(elsewhere: Path) -> None:
    """The command itself, as `relay keys create` runs it (``cli.main``)."""
    with pytest.raises(SystemExit) as refused:
        main(["keys", "create"])
    assert "no Relay database at" in str(refused.value.code)
    assert list(elsewhere.iterdir()) == []
