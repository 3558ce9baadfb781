"""``core.logs.configure``: text or JSON lines on stderr, context fields carried, keys scrubbed everywhere."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from collections.abc import Iterator

import pytest

from core.logs import JsonLines, configure, install_redaction
from tests.support import VENV_BIN, starts_processes

FAKE_KEY = "dbos_" + "k" * 24  # built, so no literal key sits in the source


@pytest.fixture
def restore_root() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def _record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    record = logging.LogRecord("relay.worker", logging.INFO, __file__, 1, message, args, None)
    record.__dict__.update(extra)
    return record


def test_a_json_line_has_the_message_and_the_context_the_record_carries() -> None:
    line = json.loads(JsonLines().format(_record("executor %s is DEAD", "e-1", org="acme", app="orders",
                                                 executor_id="e-1", workflow_id="relay-executor-x")))
    assert line["message"] == "executor e-1 is DEAD"
    assert (line["level"], line["logger"]) == ("INFO", "relay.worker")
    assert {k: line[k] for k in ("org", "app", "executor_id", "workflow_id")} == {
        "org": "acme", "app": "orders", "executor_id": "e-1", "workflow_id": "relay-executor-x"}
    assert "request_id" not in line
    assert line["time"].endswith("+00:00")


def test_a_key_is_scrubbed_from_every_part_of_a_json_line() -> None:
    try:
        raise RuntimeError(f"GET /websocket/orders/{FAKE_KEY}")
    except RuntimeError:
        record = _record("connect from %s", f"/websocket/orders/{FAKE_KEY}", request_id=FAKE_KEY)
        record.exc_info = sys.exc_info()
    text = JsonLines().format(record)
    assert FAKE_KEY not in text
    line = json.loads(text)
    assert "<redacted>" in line["message"] and "<redacted>" in line["exc"] and "<redacted>" in line["request_id"]


def test_configure_json_puts_one_object_per_line_on_the_root_handler(restore_root: None,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    configure(level="INFO", style="json")
    install_redaction()
    logging.getLogger("relay.test").info("hello %s", FAKE_KEY, extra={"app": "a1"})
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [(line["message"], line["app"]) for line in lines] == [("hello dbos_<redacted>", "a1")]


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="text or json"):
        configure(style="xml")


@starts_processes
def test_the_cli_says_what_is_wrong_with_the_format_without_a_traceback() -> None:
    done = subprocess.run([str(VENV_BIN / "relay"), "keys", "list"], env={"RELAY_LOG_FORMAT": "xml", "PATH": ""},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "RELAY_LOG_FORMAT must be text or json" in done.stderr and "Traceback" not in done.stderr
