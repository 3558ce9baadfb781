"""What the admin CLI prints and sends, without a server: the audit table and ``--follow`` lines (aligned columns,
times with their zone, details summarised; ``-o json`` whole), ``apps register`` on an app that exists, and the
duration flags' help. The REST API is a ``httpx.MockTransport`` that records each request."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from cli import admin, common, tables
from core.settings import Settings
from tests.cli_kit import parser

SYSTEM = {"type": "system", "id": "system", "display": "Relay"}
TERMINAL_WIDTH = tables.terminal_width


@pytest.fixture(autouse=True)
def no_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """What is printed does not depend on the terminal the tests run in: none, unless a test gives a width."""
    monkeypatch.setattr(tables, "terminal_width", lambda: None)


def _entry(operation: str, *, when: str = "2026-11-30T12:00:00.123000Z", target: str = "orders",
           details: dict[str, Any] | None = None, subject: dict[str, str] = SYSTEM) -> dict[str, Any]:
    return {"id": operation + when, "emitTime": when, "operation": operation, "status": "success",
            "subject": subject, "target": {"type": "application", "id": target}, "sourceIp": "",
            "details": details}


ENTRIES = [  # as the API lists them: newest first
    _entry("executor.recovery.dispatched", when="2026-11-30T14:00:01.5+02:00", target="a-thirty-character-app-name-x",
           details={"candidate": "ex-2", "attempt": 1, "request_id": "r-1", "executorId": "ex-1"}),
    _entry("app.updated", details={"executorTimeoutSecs": 5},
           subject={"type": "api_key", "id": "k1", "display": "ci"}),
]


def _columns(header: str) -> list[int]:
    return [header.index(name) for name in tables._AUDIT_HEADERS]


def _assert_aligned(lines: list[str]) -> None:
    """Every row has a cell starting at each column of the header, after at least two spaces."""
    starts = _columns(lines[0])
    for line in lines[1:]:
        for start in starts[1:]:
            assert line[start - 2:start] == "  " and line[start] != " ", (start, line)


def test_audit_table_columns_are_aligned_and_oldest_first() -> None:
    lines = tables.audit_table(ENTRIES).splitlines()
    _assert_aligned(lines)
    assert [line.split()[2] for line in lines[1:]] == ["app.updated", "executor.recovery.dispatched"]


def test_audit_times_are_utc_with_their_zone() -> None:
    lines = tables.audit_table(ENTRIES).splitlines()
    assert lines[1].startswith("2026-11-30 12:00:00.123Z  ")
    assert lines[2].startswith("2026-11-30 12:00:01.500Z  ")  # +02:00 in the API's answer, shown in UTC


def test_audit_details_are_summarised() -> None:
    summary = tables.summarize({"candidate": "ex-2", "reason": "pending workflows remain", "executorId": "ex-1",
                                "body": {"gc_cutoff_epoch_ms": 1}, "executors": ["a", "b"], "empty": ""})
    assert summary == ('executorId=ex-1 candidate=ex-2 reason="pending workflows remain" body={…} executors=a,b '
                       'empty=""')
    long = tables.summarize({"reason": "x" * 500})
    assert len(long) == tables.DETAILS_WIDTH and long.endswith("…")
    assert tables.summarize(None) == tables.summarize({}) == "-"


def test_follow_lines_keep_fixed_columns() -> None:
    long_subject = {"type": "api_key", "id": "k2", "display": "a-key-with-a-rather-long-name"}
    lines = [tables.audit_line(None), *(tables.audit_line(e) for e in ENTRIES[::-1]),
             tables.audit_line(_entry("token.created", subject=long_subject, target="ci"))]
    _assert_aligned(lines)
    assert "a-key-with-a-ra…" in lines[3]


# -- through the commands, against a recorded REST API ----------------------------------------------------------------


class FakeApi:
    """Answers like Relay's REST API for the requests the commands send, and records them."""

    def __init__(self, apps: set[str], audit: list[dict[str, Any]] | None = None) -> None:
        self.apps, self.audit = apps, audit or []
        self.requests: list[tuple[str, str, Any]] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        path = request.url.path.removeprefix("/v2/orgs/local")
        self.requests.append((request.method, path, body))
        if path == "/audit-logs":
            return httpx.Response(200, json=self.audit if request.url.params.get("offset", "0") == "0" else [])
        name = path.removeprefix("/apps/")
        if request.method == "GET":
            if name not in self.apps:
                return httpx.Response(404, json={"title": "Not Found", "status": 404,
                                                 "detail": f"application {name!r} not found"})
            return httpx.Response(200, json={"name": name, "status": "UNAVAILABLE", "executorTimeoutSecs": 60,
                                             "gcTimeThresholdMs": None, "gcRowsThreshold": 1_000_000,
                                             "globalTimeoutMs": None, "privateMode": False, "language": None,
                                             "id": "app-id"})
        if request.method == "PUT":
            self.apps.add(name)
        return httpx.Response(204)

    def writes(self) -> list[tuple[str, str, Any]]:
        return [r for r in self.requests if r[0] != "GET"]


Run = Callable[..., tuple[str, str]]


@pytest.fixture
def run(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> Callable[[FakeApi], Run]:
    def bind(fake: FakeApi) -> Run:
        real = common.Api.__init__

        def init(self: common.Api, url: str, key: str, org: str, *, timeout: float = 10.0) -> None:
            real(self, url, key, org, timeout=timeout)
            self._client = httpx.Client(base_url=self.url, transport=httpx.MockTransport(fake.handle))

        monkeypatch.setattr(common.Api, "__init__", init)
        monkeypatch.setenv("RELAY_API_KEY", "dbos_test")

        def relay(*argv: str) -> tuple[str, str]:
            args = parser().parse_args([*argv, "--url", "http://relay.test"])
            admin.run(args, Settings())
            out = capsys.readouterr()
            return out.out, out.err

        return relay

    return bind


def test_audit_json_is_the_api_answer_whole(run: Callable[[FakeApi], Run]) -> None:
    relay = run(FakeApi(set(), audit=ENTRIES))
    out, _ = relay("audit", "-o", "json")
    assert json.loads(out) == ENTRIES
    out, _ = relay("audit")
    assert "request_id=r-1" in out and "TIME" in out


def test_register_a_new_app_with_settings(run: Callable[[FakeApi], Run]) -> None:
    fake = FakeApi(set())
    out, err = run(fake)("apps", "register", "orders", "--executor-timeout", "5s", "--private-mode")
    assert fake.writes() == [("PUT", "/apps/orders", {"privateMode": True}),
                             ("PATCH", "/apps/orders", {"executorTimeoutSecs": 5})]
    assert err == "" and "name:             orders" in out


def test_register_an_existing_app_changes_no_setting(run: Callable[[FakeApi], Run]) -> None:
    fake = FakeApi({"orders"})
    with pytest.raises(SystemExit) as refused:
        run(fake)("apps", "register", "orders", "--executor-timeout", "5s")
    assert "already registered" in str(refused.value.code) and "relay apps update orders" in str(refused.value.code)
    assert fake.writes() == []


def test_register_an_existing_app_says_so(run: Callable[[FakeApi], Run]) -> None:
    fake = FakeApi({"orders"})
    relay = run(fake)
    _, err = relay("apps", "register", "orders")
    assert err == "relay: application 'orders' was already registered; nothing changed\n"
    _, err = relay("apps", "register", "orders", "--no-private-mode")
    assert err == "relay: application 'orders' was already registered; --private-mode applied\n"
    assert fake.writes() == [("PUT", "/apps/orders", None), ("PUT", "/apps/orders", {"privateMode": False})]


def _help(*argv: str) -> str:
    found: argparse.ArgumentParser = parser()
    for name in argv:
        found = next(a for a in found._actions if isinstance(a, argparse._SubParsersAction)).choices[name]
    return found.format_help()


def test_executor_timeout_help_offers_only_whole_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    for command in ("register", "update"):
        text = " ".join(_help("apps", command).split())
        assert "--executor-timeout DURATION the same as a duration: 90s, 15m, 1h30m (whole seconds)" in text
        assert "--gc-time-threshold DURATION the same as a duration: 500ms" in text
    with pytest.raises(SystemExit):
        parser().parse_args(["apps", "update", "orders", "--executor-timeout", "soon"])
    error = capsys.readouterr().err
    assert "invalid duration 'soon'" in error and "500ms" not in error


# -- a mistyped command, choice or option -------------------------------------------------------------------------


@pytest.mark.parametrize(("argv", "said"), [
    (["wokflows", "list"], "invalid choice: 'wokflows'"),
    (["workflows", "lsit"], "invalid choice: 'lsit'"),
    (["workflows", "list", "orders", "--stauts", "SUCCESS"], "unrecognized arguments: --stauts"),
    (["apps", "list", "-o", "jsno"], "invalid choice: 'jsno'"),
])
def test_a_mistyped_word_gets_did_you_mean(capsys: pytest.CaptureFixture[str], argv: list[str], said: str) -> None:
    with pytest.raises(SystemExit) as exited:
        parser().parse_args(argv)
    assert exited.value.code == 2
    error = capsys.readouterr().err
    meant = {"wokflows": "workflows", "lsit": "list", "--stauts": "--status", "jsno": "json"}
    typo = next(word for word in argv if word in meant)
    assert said in error and f"did you mean {meant[typo]}?" in error, error
    if typo == "--stauts":  # said by the command it was typed for, whose options it knows
        assert "relay workflows list: error:" in error, error


def test_a_word_like_nothing_gets_no_guess(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["apps", "list", "--zzzzzz"])
    error = capsys.readouterr().err
    assert "unrecognized arguments: --zzzzzz" in error and "did you mean" not in error


@pytest.mark.parametrize("argv", [["executors", "list", "orders"], ["executors", "list", "--app", "orders"]])
def test_executors_list_takes_the_app_either_way(argv: list[str]) -> None:
    assert parser().parse_args(argv).app == "orders"


# -- the audit table in a terminal: its width ---------------------------------------------------------------------


RECOVERY = _entry("executor.recovery.failed", target="a-thirty-character-app-name-x", details={
    "candidate": "ex-2", "reason": "the peer did not answer within the recovery timeout " * 3, "request_id": "r-1",
    "attempt": 12, "outcome": "retrying", "executorId": "ex-1"})


@pytest.mark.parametrize("width", [80, 100, 120, 140, 150, 160, 240])
def test_the_audit_table_fits_the_terminal_and_keeps_attempt_and_outcome(width: int) -> None:
    for lines in (tables.audit_table([RECOVERY, *ENTRIES], width=width).splitlines(),
                  [*tables.audit_line(None, width=width).splitlines(),
                   *tables.audit_line(RECOVERY, width=width).splitlines()]):
        assert all(len(line) <= width for line in lines), [len(line) for line in lines]
        rows = [line for line in lines if not line.startswith(tables.INDENT)]
        _assert_aligned_to(rows)
        [at] = [n for n, line in enumerate(lines) if "attempt=12" in line]
        # From 160 columns each entry is one line; in 120 or fewer its details go on the next, indented.
        if width >= 160 or width <= 120:
            assert lines[at].startswith(tables.INDENT) == (width <= 120), lines
        assert "executorId=ex-1 attempt=12 outcome=retrying " in lines[at], lines
    if width >= 240:  # wide enough for every column whole
        assert "application:a-thirty-character-app-name-x" in tables.audit_table([RECOVERY], width=width)


def _assert_aligned_to(rows: list[str]) -> None:
    """Every row has a cell starting where each of the header's columns starts, after at least two spaces."""
    header = rows[0]
    starts = [header.index(h) for h in [*tables._AUDIT_HEADERS, "DETAILS"] if h in header]
    for line in rows[1:]:
        for start in starts[1:]:
            assert line[start - 2:start] == "  " and line[start] != " ", (start, line)


def test_the_audit_table_into_a_pipe_is_not_cut_to_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert TERMINAL_WIDTH() is None  # pytest captures stdout: no terminal
    assert len(tables.audit_table([RECOVERY]).splitlines()[1]) > 200  # the details whole, to DETAILS_WIDTH
    monkeypatch.setenv("COLUMNS", "130")
    assert TERMINAL_WIDTH() == 130
    monkeypatch.setattr(tables, "terminal_width", TERMINAL_WIDTH)
    assert all(len(line) <= 130 for line in tables.audit_table([RECOVERY]).splitlines())


def test_a_summary_cut_short_never_cuts_the_kept_keys() -> None:
    details = {"reason": "x" * 200, "outcome": "failed", "attempt": 3, "executorId": "ex-9"}
    assert tables.summarize(details, width=50) == "executorId=ex-9 attempt=3 outcome=failed reason=x…"
    assert tables.summarize(details, width=10) == "executorId=ex-9 attempt=3 outcome=failed …"
    assert tables.summarize({"attempt": 3}, width=5) == "attempt=3"


def test_every_table_shows_times_to_the_millisecond() -> None:
    executor = {"executorId": "ex-1", "status": "HEALTHY", "appVersion": "v1", "hostname": "h", "language": "python",
                "dbosVersion": "3.2.0", "createdAt": "2026-11-30T12:00:00Z", "updatedAt": "2026-11-30T12:00:01.25Z"}
    row = tables.executors_table([executor]).splitlines()[1].split()
    assert row[-4:] == ["2026-11-30", "12:00:00.000Z", "2026-11-30", "12:00:01.250Z"], row
    token: dict[str, Any] = {"tokenName": "ci", "createdAt": "2026-11-30T14:00:00.5+02:00", "appNames": None,
                             "appIds": [], "permissions": []}
    assert tables.tokens_table([token]).splitlines()[1].split()[1:3] == ["2026-11-30", "12:00:00.500Z"]
