"""A revoked key or a deleted app closes its executor sockets within a second, against the session's `relay dev`:
deleted through this gateway's REST API, or only in the database (as another gateway process would, which this
gateway's revocation watcher sees). Timed, so one at a time; what the closing does (close code, DISCONNECTED, the
other sockets left up, on SQLite and PostgreSQL) is tests/e2e/test_rest.py's."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from core.models import make_engine
from core.store import Store
from tests.support import Relay, closed_with, play_executor, wait_until

pytestmark = pytest.mark.e2e

ORG = "/v2/orgs/local"
WITHIN = 1.0  # seconds, from the change to the close frame


def _healthy(store: Store, app: str, executor_id: str) -> bool:
    return any(e.executor_id == executor_id and e.status.value == "HEALTHY" for e in store.list_executors("local", app))


def _closes_within_a_second(relay: Relay, app: str, executor_id: str, key: str, change: Callable[[], object]) -> None:
    store = Store(make_engine(relay.db_url))
    try:
        with play_executor(relay, app, executor_id, key=key) as ws:
            wait_until(lambda: _healthy(store, app, executor_id), timeout=10, what="HEALTHY")
            began = time.monotonic()
            change()
            assert closed_with(ws, within=WITHIN + 4) == 1008
            took = time.monotonic() - began
        assert took < WITHIN, f"closed {took:.2f} s after the change"
    finally:
        store.engine.dispose()


def test_a_token_deleted_here_closes_its_sockets_within_a_second(relay: Relay) -> None:
    with relay.api() as client:
        key = client.post(f"{ORG}/tokens/revoke-timed", json={"appNames": ["revoke-timed-app"]}).json()["token"]
        _closes_within_a_second(relay, "revoke-timed-app", "rt-1", key,
                                lambda: client.delete(f"{ORG}/tokens/revoke-timed").raise_for_status())


def test_a_token_revoked_elsewhere_closes_its_sockets_within_a_second(relay: Relay) -> None:
    store = Store(make_engine(relay.db_url))
    try:
        key = store.create_key(org="local", name="revoke-far-timed", apps=["revoke-far-timed-app"])
        _closes_within_a_second(relay, "revoke-far-timed-app", "rft-1", key, lambda: store.revoke_token(
            "local", "revoke-far-timed", subject="system", source_ip=""))
    finally:
        store.engine.dispose()


def test_an_app_deleted_elsewhere_closes_its_sockets_within_a_second(relay: Relay) -> None:
    store = Store(make_engine(relay.db_url))
    try:
        _closes_within_a_second(relay, "deleted-far-timed-app", "dft-1", relay.key, lambda: store.delete_app(
            "local", "deleted-far-timed-app", subject="system", source_ip="", orphans=[], details={}))
    finally:
        store.engine.dispose()
