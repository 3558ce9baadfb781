"""Secrets from files (RELAY_DATABASE_URL_FILE, RELAY_API_KEY_FILE, RELAY_ALERT_WEBHOOK_SECRET_FILE: a mounted
Kubernetes or Docker secret), the settings' bounds, and a bad setting stopping `relay` with one line that names the
variable and shows no secret."""

from __future__ import annotations

import argparse
import os
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from cli import common
from core.settings import Settings
from tests.support import VENV_BIN, relay_env, starts_processes

SECRET = "dbos_s3cr3t-from-a-file-0123456789"
PAIRS = [("RELAY_DATABASE_URL", "database_url"), ("RELAY_API_KEY", "api_key"),
         ("RELAY_ALERT_WEBHOOK_SECRET", "alert_webhook_secret")]


@pytest.fixture(autouse=True)
def _no_relay_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only what each test sets: a RELAY_* variable of the shell running the tests must not decide them."""
    for name in [n for n in os.environ if n.startswith("RELAY_")]:
        monkeypatch.delenv(name)


def _value(settings: Settings, field: str) -> str | None:
    value = getattr(settings, field)
    return value if value is None or isinstance(value, str) else value.get_secret_value()


@pytest.mark.parametrize(("variable", "field"), PAIRS)
@pytest.mark.parametrize(("content", "read"), [
    (f"{SECRET}\n", SECRET),  # echo's, and most editors', trailing newline
    (f"{SECRET}\r\n", SECRET),
    (SECRET, SECRET),  # kubectl create secret --from-literal: none
    (f"{SECRET}\n\n", f"{SECRET}\n"),  # one newline stripped, not every one
    (f" {SECRET} ", f" {SECRET} "),  # nothing else
])
def test_a_secret_is_read_from_its_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, variable: str, field: str,
                                        content: str, read: str) -> None:
    path = tmp_path / "secret"
    path.write_text(content, newline="")
    monkeypatch.setenv(f"{variable}_FILE", str(path))
    assert _value(Settings(), field) == read


@pytest.mark.parametrize(("variable", "field"), PAIRS)
def test_without_a_file_the_variable_is_read_as_before(monkeypatch: pytest.MonkeyPatch, variable: str,
                                                       field: str) -> None:
    assert _value(Settings(), field) is None
    monkeypatch.setenv(variable, SECRET)
    assert _value(Settings(), field) == SECRET


@pytest.mark.parametrize(("variable", "field"), PAIRS)
def test_a_variable_and_its_file_both_set_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      variable: str, field: str) -> None:
    path = tmp_path / "secret"
    path.write_text(SECRET)
    monkeypatch.setenv(variable, "postgresql://relay:other-s3cret@db/relay")
    monkeypatch.setenv(f"{variable}_FILE", str(path))
    with pytest.raises(ValidationError) as refused:
        Settings()
    message = str(refused.value)
    assert f"{variable} and {variable}_FILE are both set: set only one" in message
    assert SECRET not in message and "other-s3cret" not in message


def test_a_file_that_cannot_be_read_is_named_without_its_content(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAY_API_KEY_FILE", str(tmp_path / "missing"))
    with pytest.raises(ValidationError, match=r"RELAY_API_KEY_FILE: cannot read .*missing: No such file"):
        Settings()
    (tmp_path / "empty").write_text("\n")
    monkeypatch.setenv("RELAY_API_KEY_FILE", str(tmp_path / "empty"))
    with pytest.raises(ValidationError, match=r"RELAY_API_KEY_FILE: .*empty is empty"):
        Settings()


def test_the_admin_cli_takes_its_key_from_the_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "key"
    path.write_text(SECRET + "\n")
    monkeypatch.setenv("RELAY_API_KEY_FILE", str(path))
    assert common.api_key(argparse.Namespace(), Settings()) == SECRET
    assert common.api_key(argparse.Namespace(api_key="dbos_flag"), Settings()) == "dbos_flag"  # the flag wins


@starts_processes
def test_relay_stops_with_one_line_naming_the_variables(tmp_path: Path) -> None:
    path = tmp_path / "url"
    path.write_text(f"sqlite:///{tmp_path / 'a.db'}\n")
    env = relay_env(tmp_path, RELAY_DATABASE_URL=f"sqlite:///{tmp_path / SECRET}.db", RELAY_DATABASE_URL_FILE=str(path))
    for command in (["migrate"], ["worker"]):
        done = subprocess.run([str(VENV_BIN / "relay"), *command], env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and done.stdout == "", done
        assert done.stderr == ("relay: RELAY_DATABASE_URL and RELAY_DATABASE_URL_FILE are both set: set only one\n")


@starts_processes
def test_relay_names_an_invalid_setting_in_one_line(tmp_path: Path) -> None:
    done = subprocess.run([str(VENV_BIN / "relay"), "migrate"], capture_output=True, text=True, timeout=60,
                          env=relay_env(tmp_path, RELAY_AUDIT_RETENTION_DAYS="3"))
    assert done.returncode == 1
    assert done.stderr == "relay: RELAY_AUDIT_RETENTION_DAYS: Input should be greater than or equal to 7\n"


@pytest.mark.parametrize(("days", "ok"), [("6", False), ("7", True), ("90", True), ("3650", True), ("3651", False)])
def test_audit_retention_days_as_upstream_allows(monkeypatch: pytest.MonkeyPatch, days: str, ok: bool) -> None:
    monkeypatch.setenv("RELAY_AUDIT_RETENTION_DAYS", days)
    if ok:
        assert Settings().audit_retention == timedelta(days=int(days))
    else:
        with pytest.raises(ValidationError, match="audit_retention_days"):
            Settings()


def test_defaults_need_nothing_set() -> None:
    settings = Settings()
    assert settings.audit_retention == timedelta(days=90)
    assert settings.migrate_on_start is True
    assert settings.api_key is None and settings.database_url is None


def test_migrate_on_start_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAY_MIGRATE_ON_START", "false")
    assert Settings().migrate_on_start is False
