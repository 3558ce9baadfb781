"""One gateway process at run time: its settings, store, connection hub, Temporal client, its own task queue
(for socket-bound activities), the signals it sends to lifecycle workflows, its watch, and what it does when it
loses contact with Temporal (``gateway.contact``): fence itself, then reconcile once contact is back.

Signals are never dropped while the gateway lives: one that cannot be delivered is retried with capped backoff
until it lands or a newer connection of the same executor supersedes it (``SignalLanes``)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import hashlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from temporalio.client import Client, WorkflowHandle
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import PollerBehaviorAutoscaling, Worker

from core import gateways, metrics
from core.logs import OncePerWindow
from core.settings import Settings
from core.store import Move, RowSeen, Store
from gateway import revocation
from gateway.activities import HubActivities
from gateway.admission import Admission
from gateway.balance import Balancer
from gateway.contact import Change, Contact, ContactState
from gateway.hub import Connection, Hub
from gateway.management import Management
from gateway.signals import Read, RowReads, SignalLanes
from workflows.contracts.common import (
    GATEWAY_TASK_QUEUE_PREFIX,
    SHARED_TASK_QUEUE,
    ConnectedSignal,
    DisconnectedSignal,
    ExecutorStatus,
    gateway_workflow_id,
    lifecycle_search_attributes,
    lifecycle_workflow_id,
)
from workflows.contracts.gateway_watch import GatewayInput
from workflows.contracts.lifecycle import (
    LifecycleInput,
    PeerAvailableSignal,
    RemovedSignal,
    Signal,
    disconnect_event_key,
    wake_recoveries,
)
from workflows.gateway_watch import GatewayWorkflow
from workflows.lifecycle import ExecutorLifecycleWorkflow
from workflows.management import ManagementRequestWorkflow

log = logging.getLogger("relay.gateway")

# The gateway's activities all wait on sockets or clocks, not CPU (a burst of deaths holds a fence probe per
# executor until its grace ends): a slot each, many more than the SDK's default 100, so none waits for a slot
# long enough to look like a gateway gone.
MAX_CONCURRENT_ACTIVITIES = 2000
SIGNAL_BACKOFF_INITIAL = timedelta(milliseconds=200)
# Capped low: once Temporal is back, every held-back signal lands within about this long.
SIGNAL_BACKOFF_MAX = timedelta(seconds=2)
# A signal failing for minutes logs its first failure, then a line this often, not every attempt.
SIGNAL_FAILURE_LOG_EVERY = timedelta(minutes=1)
# Sockets closed by the fence: 1012 "Service Restart"; every SDK reconnects after any close.
FENCE_CLOSE_CODE = 1012
FENCE_CLOSE_REASON = "gateway lost contact with Temporal; reconnect"
FOUND_GONE_REASON = "gateway was found gone; reconnect"
# Sockets closed at the end of a SIGTERM's drain (``Gateway.step_down``): 1012 too.
RESTART_CLOSE_CODE = 1012
RESTART_CLOSE_REASON = "gateway restarting; reconnect"
# After closing them, how long the drain waits for the executors to answer the close (they do in milliseconds; a
# peer that does not is cut off by uvicorn's shutdown next).
CLOSE_WAIT = timedelta(seconds=2)
# After the watch ends (or could not be checked), look again this long later.
WATCH_RECHECK = timedelta(seconds=1)
# How long a ``connected`` waits for its executor's registry row to be read (``Gateway.signal_connected``), and how
# long after it landed the read may still be handed over (a read taken before the signal was sent but delivered late,
# behind a burst of handshakes, is still used): a slow database costs the early write of a move, never the signal's
# time.
ROW_SEEN_WAIT = timedelta(seconds=2)


async def _read_before(read: asyncio.Future[Read], sending_from: float) -> RowSeen | None | Exception:
    """The registry row as read before a signal was first sent (``sending_from``, on ``time.monotonic``), or why
    there is none: the read failed, did not come, or was taken after. A read taken in time but handed over late (the
    event loop busy with a burst of handshakes) still counts."""
    try:
        row, read_at = await asyncio.wait_for(read, ROW_SEEN_WAIT.total_seconds())
    except Exception as err:  # the database away or slow: the workflow writes the row when it takes it in
        return err
    if read_at >= sending_from:
        return TimeoutError("the row was read after the signal was sent")
    return row


def _retrieved(read: asyncio.Future[Read]) -> None:
    """A read's failure is counted where it is wanted (``_read_before``), and not wanted otherwise."""
    if not read.cancelled():
        read.exception()


def _since_handshake(stage: str, signal: ConnectedSignal) -> None:
    if signal.at is not None:
        metrics.CONNECTED.labels(stage).observe(max(0.0, (datetime.now(UTC) - signal.at).total_seconds()))


class Gateway:
    def __init__(self, *, settings: Settings, store: Store, client: Client) -> None:
        self.settings = settings
        self.store = store
        self.client = client
        self.hub = Hub()
        self.admission = Admission(
            clock=time.monotonic,
            max_connections_per_key=settings.max_connections_per_key,
            handshakes_per_second=settings.handshakes_per_key_per_second,
            allowed_origins=settings.origins,
        )
        self.task_queue = GATEWAY_TASK_QUEUE_PREFIX + uuid.uuid4().hex
        self.identity = settings.gateway_identity
        # Fenced, or found gone by its watch (``keep_watched``): its sockets are closed, and upgrades are refused
        # until it is watched again and no longer recorded gone.
        self.rejoining = False
        # SIGTERM (``step_down``): not ready, upgrades refused; the sockets it holds are kept until the drain ends.
        self.draining = False
        self._left = 0  # times its watch found it gone (``_leave``)
        self._background: set[asyncio.Task[None]] = set()
        self._lanes = SignalLanes()
        self._row_reads = RowReads(store)
        self.contact_state = ContactState(fence_after=settings.gateway_fence)
        self.management = Management(settings=settings, store=store, hub=self.hub, client=client,
                                     task_queue=self.task_queue)
        self.balancer = Balancer(settings=settings, store=store, hub=self.hub, task_queue=self.task_queue,
                                 accepting=lambda: not (self.draining or self.fenced),
                                 disconnect=self.spawn_disconnected)
        # A process runs one gateway (tests build several: the gauge follows the newest).
        metrics.CONNECTIONS.set_function(lambda: len(self.hub))

    @property
    def fenced(self) -> bool:
        """Out of contact with Temporal for the fence time, or found gone by its watch and not yet serving again:
        executor upgrades are refused."""
        return self.contact_state.fenced or self.rejoining

    @contextlib.asynccontextmanager
    async def registered(self) -> AsyncIterator[None]:
        """Serve under this process's identity for the block: the identity's lock (one process per identity on a
        host), this task queue recorded, and every earlier process of the identity recorded gone (it crashed: the
        fence will not wait on it)."""
        with _identity_lock(self.settings.data_dir, self.identity):
            earlier = await asyncio.to_thread(self.store.gateways.register, self.task_queue, self.identity)
            if earlier:
                log.info("gateway %s succeeds %s under the same identity: known gone, never probed again",
                         self.task_queue, ", ".join(earlier))
            yield

    async def step_down(self, drain: timedelta, cut_short: asyncio.Event) -> None:
        """SIGTERM: turn not ready and refuse upgrades at once (``draining``), keep the sockets for ``drain`` so the
        load balancer, its readiness checks failing, stops sending executors here while they are still served, then
        close them with 1012 so they reconnect through it to another gateway. ``cut_short`` (a second SIGTERM, a
        SIGINT) ends the wait early. Retiring comes after this, once uvicorn has stopped (``retire``)."""
        self.draining = True
        await self.balancer.stop()
        log.info("shutting down: not ready, upgrades refused; keeping %d executor sockets for %g s, then closing "
                 "them", len(self.hub), drain.total_seconds())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(cut_short.wait(), drain.total_seconds())
        held = len(self.hub)
        await self.close_all(RESTART_CLOSE_CODE, RESTART_CLOSE_REASON)
        # Each close is done when the executor answers it: its `disconnected` is sent then (``gateway.ws``).
        deadline = time.monotonic() + CLOSE_WAIT.total_seconds()
        while len(self.hub) and time.monotonic() < deadline:  # noqa: ASYNC110 - the hub has no event for "empty"
            await asyncio.sleep(0.05)
        log.info("drain over: closed %d executor sockets (%d still closing)", held, len(self.hub))

    async def retire(self) -> None:
        """Record this process gone, once its sockets are closed and no upgrade can come in, and before its worker
        stops (the hold its watch waits on ends then, and the watch must find it retired, not probe it). Best
        effort: if the database is away, its watch finds it gone a probe later, as for a crash. Fence probes held
        for a grace's end are answered then, "not held": asked again at the grace's end, the workflow finds this
        process gone instead of waiting out a probe its stopping worker would never answer."""
        try:
            await asyncio.to_thread(self.store.gateways.mark_gone, self.task_queue, gateways.RETIRED)
        except Exception as err:
            log.warning("could not record gateway %s as retired (%s); its watch will find it gone",
                        self.task_queue, type(err).__name__)
        self.hub.stop_holding()

    def worker(self) -> Worker:
        # Its one workflow: management requests routed here by other gateway processes, run with their local
        # activity in this process.
        return Worker(self.client, task_queue=self.task_queue, workflows=[ManagementRequestWorkflow],
                      activities=HubActivities(self.hub, self.contact_state.contact_for, self.store).all(),
                      max_concurrent_activities=MAX_CONCURRENT_ACTIVITIES,
                      # The SDK's default, at most 5 activity-task polls at once, let a burst of recovery requests
                      # and fence probes wait on the server past their schedule-to-start timeout (10 s) with slots
                      # free: scaled on the server's feedback, the polls keep up with the backlog. A probe left
                      # waiting that long counts its gateway gone.
                      activity_task_poller_behavior=PollerBehaviorAutoscaling())

    def contact(self) -> Contact:
        """The loop that checks Temporal; run it with ``contact().running()`` for the gateway's lifetime."""
        settings = self.settings
        return Contact(check=lambda: self.client.service_client.check_health(),
                       on_change=self._on_contact_change, state=self.contact_state,
                       target=self.client.service_client.config.target_host,
                       every=settings.gateway_contact_check, timeout=settings.gateway_contact_check_timeout)

    async def _on_contact_change(self, change: Change) -> None:
        if change is Change.FENCED:
            # Out of contact this long, its watch may find it gone: it serves again only once ``keep_watched``
            # has made sure it is not recorded gone.
            self.rejoining = True
            await self.close_all(FENCE_CLOSE_CODE, FENCE_CLOSE_REASON)
        elif change is Change.REGAINED:
            self.spawn(self.reconcile())
            self.spawn(self._rejoin_unless_gone())

    async def reconcile(self) -> None:
        """Make the registry agree with the sockets this process holds, after a time out of contact: each held
        socket whose ``connected`` landed HEALTHY under its current connection id (one still being sent lands by
        itself: resending it too only adds to the load that cost the contact), each executor placed here without a
        socket (HEALTHY or DISCONNECTED) disconnected.

        The registry may lag the workflows (writes are activities), so a mismatch can be one already on its way;
        resending is harmless: a ``connected`` for the recorded connection and a ``disconnected`` for a
        connection that is no longer current change nothing.
        """
        rows = await asyncio.to_thread(self.store.registry_on_gateway, self.task_queue)
        held = {(c.org, c.app, c.executor_id): c for c in self.hub.connections()}
        resent = gone = 0
        for key, conn in held.items():
            if conn.landed and rows.get(key) != (ExecutorStatus.HEALTHY, conn.connection_id):
                resent += 1
                self.spawn(self.resend_connected(conn))
        for (org, app, executor_id), (status, connection_id) in rows.items():
            # DISCONNECTED too: a close this process wrote while cut off, its signal perhaps lost with an earlier
            # incarnation of it (stale at the workflow if it was taken in).
            if (org, app, executor_id) not in held and status in (ExecutorStatus.HEALTHY, ExecutorStatus.DISCONNECTED):
                gone += 1
                self.spawn_disconnected(org, app, executor_id, connection_id)
        log.info("reconciled %d sockets with the registry: %d connected resent, %d disconnected sent",
                 len(held), resent, gone)

    async def resend_connected(self, conn: Connection) -> None:
        signal = conn.signal
        if signal is not None:
            await self.signal_connected(conn.org, conn.app, dataclasses.replace(signal, signal_id=str(uuid.uuid4())))

    async def start_watch(self) -> WorkflowHandle[GatewayWorkflow, object]:
        """Start the workflow that disconnects this gateway's executors if this process dies (once per id)."""
        try:
            return await self.client.start_workflow(
                GatewayWorkflow.run,
                GatewayInput(self.task_queue, heartbeat_timeout=self.settings.gateway_heartbeat_timeout),
                id=gateway_workflow_id(self.task_queue),
                task_queue=SHARED_TASK_QUEUE,
                static_summary=f"gateway process {self.task_queue}",
            )
        except WorkflowAlreadyStartedError:
            return self.client.get_workflow_handle_for(GatewayWorkflow.run, gateway_workflow_id(self.task_queue))

    @contextlib.asynccontextmanager
    async def watched(self) -> AsyncIterator[None]:
        """Start the watch (failing if Temporal cannot be reached now), then keep it running for the block."""
        await self.start_watch()
        task = asyncio.create_task(self.keep_watched(), name="relay-gateway-watch-keeper")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def keep_watched(self) -> None:
        """Restart the watch whenever it is not running: after an outage, after it completed, or if it failed. The
        workflow id keeps it to one per gateway.

        A watch that completed found this gateway gone (it was cut off, say) and recorded it so (``core.gateways``):
        the fence no longer probes it, so it must hold no socket. So whenever the watch (re)starts, this process
        looks at its record: recorded gone (or fenced meanwhile), it closes its sockets (the executors reconnect)
        and refuses upgrades until it has cleared the record."""
        while True:
            try:
                handle = await self.start_watch()
                await self._rejoin_if_gone()
                await handle.result()  # follows continue-as-new; returns only when the watch has ended
                log.warning("the watch of this gateway found it gone; closing its sockets until it is watched again")
                await self._leave()
            except asyncio.CancelledError:
                raise
            except Exception as err:  # Temporal or the database away: reported elsewhere; look again shortly
                log.debug("watch check failed: %s", err)
            await asyncio.sleep(WATCH_RECHECK.total_seconds())

    async def _rejoin_if_gone(self) -> None:
        gone = await asyncio.to_thread(self.store.gateways.gone_reason, self.task_queue)
        if gone is not None and not self.rejoining:
            await self._leave()  # recorded gone while it served: what it held may be recovered without a probe
        if self.rejoining:
            await asyncio.to_thread(self.store.gateways.revive, self.task_queue, self.identity)
            self.rejoining = False
            log.warning("gateway %s serves again%s", self.task_queue,
                        f" (it had been recorded gone: {gone})" if gone else "")

    async def _rejoin_unless_gone(self) -> None:
        """Back in contact after a fence: serve again at once, unless its watch recorded this process gone meanwhile
        (then ``keep_watched`` clears the record, and serves again, once the new watch runs)."""
        while self.rejoining and self.contact_state.in_contact:
            left = self._left
            try:
                gone = await asyncio.to_thread(self.store.gateways.gone_reason, self.task_queue)
            except Exception as err:  # the database away: the upgrades it would need fail anyway; look again
                log.debug("could not read this gateway's record: %s", err)
                await asyncio.sleep(WATCH_RECHECK.total_seconds())
                continue
            if gone is None and left == self._left:  # not found gone while it looked
                self.rejoining = False
            return

    async def _leave(self) -> None:
        self._left += 1
        self.rejoining = True
        await self.close_all(FENCE_CLOSE_CODE, FOUND_GONE_REASON)

    async def signal_connected(self, org: str, app: str, signal: ConnectedSignal) -> bool:
        """Signal-with-start the executor's lifecycle workflow. False when Temporal stayed unreachable.

        A HEALTHY executor's new socket (it moved here: its gateway died, or its old socket is being replaced) is
        also written to the registry once the signal landed (``Store.move_healthy``), over the row as it was read
        before the signal was sent: the registry names this gateway at once, not when the workflow gets to it."""
        executor_id = signal.info.executor_id
        landed = False

        async def send() -> None:
            nonlocal landed
            await self.client.start_workflow(
                ExecutorLifecycleWorkflow.run,
                LifecycleInput(org, app, executor_id, recovery_timeout=self.settings.recovery_timeout,
                               probe_timeout=self.settings.gateway_heartbeat_timeout),
                id=lifecycle_workflow_id(org, app, executor_id),
                task_queue=SHARED_TASK_QUEUE,
                start_signal=Signal.CONNECTED,
                start_signal_args=[signal],
                # HEALTHY from the start (the socket is open): the workflow's first record need not upsert it.
                search_attributes=lifecycle_search_attributes(org, app, executor_id, signal.info.application_version,
                                                              ExecutorStatus.HEALTHY.value),
                static_summary=f"DBOS executor {executor_id} of {org}/{app}",
            )
            landed = True

        async def send_then_move() -> bool:
            read = asyncio.ensure_future(self._row_reads.seen(key))
            read.add_done_callback(_retrieved)
            await asyncio.wait([read], timeout=ROW_SEEN_WAIT.total_seconds())
            sending_from = time.monotonic()
            sent = await self._retry(send, f"connected for {executor_id}",
                                     lambda: self._lanes.is_latest(key, connection_id))
            held = self._held(org, app, signal) if landed else None
            if held is None:
                read.cancel()
            else:
                held.landed = True
                _since_handshake("landed", signal)
                seen = await _read_before(read, sending_from)
                if isinstance(seen, Exception):
                    metrics.MOVES.labels("unread").inc()
                    log.debug("registry row of %s not read: %s", executor_id, seen)
                elif seen is not None and seen.status == ExecutorStatus.HEALTHY:
                    await self._move_healthy(org, app, signal, seen)
            return sent

        key, connection_id = (org, app, executor_id), signal.connection_id
        return await self._lanes.send(key, connection_id, connected=True, send=send_then_move)

    def _held(self, org: str, app: str, signal: ConnectedSignal) -> Connection | None:
        """The socket the signal is for, while this process holds it."""
        conn = self.hub.find(org, app, signal.info.executor_id)
        return conn if conn is not None and conn.connection_id == signal.connection_id else None

    async def _move_healthy(self, org: str, app: str, signal: ConnectedSignal, seen: RowSeen) -> None:
        """Best effort: whatever this does not write, the workflow writes when it takes the signal in."""
        try:
            move = await self.store.call(
                self.store.move_healthy, org=org, app=app, executor_id=signal.info.executor_id, seen=seen,
                connection_id=signal.connection_id, gateway_queue=signal.gateway_queue, info=signal.info)
        except Exception as err:
            log.debug("move of %s left to its workflow: %s", signal.info.executor_id, err)
            move = Move.LOST
        metrics.MOVES.labels(move.value).inc()
        if move == Move.WRITTEN:
            _since_handshake("moved", signal)

    def socket_closed(self, conn: Connection) -> None:
        """A registered executor socket closed: out of the hub, then its ``disconnected``, held back for the handoff
        when this gateway closed it to rebalance (``gateway.balance``), unless it is stopping."""
        self.hub.detach(conn)
        if conn.shed and not self.draining:
            self.balancer.hand_off(conn)
        else:
            self.spawn_disconnected(conn.org, conn.app, conn.executor_id, conn.connection_id)

    def spawn_disconnected(self, org: str, app: str, executor_id: str, connection_id: str) -> None:
        """Signal ``disconnected`` in the background (with retries) so closing a socket never waits on it."""
        signal = DisconnectedSignal(connection_id=connection_id, signal_id=str(uuid.uuid4()), at=datetime.now(UTC))

        async def send() -> None:
            handle = self.client.get_workflow_handle(lifecycle_workflow_id(org, app, executor_id))
            await handle.signal(ExecutorLifecycleWorkflow.disconnected, signal)

        key = (org, app, executor_id)
        self.spawn(self._lanes.send(key, connection_id, connected=False, send=lambda: self._retry(
            send, f"disconnected for {executor_id}", lambda: self._lanes.is_latest(key, connection_id))))
        if self.hub.find(org, app, executor_id) is None:  # else a newer socket here superseded this one: stale
            self.spawn(self._record_disconnect(org, app, executor_id, connection_id, signal.signal_id))

    async def _record_disconnect(self, org: str, app: str, executor_id: str, connection_id: str,
                                 signal_id: str) -> None:
        """The registry says DISCONNECTED as soon as the socket closed, not a workflow task later: the row the
        executor's lifecycle workflow writes on this signal, under the key the signal names
        (``Store.record_disconnect``: only over that workflow's HEALTHY row for this very socket). Best effort: the
        workflow writes it if this does not."""
        try:
            await self.store.call(self.store.record_disconnect, org=org, app=app, executor_id=executor_id,
                                  connection_id=connection_id,
                                  event_key=disconnect_event_key(org, app, executor_id, signal_id))
        except Exception as err:  # the database away: the workflow writes the row when the signal lands
            log.debug("DISCONNECTED of %s left to its workflow: %s", executor_id, err)

    def spawn(self, work: Awaitable[object]) -> None:
        """Run ``work`` in the background; ``drain`` waits for what is still running at shutdown."""
        task = asyncio.ensure_future(_drop(work))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _retry(self, send: Callable[[], Awaitable[None]], what: str, wanted: Callable[[], bool]) -> bool:
        """Send until it lands (True), the workflow has ended (False), or a newer connection of the same
        executor supersedes it (True: dropped as stale). Never gives up while the gateway lives."""
        delay = SIGNAL_BACKOFF_INITIAL
        failures = 0
        report = OncePerWindow(SIGNAL_FAILURE_LOG_EVERY)
        while wanted():
            try:
                await send()
                return True
            except RPCError as err:
                if err.status == RPCStatusCode.NOT_FOUND:
                    return False  # the workflow already ended: nothing to tell it
                failures += 1
                reason = err.message
            except Exception as err:  # whatever the client raises, the signal is kept
                failures += 1
                reason = f"{type(err).__name__}: {err}"
            # Out of contact, the contact loop has said so once: each held-back signal stays quiet.
            if self.contact_state.in_contact and report.due():
                log.warning("signal %s failed (attempt %d, retrying): %s", what, failures, reason)
            await asyncio.sleep(delay.total_seconds())
            delay = min(delay * 2, SIGNAL_BACKOFF_MAX)
        return True

    # -- what the REST API asks of its gateway: ``api/`` imports only this facade (``gateway/__init__.py``) ---------

    @contextlib.asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """The process's lifetime: its registration and worker, the revocation watch, the contact monitor and the
        watch run while the block does; then its sockets are closed, the signals in flight drained, and it
        retires."""
        async with (self.registered(), self.worker(),
                    revocation.watch(store=self.store, hub=self.hub, admission=self.admission),
                    self.contact().running(), self.watched(), self.balancer.running()):
            log.info("gateway ready; socket-bound activities on task queue %s", self.task_queue)
            yield
            await self.close_all()
            await self.drain()
            await self.retire()

    def connected_in(self, org: str, app: str) -> set[str]:
        """The executors of the app holding a socket on this gateway."""
        return {c.executor_id for c in self.hub.in_app(org, app)}

    async def close_app_sockets(self, org: str, app: str) -> int:
        """The app was deleted: close its sockets here (1008)."""
        return await revocation.close_app_sockets(self.hub, org, app)

    async def close_key_sockets(self, key_ids: set[str]) -> int:
        """Keys were revoked: close the sockets here that authenticated with them (1008)."""
        return await revocation.close_key_sockets(self.hub, key_ids)

    async def signal_removed(self, org: str, app: str, executor_id: str, signal: RemovedSignal) -> None:
        """End an executor's lifecycle without recovery (its app is deleted). Raises the client's ``RPCError``."""
        handle = self.client.get_workflow_handle(lifecycle_workflow_id(org, app, executor_id))
        await handle.signal(ExecutorLifecycleWorkflow.removed, signal)

    async def lifecycle_ended(self, org: str, app: str, executor_id: str) -> None:
        """Returns once the executor's lifecycle workflow has ended, however it ended."""
        try:
            await self.client.get_workflow_handle(lifecycle_workflow_id(org, app, executor_id)).result()
        except Exception as err:  # failed, cancelled, terminated: ended all the same
            log.debug("lifecycle of %s/%s/%s ended with %s", org, app, executor_id, err)

    async def wake_recoveries(self, org: str, app: str, dead: list[str], signal: PeerAvailableSignal) -> None:
        """Tell DEAD executors' workflows a peer may be available (as a peer turning HEALTHY does); best effort: a
        workflow not told looks again on its own within minutes."""
        await wake_recoveries(self.client, org, app, dead, signal)

    async def close_all(self, code: int = 1001, reason: str = "gateway shutting down") -> None:
        for conn in self.hub.connections():
            await conn.close(code, reason)

    async def drain(self, timeout: timedelta = timedelta(seconds=10)) -> None:
        """Wait for in-flight ``disconnected`` signals (held-back ones sent first) before the process exits."""
        await self.balancer.stop()
        if self._background:
            await asyncio.wait(list(self._background), timeout=timeout.total_seconds())


@contextlib.contextmanager
def _identity_lock(data_dir: Path, identity: str) -> Iterator[None]:
    """One live process per gateway identity on this host (an advisory lock the kernel drops when the process
    dies): a second one would record the first gone while it still holds sockets."""
    data_dir.mkdir(parents=True, exist_ok=True)
    name = hashlib.sha256(identity.encode()).hexdigest()[:16]
    with open(data_dir / f"gateway-{name}.lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RuntimeError(f"another gateway process on this host runs under identity {identity!r}: give each "
                               "its own RELAY_GATEWAY_ID (or RELAY_PORT)") from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


async def _drop(work: Awaitable[object]) -> None:
    try:
        await work
    except Exception:
        log.exception("background work failed")


