"""The admin CLI (``relay apps|executors|audit|keys``) through its real console script, against `relay dev`.

Each command's effect is checked through the REST API directly, not through the CLI's own output alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import signal
import sqlite3
import subprocess
import threading
import uuid
from typing import IO, Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosed

from tests.support import VENV_BIN, Relay, free_port, play_executor, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.concurrent]


def relay_cli(relay: Relay, *args: str, key: str | None = None, url: bool = True, rc: int = 0,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``relay ARGS`` with ``RELAY_API_KEY=key`` (none if None) and ``--url`` the fixture's; check its exit."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    full_env["RELAY_DATA_DIR"] = str(relay.data_dir)
    if key is not None:
        full_env["RELAY_API_KEY"] = key
    full_env.update(env or {})
    argv = [str(VENV_BIN / "relay"), *args, *(["--url", relay.url] if url else [])]
    done = subprocess.run(argv, env=full_env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert done.returncode == rc, (argv, done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def new_name(prefix: str = "cli") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def rest_app(relay: Relay, app: str) -> dict[str, Any]:
    with relay.api() as client:
        response = client.get(f"/v2/orgs/local/apps/{app}")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def test_register_and_update_in_human_durations_and_dbos_ctl_flags(relay: Relay) -> None:
    app = new_name()
    out = relay_cli(relay, "apps", "register", app, "--executor-timeout", "90s", "--gc-time-threshold", "7d",
                    "--global-timeout", "12h", "--gc-rows-threshold", "500", "-o", "json", key=relay.key)
    stored = rest_app(relay, app)
    assert json.loads(out.stdout) == stored
    assert (stored["executorTimeoutSecs"], stored["gcTimeThresholdMs"], stored["globalTimeoutMs"],
            stored["gcRowsThreshold"]) == (90, 604_800_000, 43_200_000, 500)

    # Under an hour deletes (cancels) most workflows at the next round: asked for, and with no terminal refused
    # unless --yes; under a second refused by the REST API, which reads the value back.
    short = ["--executor-timeout-secs", "5", "--gc-time-threshold-ms", "1500", "--global-timeout-ms", "2500"]
    refused = relay_cli(relay, "apps", "update", app, *short, key=relay.key, rc=1).stderr
    assert "--gc-time-threshold 1s500ms is under 1h" in refused and "pass --yes" in refused
    slip = relay_cli(relay, "apps", "update", app, "--gc-time-threshold-ms", "7", key=relay.key, rc=1).stderr
    assert "7 ms — did you mean 7 s (7000) or 7 days (604800000)?" in slip
    assert rest_app(relay, app)["gcTimeThresholdMs"] == 604_800_000
    relay_cli(relay, "apps", "update", app, *short, "--yes", key=relay.key)
    stored = rest_app(relay, app)
    assert (stored["executorTimeoutSecs"], stored["gcTimeThresholdMs"], stored["globalTimeoutMs"]) == (5, 1500, 2500)

    relay_cli(relay, "apps", "update", app, "--gc-time-threshold", "none", "--private-mode", key=relay.key)
    stored = rest_app(relay, app)
    assert stored["gcTimeThresholdMs"] is None and stored["privateMode"] is True
    assert stored["executorTimeoutSecs"] == 5 and stored["globalTimeoutMs"] == 2500  # left out: unchanged


def test_tables_for_people(relay: Relay) -> None:
    app = new_name()
    card = relay_cli(relay, "apps", "register", app, "--executor-timeout", "1h30m", key=relay.key).stdout
    assert f"name:             {app}\n" in card and "executor timeout: 1h30m\n" in card
    assert "gc rows:          1000000\n" in card and "global timeout:   -\n" in card

    listing = relay_cli(relay, "apps", "list", key=relay.key).stdout.splitlines()
    assert listing[0].split()[:2] == ["NAME", "STATUS"]
    [row] = [line for line in listing if line.startswith(app + " ")]
    assert row.split()[1:3] == ["UNAVAILABLE", "1h30m"]

    with play_executor(relay, app, "ex-cli-1", version="v9"):
        wait_until(lambda: relay.executors(app).get("ex-cli-1") == "HEALTHY", timeout=10, what="HEALTHY")
        table = relay_cli(relay, "executors", "list", app, key=relay.key).stdout.splitlines()
        as_json = json.loads(relay_cli(relay, "executors", "list", app, "-o", "json", key=relay.key).stdout)
    assert table[0].split()[:4] == ["EXECUTOR", "ID", "STATUS", "VERSION"]
    assert table[1].split()[:5] == ["ex-cli-1", "HEALTHY", "v9", "test", "python"]
    assert [(e["executorId"], e["status"], e["appVersion"]) for e in as_json] == [("ex-cli-1", "HEALTHY", "v9")]


def test_apps_list_json_is_the_api_answer(relay: Relay) -> None:
    app = new_name()
    relay_cli(relay, "apps", "register", app, key=relay.key)
    listed = json.loads(relay_cli(relay, "apps", "list", "-o", "json", key=relay.key).stdout)
    with relay.api() as client:
        assert listed == client.get("/v2/orgs/local/apps").json()
    assert app in {a["name"] for a in listed}


def test_delete(relay: Relay) -> None:
    app = new_name()
    relay_cli(relay, "apps", "register", app, key=relay.key)
    assert relay_cli(relay, "apps", "delete", app, key=relay.key).stdout == f"deleted {app}\n"
    with relay.api() as client:
        assert client.get(f"/v2/orgs/local/apps/{app}").status_code == 404
    assert app in relay_cli(relay, "apps", "get", app, key=relay.key, rc=1).stderr


def test_errors_print_the_problem_detail_and_exit_non_zero(relay: Relay) -> None:
    with httpx.Client(base_url=relay.url) as client:
        missing = client.get("/v2/orgs/local/apps/no-such-app", headers={"Authorization": f"Bearer {relay.key}"})
        bad_key = client.get("/v2/orgs/local/apps", headers={"Authorization": "Bearer dbos_not-a-key"})
    assert missing.status_code == 404 and bad_key.status_code == 401
    assert relay_cli(relay, "apps", "get", "no-such-app", key=relay.key, rc=1).stderr == \
        f"relay: {missing.json()['detail']}\n"
    assert relay_cli(relay, "apps", "list", key="dbos_not-a-key", rc=1).stderr == f"relay: {bad_key.json()['detail']}\n"

    app = new_name()
    relay_cli(relay, "apps", "register", app, key=relay.key)
    refused = relay_cli(relay, "apps", "update", app, "--gc-rows-threshold", "0", key=relay.key, rc=1).stderr
    assert "body.gcRowsThreshold" in refused  # the problem's errors[], one line each
    assert rest_app(relay, app)["gcRowsThreshold"] == 1_000_000

    # Refused before any request (bad durations: tests/unit/test_units.py): nothing to change, no key, no server.
    assert "whole seconds" in relay_cli(relay, "apps", "update", app, "--executor-timeout", "1500ms",
                                        key=relay.key, rc=2).stderr
    assert "nothing to change" in relay_cli(relay, "apps", "update", app, key=relay.key, rc=1).stderr
    assert "RELAY_API_KEY" in relay_cli(relay, "apps", "list", rc=1).stderr
    nowhere = f"http://127.0.0.1:{free_port()}"
    assert f"cannot reach Relay at {nowhere}" in relay_cli(relay, "apps", "list", "--url", nowhere, url=False,
                                                           key=relay.key, rc=1).stderr


def test_default_url_and_api_key_flag(relay: Relay) -> None:
    port = relay.url.rsplit(":", 1)[1]
    out = relay_cli(relay, "apps", "list", "-o", "json", "--api-key", relay.key, url=False,
                    env={"RELAY_HOST": "127.0.0.1", "RELAY_PORT": port})
    assert isinstance(json.loads(out.stdout), list)


def test_audit_lists_admin_actions(relay: Relay) -> None:
    app = new_name()
    relay_cli(relay, "apps", "register", app, key=relay.key)
    relay_cli(relay, "apps", "update", app, "--executor-timeout", "2m", key=relay.key)
    entries = json.loads(relay_cli(relay, "audit", "--target", app, "-o", "json", key=relay.key).stdout)
    assert [e["operation"] for e in entries] == ["app.updated", "app.registered"]  # the API's order: newest first
    assert all(e["target"] == {"type": "application", "id": app} for e in entries)

    lines = relay_cli(relay, "audit", "--target", app, key=relay.key).stdout.splitlines()
    assert lines[0].split()[:3] == ["TIME", "OPERATION", "STATUS"]
    assert [line.split()[2] for line in lines[1:]] == ["app.registered", "app.updated"]  # a log: oldest first
    assert all(f"application:{app}" in line for line in lines[1:])


def test_audit_follow_prints_new_entries_until_ctrl_c(relay: Relay) -> None:
    app = new_name()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAY_")}
    env["RELAY_API_KEY"] = relay.key
    argv = [str(VENV_BIN / "relay"), "audit", "--follow", "--interval", "100ms", "--target", app, "--url", relay.url]
    lines: queue.Queue[str] = queue.Queue()
    seen: list[str] = []

    def printed(operation: str) -> bool:
        while not lines.empty():
            seen.append(lines.get())
        return any(operation in line.split() for line in seen)

    with subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                          text=True) as follow:
        assert follow.stdout is not None and follow.stderr is not None
        reader = threading.Thread(target=_pump, args=(follow.stdout, lines), daemon=True)
        reader.start()
        try:
            wait_until(lambda: printed("OPERATION"), timeout=30, what="the header")
            with relay.api() as client:
                assert client.put(f"/v2/orgs/local/apps/{app}").status_code == 204
                wait_until(lambda: printed("app.registered"), timeout=10, what="app.registered printed")
                assert client.patch(f"/v2/orgs/local/apps/{app}", json={"executorTimeoutSecs": 9}).status_code == 204
                wait_until(lambda: printed("app.updated"), timeout=10, what="app.updated printed")
            follow.send_signal(signal.SIGINT)
            assert follow.wait(timeout=10) == 0
        finally:
            if follow.poll() is None:
                follow.kill()
        reader.join(timeout=10)
        stderr = follow.stderr.read()
    assert "Traceback" not in stderr, stderr
    printed("")
    assert [line.split()[2] for line in seen[1:]] == ["app.registered", "app.updated"]  # each once, in order


def _pump(stream: IO[str], into: queue.Queue[str]) -> None:
    for line in stream:
        into.put(line)


def test_keys_through_the_api(relay: Relay) -> None:
    app, other, name = new_name(), new_name(), new_name("token")
    relay_cli(relay, "apps", "register", app, key=relay.key)
    relay_cli(relay, "apps", "register", other, key=relay.key)
    created = json.loads(relay_cli(relay, "keys", "create", "--name", name, "--app", app, "--api-key", relay.key,
                                   "-o", "json").stdout)
    assert created["tokenName"] == name and created["token"].startswith("dbos_")
    token = created["token"]
    with httpx.Client(base_url=relay.url, headers={"Authorization": f"Bearer {token}"}) as client:
        assert client.get(f"/v2/orgs/local/apps/{app}").status_code == 200
        assert client.get(f"/v2/orgs/local/apps/{other}").status_code == 403

    listed = relay_cli(relay, "keys", "list", "-o", "json", key=relay.key).stdout
    assert token not in listed
    [entry] = [t for t in json.loads(listed) if t["tokenName"] == name]
    assert entry["appIds"] == [rest_app(relay, app)["id"]]
    [row] = [line for line in relay_cli(relay, "keys", "list", key=relay.key).stdout.splitlines()
             if line.startswith(name + " ")]
    assert app in row.split()
    assert name in relay_cli(relay, "keys", "create", "--name", name, key=relay.key, rc=1).stderr  # 409: taken

    assert relay_cli(relay, "keys", "revoke", name, key=relay.key).stdout == f"revoked {name}\n"
    with httpx.Client(base_url=relay.url, headers={"Authorization": f"Bearer {token}"}) as client:
        assert client.get(f"/v2/orgs/local/apps/{app}").status_code == 401
    assert name in relay_cli(relay, "keys", "revoke", name, key=relay.key, rc=1).stderr


def test_keys_bootstrap_in_the_local_database_without_an_api_key(relay: Relay) -> None:
    name = new_name("local")
    token = relay_cli(relay, "keys", "create", "--name", name, url=False).stdout.strip()
    assert token.startswith("dbos_")
    # As through the API: a live token's name is taken (409 there), and the creation is audited.
    assert "already has a token named" in relay_cli(relay, "keys", "create", "--name", name, url=False, rc=1).stderr
    with contextlib.closing(sqlite3.connect(relay.data_dir / "relay.db")) as db:
        created = db.execute("SELECT subject, org FROM auditlog WHERE operation = 'token.created' "
                             "AND json_extract(details, '$.tokenName') = ?", (name,)).fetchall()
    assert created == [("system", "local")]
    with httpx.Client(base_url=relay.url, headers={"Authorization": f"Bearer {token}"}) as client:
        assert client.get("/v2/orgs/local/apps").status_code == 200
    assert name in {t["tokenName"] for t in json.loads(relay_cli(relay, "keys", "list", "-o", "json").stdout)}

    app = new_name()
    with play_executor(dataclasses.replace(relay, key=token), app, "ex-local-1") as ws:
        wait_until(lambda: relay.executors(app).get("ex-local-1") == "HEALTHY", timeout=10, what="HEALTHY")
        relay_cli(relay, "keys", "revoke", name)
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=5)  # the gateway's revocation watch closes it, as after deleteToken
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
    with httpx.Client(base_url=relay.url, headers={"Authorization": f"Bearer {token}"}) as client:
        assert client.get("/v2/orgs/local/apps").status_code == 401
    listed = json.loads(relay_cli(relay, "keys", "list", "-o", "json", key=relay.key).stdout)
    assert name not in {t["tokenName"] for t in listed}
    assert name in relay_cli(relay, "keys", "revoke", name, rc=1).stderr


def test_register_an_existing_app_keeps_its_settings(relay: Relay) -> None:
    app = new_name()
    first = relay_cli(relay, "apps", "register", app, "--executor-timeout", "5s", key=relay.key)
    assert first.stderr == ""
    refused = relay_cli(relay, "apps", "register", app, "--executor-timeout", "90s", key=relay.key, rc=1).stderr
    assert "already registered" in refused and f"relay apps update {app}" in refused
    again = relay_cli(relay, "apps", "register", app, "--private-mode", key=relay.key)
    assert "already registered; --private-mode applied" in again.stderr
    stored = rest_app(relay, app)
    assert (stored["executorTimeoutSecs"], stored["privateMode"]) == (5, True)
