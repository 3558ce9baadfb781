"""The revocation watcher against a real SQLite store and a hub of fake sockets: it closes exactly the sockets
whose key was revoked, or whose app was deleted (or deleted and registered again), and nothing else."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from core.models import make_engine
from core.store import Store
from gateway import session as sm
from gateway.hub import Connection, Hub
from gateway.revocation import APP_DELETED_REASON, REVOKED_REASON, Watcher


class Sockets:
    """The hub's connections, each closing into ``closed`` instead of a socket."""

    def __init__(self) -> None:
        self.hub = Hub()
        self.closed: dict[str, tuple[int, str]] = {}

    def open(self, executor_id: str, *, key_id: str, app: str = "app-one", org: str = "acme",
             app_id: str = "") -> None:
        async def send(_frame: str) -> None:
            pass

        async def close(code: int, reason: str) -> None:
            self.closed[executor_id] = (code, reason)

        self.hub.attach(Connection(connection_id=f"c-{executor_id}", org=org, app=app, executor_id=executor_id,
                                   session=sm.Session(), send=send, close=close, key_id=key_id,
                                   app_id=app_id))


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(make_engine(f"sqlite:///{tmp_path / 'relay.db'}"))
    yield s
    s.engine.dispose()


def _key_id(store: Store, key: str) -> str:
    return store.authenticate(key).key_id


async def test_closes_the_sockets_of_a_revoked_key_only(store: Store) -> None:
    store.ensure_app("acme", "app-one")
    doomed, kept = store.create_key(org="acme", name="doomed"), store.create_key(org="acme", name="kept")
    sockets = Sockets()
    sockets.open("e1", key_id=_key_id(store, doomed))
    sockets.open("e2", key_id=_key_id(store, doomed))
    sockets.open("e3", key_id=_key_id(store, kept))
    watcher = Watcher(store=store, hub=sockets.hub)
    assert await watcher.sweep() == 0

    store.revoke_token("acme", "doomed", subject="system", source_ip="")
    assert await watcher.sweep() == 2
    assert sockets.closed == {"e1": (1008, REVOKED_REASON), "e2": (1008, REVOKED_REASON)}


async def test_closes_the_sockets_of_a_deleted_app_even_once_it_is_registered_again(store: Store) -> None:
    key = store.create_key(org="acme", name="k")
    one, _ = store.ensure_app("acme", "app-one")
    two, _ = store.ensure_app("acme", "app-two")
    sockets = Sockets()
    sockets.open("e1", key_id=_key_id(store, key), app="app-one", app_id=one.id)
    sockets.open("e2", key_id=_key_id(store, key), app="app-two", app_id=two.id)
    watcher = Watcher(store=store, hub=sockets.hub)
    assert await watcher.sweep() == 0

    # Deleted and registered again between two sweeps (say, by another executor reconnecting at once).
    store.delete_app("acme", "app-one", subject="system", source_ip="", orphans=[], details={})
    store.ensure_app("acme", "app-one")
    assert await watcher.sweep() == 1
    assert sockets.closed == {"e1": (1008, APP_DELETED_REASON)}


async def test_a_socket_seen_first_after_its_app_is_gone_is_closed(store: Store) -> None:
    key = store.create_key(org="acme", name="k")
    sockets = Sockets()
    sockets.open("e1", key_id=_key_id(store, key), app="never-registered")
    assert await Watcher(store=store, hub=sockets.hub).sweep() == 1
    assert sockets.closed == {"e1": (1008, APP_DELETED_REASON)}
