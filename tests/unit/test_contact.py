"""A gateway's contact with Temporal (``gateway.contact``), its signal retries and its reconciliation
(``gateway.runtime``), unit by unit: fake clocks, fake checks, a fake registry. The same behaviour with real
processes (Temporal frozen, killed, cut off) is tests/e2e/test_outages.py."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast

import pytest
from sqlalchemy.exc import OperationalError
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from core import metrics
from core.models import make_engine
from core.settings import Settings
from core.store import Store
from gateway import runtime
from gateway.contact import Change, Contact, ContactState
from gateway.hub import Connection
from gateway.runtime import Gateway
from gateway.session import Session
from gateway.signals import RowReads
from workflows.contracts.common import ConnectedSignal, ExecutorInfo, ExecutorStatus

FENCE = timedelta(seconds=10)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_contact_state_loses_fences_once_and_regains() -> None:
    clock = Clock()
    state = ContactState(fence_after=FENCE, clock=clock)
    assert state.observe(True) is None
    clock.now += 1
    assert state.observe(False, "refused") is Change.LOST
    assert (state.in_contact, state.fenced, state.reason) == (False, False, "refused")
    clock.now += 5
    assert state.observe(False) is None
    assert state.away_for() == timedelta(seconds=6)
    clock.now += 4  # 10 s since the last good check
    assert state.observe(False) is Change.FENCED
    assert state.fenced and state.contact_for() == timedelta(0)
    clock.now += 30
    assert state.observe(False) is None  # fenced once per outage
    assert state.observe(True) is Change.REGAINED
    assert (state.in_contact, state.fenced) == (True, False)
    clock.now += 3
    assert state.contact_for() == timedelta(seconds=3)  # counted from the moment contact came back


def test_a_first_failure_after_a_long_silence_fences_at_once() -> None:
    clock = Clock()
    state = ContactState(fence_after=FENCE, clock=clock)
    clock.now += 11  # the check itself hung this long (a frozen server)
    assert state.observe(False) is Change.FENCED


async def test_contact_loop_logs_one_line_per_change_and_calls_back(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    down = [False]
    changes: list[Change] = []

    async def check() -> None:
        if down[0]:
            raise RPCError("connection refused", RPCStatusCode.UNAVAILABLE, b"")

    async def on_change(change: Change) -> None:
        changes.append(change)

    contact = Contact(check=check, on_change=on_change, state=ContactState(fence_after=FENCE, clock=clock),
                      target="temporal:7233")
    with caplog.at_level(logging.INFO, logger="relay.contact"):
        for outage in [False, True, True, True, True, False, False]:
            down[0] = outage
            clock.now += 4
            await contact.once()
    assert changes == [Change.LOST, Change.FENCED, Change.REGAINED]
    lines = [r.getMessage() for r in caplog.records if r.name == "relay.contact"]
    assert len(lines) == 3, lines
    assert "unreachable" in lines[0] and "fencing" in lines[1] and "reachable again (away 20.0 s)" in lines[2]


async def test_one_failed_call_that_succeeds_when_tried_again_is_not_an_outage() -> None:
    """The server closes each client connection at its maximum age, failing a check in flight once."""
    calls = 0
    changes: list[Change] = []

    async def check() -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RPCError("operation was canceled", RPCStatusCode.CANCELLED, b"")

    async def on_change(change: Change) -> None:
        changes.append(change)

    state = ContactState(fence_after=FENCE)
    await Contact(check=check, on_change=on_change, state=state, target="t").once()
    assert (calls, changes, state.in_contact) == (2, [], True)


async def test_a_hanging_check_counts_as_a_failure() -> None:
    async def hang() -> None:
        await asyncio.sleep(60)

    async def ignore(change: Change) -> None:
        pass

    state = ContactState(fence_after=timedelta(seconds=2))
    contact = Contact(check=hang, on_change=ignore, state=state, target="t", every=timedelta(milliseconds=100),
                      timeout=timedelta(milliseconds=500))
    await contact.once()
    assert not state.in_contact and "TimeoutError" in state.reason


def _gateway(tmp_path: Path, store: object = None) -> Gateway:
    return Gateway(settings=Settings(data_dir=tmp_path), store=cast(Store, store), client=cast(Client, None))


async def test_a_signal_is_retried_past_any_attempt_count_until_it_lands(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "SIGNAL_BACKOFF_INITIAL", timedelta(milliseconds=1))
    monkeypatch.setattr(runtime, "SIGNAL_BACKOFF_MAX", timedelta(milliseconds=2))
    gateway = _gateway(tmp_path)
    calls = 0

    async def send() -> None:
        nonlocal calls
        calls += 1
        if calls <= 40:  # the old code gave up after 8
            raise RPCError("unavailable", RPCStatusCode.UNAVAILABLE, b"")

    assert await gateway._retry(send, "connected for e1", lambda: True)
    assert calls == 41


async def test_a_superseded_signal_stops_retrying_and_an_ended_workflow_is_not_retried(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "SIGNAL_BACKOFF_INITIAL", timedelta(milliseconds=1))
    gateway = _gateway(tmp_path)
    calls = 0

    async def failing() -> None:
        nonlocal calls
        calls += 1
        raise RPCError("unavailable", RPCStatusCode.UNAVAILABLE, b"")

    assert await gateway._retry(failing, "x", lambda: calls < 3)  # a newer connection came: dropped as stale
    assert calls == 3

    async def ended() -> None:
        raise RPCError("workflow not found", RPCStatusCode.NOT_FOUND, b"")

    assert not await gateway._retry(ended, "x", lambda: True)


class FakeRegistry:
    def __init__(self, rows: dict[tuple[str, str, str], tuple[ExecutorStatus, str]]) -> None:
        self.rows = rows

    def registry_on_gateway(self, gateway_queue: str) -> dict[tuple[str, str, str], tuple[ExecutorStatus, str]]:
        return self.rows


def _held(gateway: Gateway, executor_id: str, connection_id: str, *, landed: bool = True) -> Connection:
    async def send(frame: str) -> None:
        pass

    async def close(code: int, reason: str) -> None:
        pass

    conn = Connection(connection_id=connection_id, org="o", app="a", executor_id=executor_id, session=Session(),
                      send=send, close=close)
    conn.signal = ConnectedSignal(connection_id=connection_id, gateway_queue=gateway.task_queue,
                                  info=ExecutorInfo(executor_id), signal_id="first")
    conn.landed = landed
    gateway.hub.attach(conn)
    return conn


async def test_reconcile_resends_what_landed_but_the_registry_lacks_and_disconnects_what_is_gone(
        tmp_path: Path) -> None:
    H, D = ExecutorStatus.HEALTHY, ExecutorStatus.DISCONNECTED
    registry = FakeRegistry({
        ("o", "a", "fine"): (H, "c-fine"),  # held, recorded: nothing to do
        ("o", "a", "wrongly-gone"): (D, "c-wrong"),  # held, but the registry says DISCONNECTED
        ("o", "a", "old-conn"): (H, "c-old"),  # held under a newer connection than recorded
        ("o", "a", "left"): (H, "c-left"),  # recorded HEALTHY here, no socket: its `disconnected` was lost
        # No socket, DISCONNECTED: perhaps only by this gateway's own write at the close (``record_disconnect``),
        # its signal lost with an earlier incarnation; sent again (stale at the workflow if it was taken in).
        ("o", "a", "already-off"): (D, "c-off"),
    })
    gateway = _gateway(tmp_path, registry)
    for executor_id, connection_id in [("fine", "c-fine"), ("wrongly-gone", "c-wrong"), ("old-conn", "c-new"),
                                       ("unknown", "c-unknown")]:
        _held(gateway, executor_id, connection_id)
    # Held, its `connected` still being sent (not landed yet): it lands by itself, so it is not sent twice.
    _held(gateway, "on-its-way", "c-way", landed=False)

    resent: list[tuple[str, str]] = []
    disconnected: list[tuple[str, str]] = []

    async def resend(conn: Connection) -> None:
        resent.append((conn.executor_id, conn.connection_id))

    def spawn_disconnected(org: str, app: str, executor_id: str, connection_id: str) -> None:
        disconnected.append((executor_id, connection_id))

    fake: Any = gateway
    fake.resend_connected = resend
    fake.spawn_disconnected = spawn_disconnected
    await gateway.reconcile()
    await gateway.drain()
    assert sorted(resent) == [("old-conn", "c-new"), ("unknown", "c-unknown"), ("wrongly-gone", "c-wrong")]
    assert disconnected == [("left", "c-left"), ("already-off", "c-off")]


class LandingClient:
    """What ``Gateway.signal_connected`` asks of a Temporal client: its signal-with-start, failing ``fail`` times
    first (UNAVAILABLE), each landing recorded."""

    def __init__(self, fail: int = 0, delay: float = 0.0,
                 on_land: Callable[[ConnectedSignal], None] | None = None) -> None:
        self.fail = fail
        self.delay = delay  # seconds each call takes
        self.landed: list[str] = []
        self.on_land = on_land  # what the lifecycle workflow does as the signal lands, before the call returns

    async def start_workflow(self, *args: Any, start_signal_args: list[ConnectedSignal], **kwargs: Any) -> None:
        await asyncio.sleep(self.delay)
        if self.fail:
            self.fail -= 1
            raise RPCError("unavailable", RPCStatusCode.UNAVAILABLE, b"")
        self.landed.append(start_signal_args[0].connection_id)
        if self.on_land is not None:
            self.on_land(start_signal_args[0])


async def test_a_landed_connected_marks_its_socket_and_writes_a_healthy_executors_move(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Once its ``connected`` landed (after retries here), a held socket is marked landed (reconciliation resends
    only those) and, for an executor HEALTHY under another socket, the registry names it (``Store.move_healthy``).
    A new executor gets no row from the gateway; a socket closed before its signal landed is neither."""
    monkeypatch.setattr(runtime, "SIGNAL_BACKOFF_INITIAL", timedelta(milliseconds=1))
    store = Store(make_engine(f"sqlite:///{tmp_path / 'relay.db'}"))
    store.ensure_app("o", "a")
    client = LandingClient(fail=2)
    gateway = Gateway(settings=Settings(data_dir=tmp_path), store=store, client=cast(Client, client))
    for executor_id in ("mover", "gone-before"):
        store.record_status(org="o", app="a", executor_id=executor_id, status=ExecutorStatus.HEALTHY,
                            operation="executor.healthy", event_key=f"{executor_id}/1", connection_id="c-old",
                            gateway_queue="relay-gateway-elsewhere", details={},
                            info=ExecutorInfo(executor_id, application_version="v1"))
    written = metrics.REGISTRY.get_sample_value("relay_gateway_moves_total", {"outcome": "written"}) or 0.0
    try:
        mover, new = _held(gateway, "mover", "c-here", landed=False), _held(gateway, "new", "c-new", landed=False)
        for conn in (mover, new):
            assert conn.signal is not None and await gateway.signal_connected("o", "a", conn.signal)
        assert client.landed == ["c-here", "c-new"] and mover.landed and new.landed
        moved = store.registry_row("o", "a", "mover")
        assert moved is not None and (moved.status, moved.connection_id, moved.gateway_queue) == (
            ExecutorStatus.HEALTHY, "c-here", gateway.task_queue)
        assert store.registry_row("o", "a", "new") is None  # its workflow writes it
        assert metrics.REGISTRY.get_sample_value("relay_gateway_moves_total", {"outcome": "written"}) == written + 1

        closed = _held(gateway, "gone-before", "c-closed", landed=False)
        gateway.hub.detach(closed)
        assert closed.signal is not None and await gateway.signal_connected("o", "a", closed.signal)
        row = store.registry_row("o", "a", "gone-before")
        assert not closed.landed and row is not None and row.connection_id == "c-old"
    finally:
        store.engine.dispose()


async def test_a_connected_whose_row_could_not_be_read_lands_and_leaves_the_move_to_its_workflow(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry row a connect reads before signalling (``RowReads``) failing, the database away: the signal
    still lands and its socket is marked landed, the row is left as it was for the workflow to write, and the move
    counts as ``unread``, not ``written``."""
    store = _moving(tmp_path)

    def unreachable(executors: list[tuple[str, str, str]]) -> dict[tuple[str, str, str], Any]:
        raise OperationalError("SELECT registry", {}, Exception("database is away"))

    monkeypatch.setattr(store, "rows_seen", unreachable)
    client = LandingClient(fail=0)
    gateway = Gateway(settings=Settings(data_dir=tmp_path), store=store, client=cast(Client, client))
    unread, written = _moves("unread"), _moves("written")
    try:
        mover = _held(gateway, "mover", "c-here", landed=False)
        assert mover.signal is not None and await gateway.signal_connected("o", "a", mover.signal)
        assert client.landed == ["c-here"] and mover.landed
        row = store.registry_row("o", "a", "mover")
        assert row is not None and (row.connection_id, row.gateway_queue) == ("c-old", "relay-gateway-elsewhere")
        assert (_moves("unread"), _moves("written")) == (unread + 1, written)
    finally:
        store.engine.dispose()


async def test_a_move_its_workflow_wrote_first_counts_as_already_and_a_written_one_as_moved(
        tmp_path: Path) -> None:
    """The workflow took the signal in and wrote the new socket before the gateway's write (a quiet moment): the
    move counts as ``already``, not ``lost``. The time from the handshake is observed as landed for both, and as
    moved only for the move the gateway wrote."""
    store = _moving(tmp_path)
    store.record_status(org="o", app="a", executor_id="second", status=ExecutorStatus.HEALTHY,
                        operation="executor.healthy", event_key="second/1", connection_id="c-old",
                        gateway_queue="relay-gateway-elsewhere", details={},
                        info=ExecutorInfo("second", application_version="v1"))

    def workflow_first(signal: ConnectedSignal) -> None:
        if signal.info.executor_id == "mover":
            store.record_status(org="o", app="a", executor_id="mover", status=ExecutorStatus.HEALTHY,
                                operation="executor.superseded", event_key="mover/2",
                                connection_id=signal.connection_id, gateway_queue=signal.gateway_queue, details={},
                                info=signal.info)

    gateway = Gateway(settings=Settings(data_dir=tmp_path), store=store,
                      client=cast(Client, LandingClient(on_land=workflow_first)))
    moves = {outcome: _moves(outcome) for outcome in ("written", "already", "lost")}
    stages = {stage: _connected(stage) for stage in ("landed", "moved")}
    quick = _connected("moved", "_bucket", le="0.5")
    try:
        for executor_id in ("mover", "second"):
            conn = _held(gateway, executor_id, f"c-{executor_id}", landed=False)
            assert conn.signal is not None
            conn.signal.at = datetime.now(UTC) - timedelta(seconds=1)
            assert await gateway.signal_connected("o", "a", conn.signal)
        for executor_id in ("mover", "second"):
            row = store.registry_row("o", "a", executor_id)
            assert row is not None and row.connection_id == f"c-{executor_id}"
        assert {outcome: _moves(outcome) - before for outcome, before in moves.items()} == {
            "written": 1, "already": 1, "lost": 0}
        assert {stage: _connected(stage) - before for stage, before in stages.items()} == {"landed": 2, "moved": 1}
        assert _connected("moved", "_bucket", le="0.5") == quick  # from a handshake a second ago
    finally:
        store.engine.dispose()


def _connected(stage: str, suffix: str = "_count", **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(f"relay_gateway_connected_seconds{suffix}",
                                             {"stage": stage, **labels}) or 0.0


def _moving(tmp_path: Path) -> Store:
    """A store whose executor "mover" is HEALTHY under connection c-old on another gateway."""
    store = Store(make_engine(f"sqlite:///{tmp_path / 'relay.db'}"))
    store.ensure_app("o", "a")
    store.record_status(org="o", app="a", executor_id="mover", status=ExecutorStatus.HEALTHY,
                        operation="executor.healthy", event_key="mover/1", connection_id="c-old",
                        gateway_queue="relay-gateway-elsewhere", details={},
                        info=ExecutorInfo("mover", application_version="v1"))
    return store


def _moves(outcome: str) -> float:
    return metrics.REGISTRY.get_sample_value("relay_gateway_moves_total", {"outcome": outcome}) or 0.0


async def test_a_row_read_before_the_signal_but_handed_over_late_still_writes_the_move(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The event loop busy past the wait (a burst of handshakes; here a blocking call): the row was read on its
    thread before the signal was sent, so the move is written once the signal landed, not left to the workflow."""
    monkeypatch.setattr(runtime, "ROW_SEEN_WAIT", timedelta(milliseconds=50))
    store = _moving(tmp_path)
    rows_seen = store.rows_seen

    # Ordered by events, not by sleeps racing each other (under load the reading thread could start late):
    # the row is read, then handed over only once the loop is busy, and the loop stays busy until it was.
    blocked, returned = threading.Event(), threading.Event()

    def in_the_blocked_time(executors: list[tuple[str, str, str]]) -> dict[tuple[str, str, str], Any]:
        seen = rows_seen(executors)  # read before the signal is sent
        blocked.wait(10)  # handed over while the loop is busy, after the wait for it began
        returned.set()
        return seen

    def busy_loop() -> None:
        blocked.set()
        returned.wait(10)
        time.sleep(0.05)  # the reading thread stamps the read as it hands it over

    monkeypatch.setattr(store, "rows_seen", in_the_blocked_time)
    client = LandingClient()
    gateway = Gateway(settings=Settings(data_dir=tmp_path), store=store, client=cast(Client, client))
    unread, written = _moves("unread"), _moves("written")
    try:
        mover = _held(gateway, "mover", "c-here", landed=False)
        assert mover.signal is not None
        asyncio.get_running_loop().call_later(0.02, busy_loop)  # the loop, busy past the wait
        assert await gateway.signal_connected("o", "a", mover.signal)
        assert client.landed == ["c-here"] and mover.landed
        row = store.registry_row("o", "a", "mover")
        assert row is not None and (row.connection_id, row.gateway_queue) == ("c-here", gateway.task_queue)
        assert (_moves("unread"), _moves("written")) == (unread, written + 1)
    finally:
        store.engine.dispose()


async def test_a_row_read_only_after_the_signal_was_sent_is_not_used(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A read that came back after the signal was first sent may have seen the signal's own consequences: it is not
    compared against, the row is left to the workflow and the move counted ``unread``."""
    monkeypatch.setattr(runtime, "ROW_SEEN_WAIT", timedelta(milliseconds=100))
    store = _moving(tmp_path)
    rows_seen = store.rows_seen

    def slow(executors: list[tuple[str, str, str]]) -> dict[tuple[str, str, str], Any]:
        time.sleep(0.2)
        return rows_seen(executors)

    monkeypatch.setattr(store, "rows_seen", slow)
    client = LandingClient(delay=0.3)  # lands after the read came back
    gateway = Gateway(settings=Settings(data_dir=tmp_path), store=store, client=cast(Client, client))
    unread, written = _moves("unread"), _moves("written")
    try:
        mover = _held(gateway, "mover", "c-here", landed=False)
        assert mover.signal is not None and await gateway.signal_connected("o", "a", mover.signal)
        assert client.landed == ["c-here"] and mover.landed
        row = store.registry_row("o", "a", "mover")
        assert row is not None and row.connection_id == "c-old"
        assert (_moves("unread"), _moves("written")) == (unread + 1, written)
    finally:
        store.engine.dispose()


async def test_the_reading_thread_reads_the_next_batch_while_the_event_loop_is_busy(tmp_path: Path,
                                                                                     monkeypatch: pytest.MonkeyPatch
                                                                                     ) -> None:
    """A batch asked for while a query runs is read as soon as that query returns, on the reading thread, not once
    the event loop (busy with a burst of handshakes; here blocked for 0.6 s) has handed the first one over."""
    store = _moving(tmp_path)
    rows_seen, batches = store.rows_seen, []

    def slow(executors: list[tuple[str, str, str]]) -> dict[tuple[str, str, str], Any]:
        batches.append(sorted(executors))
        time.sleep(0.1)
        return rows_seen(executors)

    monkeypatch.setattr(store, "rows_seen", slow)
    reads = RowReads(store)
    loop = asyncio.get_running_loop()
    began = time.monotonic()
    first = asyncio.ensure_future(reads.seen(("o", "a", "mover")))
    await asyncio.sleep(0.05)  # the first query is running (it takes 0.1 s)
    second = asyncio.ensure_future(reads.seen(("o", "a", "new")))
    await asyncio.sleep(0)  # asked for
    loop.call_soon(time.sleep, 0.6)
    (row, first_at), (none, second_at) = await first, await second
    assert batches == [[("o", "a", "mover")], [("o", "a", "new")]]
    assert row is not None and row.connection_id == "c-old" and none is None
    assert first_at - began < 0.3 and second_at - began < 0.45  # both read inside the 0.6 s the loop was busy


async def test_a_reading_thread_that_died_does_not_stop_the_reads_after_it(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The reading thread ended by something no ``except Exception`` takes: that batch's waits time out, and the
    next read asked for starts the thread again rather than waiting on one that is gone."""
    store = _moving(tmp_path)
    rows_seen, calls = store.rows_seen, []

    class Died(BaseException):
        pass

    def dying_once(executors: list[tuple[str, str, str]]) -> dict[tuple[str, str, str], Any]:
        calls.append(executors)
        if len(calls) == 1:
            raise Died()
        return rows_seen(executors)

    monkeypatch.setattr(store, "rows_seen", dying_once)
    reads = RowReads(store)
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(reads.seen(("o", "a", "mover")), 0.3)
    row, _ = await asyncio.wait_for(reads.seen(("o", "a", "mover")), 5)
    assert row is not None and row.connection_id == "c-old" and len(calls) == 2


@pytest.mark.parametrize("heartbeat", [0.5, 2, 10, 60])
def test_the_default_fence_closes_sockets_before_the_gateway_can_be_declared_gone(tmp_path: Path,
                                                                                  heartbeat: float) -> None:
    settings = Settings(data_dir=tmp_path, gateway_heartbeat_timeout_secs=heartbeat)
    assert settings.gateway_fenced_by < settings.gateway_heartbeat_timeout


def test_a_fence_that_would_trip_after_the_probe_timeout_is_refused(tmp_path: Path) -> None:
    """Fence 9.5 s, heartbeat 10 s: the check that notices it comes up to 2 s later, after the probe's 10 s."""
    with pytest.raises(ValueError, match="must be shorter"):
        Settings(data_dir=tmp_path, gateway_heartbeat_timeout_secs=10, gateway_fence_secs=9.5)
    Settings(data_dir=tmp_path, gateway_heartbeat_timeout_secs=10, gateway_fence_secs=7.5)
