"""The REST app in-process: ``create_app`` with an injected ``Gateway`` — the real one (hub, admission, contact
state) on a real store, SQLite or PostgreSQL — whose Temporal client is ``FakeTemporal``, served through httpx's
ASGI transport. No socket, no Temporal, no ``relay dev``: what needs those (executor sockets, lifecycle
workflows, the HTTP layer in front of the app) is tested end to end in ``tests/e2e``."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import cast

import httpx
import pytest
from fastapi import FastAPI
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from api.app import create_app
from core.models import make_engine
from core.settings import Settings
from core.store import Store
from gateway import session as sm
from gateway.hub import Connection
from gateway.runtime import Gateway
from tests.postgres import postgres_cluster
from workflows.contracts.common import ExecutorInfo, ExecutorStatus

ORG = "local"
BASE_URL = "http://relay.test"


class FakeHandle:
    """A lifecycle workflow as deleteApp sees it: ``signal`` records, ``result`` returns at once (the workflow
    ended on its ``removed``)."""

    def __init__(self, temporal: FakeTemporal, workflow_id: str) -> None:
        self.id = workflow_id
        self._temporal = temporal

    async def signal(self, signal: object, arg: object) -> None:
        # A workflow's signal method (as Relay sends them): the name it is registered under, as the server sees it.
        name = signal if isinstance(signal, str) else getattr(signal, "__temporal_signal_definition").name
        if self._temporal.unreachable:
            raise RPCError("connection refused", RPCStatusCode.UNAVAILABLE, b"")
        if self.id not in self._temporal.running:
            raise RPCError("workflow not found", RPCStatusCode.NOT_FOUND, b"")
        self._temporal.signals.append((self.id, name, arg))

    async def result(self) -> None:
        self._temporal.running.discard(self.id)


@dataclass
class FakeTemporal:
    """The part of ``temporalio.client.Client`` the routes use: workflow handles to signal and wait on."""

    running: set[str] = field(default_factory=set)  # workflow ids that answer a signal; others are NOT_FOUND
    unreachable: bool = False  # every signal fails with UNAVAILABLE
    signals: list[tuple[str, str, object]] = field(default_factory=list)  # (workflow id, signal name, argument)

    def get_workflow_handle(self, workflow_id: str) -> FakeHandle:
        return FakeHandle(self, workflow_id)


@dataclass
class Api:
    """One in-process app and what stands behind it; ``key`` is org ``local``'s org-wide key ``dev``."""

    app: FastAPI
    store: Store
    gateway: Gateway
    temporal: FakeTemporal
    key: str
    closed: dict[str, tuple[int, str]] = field(default_factory=dict)  # executor id -> (close code, reason)

    def client(self, key: str | None = None) -> httpx.AsyncClient:
        """A client of the app sending ``key`` (default: the dev key)."""
        return self.anonymous(headers={"Authorization": f"Bearer {key or self.key}"})

    def anonymous(self, *, headers: dict[str, str] | None = None) -> httpx.AsyncClient:
        """A client of the app with no key (or only the ``headers`` given)."""
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app), base_url=BASE_URL,
                                 headers=headers or {})

    def new_key(self, *, org: str = ORG, apps: list[str] | None = None) -> str:
        return self.store.create_key(org=org, name=f"test-{uuid.uuid4().hex[:8]}", apps=apps)

    def connect(self, app: str, executor_id: str, *, key: str | None = None, org: str = ORG) -> None:
        """An executor socket held by this gateway, past its handshake: it closes into ``closed``."""
        async def send(_frame: str) -> None:
            pass

        async def close(code: int, reason: str) -> None:
            self.closed[executor_id] = (code, reason)

        self.gateway.hub.attach(Connection(
            connection_id=f"conn-{executor_id}", org=org, app=app, executor_id=executor_id, session=sm.Session(),
            send=send, close=close, key_id=self.store.authenticate(key or self.key).key_id,
            app_id=self.store.get_app(org, app).id))

    def record(self, app: str, executor_id: str, status: ExecutorStatus = ExecutorStatus.HEALTHY, *,
               version: str = "v1", metadata: dict[str, str] | None = None) -> None:
        """The registry row and audit row the lifecycle workflow's ``record_status`` activity writes."""
        info = ExecutorInfo(executor_id=executor_id, application_version=version, hostname="test",
                            language="python", dbos_version="3.2.0", executor_metadata=metadata)
        self.store.record_status(org=ORG, app=app, executor_id=executor_id, status=status,
                                 operation=f"executor.{status.value.lower()}", event_key=uuid.uuid4().hex,
                                 info=info, connection_id=f"conn-{executor_id}",
                                 gateway_queue=self.gateway.task_queue, details={"executorId": executor_id})


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.e2e)])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    """Relay's store, once per module on each database Relay runs on (PostgreSQL: a private cluster, which needs
    Debian's server binaries: that variant is in the e2e tier)."""
    if request.param == "sqlite":
        store = Store(make_engine(f"sqlite:///{tmp_path_factory.mktemp('api') / 'relay.db'}"))
        yield store
        store.engine.dispose()
        return
    with postgres_cluster() as cluster:
        store = Store(make_engine(cluster.create_database("api")))
        yield store
        store.engine.dispose()


@pytest.fixture(scope="module")
def api(store: Store, tmp_path_factory: pytest.TempPathFactory) -> Api:
    settings = Settings(data_dir=tmp_path_factory.mktemp("api-data"))
    temporal = FakeTemporal()
    gateway = Gateway(settings=settings, store=store, client=cast(Client, temporal))
    key = store.create_key(org=ORG, name="dev")
    return Api(create_app(settings, gateway=gateway), store, gateway, temporal, key)
