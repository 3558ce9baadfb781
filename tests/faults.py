"""Fault injection for the outage tests, and the checker of the invariants a run must keep.

- ``TcpProxy``: a TCP proxy in a background thread that can be cut (connections reset and new ones refused, or
  blackholed: held open with every byte dropped) and restored. ``LoadBalancer``: the same with several backends,
  one picked round-robin per new connection, any of them markable down.
- ``freeze`` / ``thaw`` / ``frozen``: SIGSTOP and SIGCONT by PID (a process that is there but answers nothing).
- ``RunHistory`` / ``violations`` / ``wait_for_invariants``: what Relay did during a run (audit rows, registry,
  recovery requests the peers received, running gateway watches) checked against Relay's rules under faults: no executor
  with a live socket is ever DEAD or named in a recovery request; each that left for good is recovered exactly
  once; the registry ends equal to reality; one watch per live gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import signal
import socket
import sqlite3
import struct
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Self, TypeVar

from tests.support import AuditRow, RawPeer, audit_rows, free_port, wait_until

T = TypeVar("T")

# -- TCP proxy and stand-in load balancer ------------------------------------------------------------------------


class Cut(enum.Enum):
    """How a cut proxy treats connections."""

    RESET = "reset"  # current connections reset (RST); new ones accepted and reset at once: "connection refused"
    BLACKHOLE = "blackhole"  # connections held open, every byte dropped both ways; new ones accepted, same fate


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with an RST rather than a FIN, as a peer whose host vanished or a firewall rejecting would."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


@dataclass(eq=False)
class _Link:
    """One proxied connection: the client's side and (once connected) the backend's."""

    client: asyncio.StreamWriter
    backend: int | None = None
    upstream: asyncio.StreamWriter | None = None
    blackholed: bool = False

    def reset(self) -> None:
        for writer in (self.client, self.upstream):
            if writer is not None:
                _reset(writer)

    def close(self) -> None:
        """One side gone: so is the other, as with a direct connection."""
        for writer in (self.client, self.upstream):
            if writer is not None and not writer.transport.is_closing():
                writer.close()


class TcpProxy:
    """Forwards every connection on ``127.0.0.1:port`` to a backend, until ``cut()``; ``restore()`` undoes it.

    A cut in ``Cut.RESET`` mode resets every current connection and resets each new one as soon as it is accepted
    (the listener stays bound, so no other process can take the port meanwhile). In ``Cut.BLACKHOLE`` mode the
    connections stay open and every byte either way is silently dropped, as on a partitioned network: the
    endpoints learn nothing until their own timeouts fire. A blackholed connection has lost bytes, so its stream
    cannot be resumed: ``restore()`` resets it, and new connections go through again.
    """

    def __init__(self, *backends: int | tuple[str, int], port: int | None = None, name: str = "proxy") -> None:
        if not backends:
            raise ValueError("a proxy needs at least one backend")
        self.name = name
        self.backends = [("127.0.0.1", b) if isinstance(b, int) else b for b in backends]
        self.port = port if port is not None else free_port()
        self.cut_mode: Cut | None = None
        self.per_backend = [0] * len(self.backends)  # connections forwarded to each backend
        self._down: set[int] = set()
        self._next = 0
        self._links: set[_Link] = set()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name=f"tcp-{name}", daemon=True)
        self._thread.start()
        self._server: asyncio.Server = self._call(self._listen())

    @property
    def address(self) -> str:
        """``host:port`` (RELAY_TEMPORAL_ADDRESS, say)."""
        return f"127.0.0.1:{self.port}"

    @property
    def ws_url(self) -> str:
        """The base URL an executor would use as its conductor URL."""
        return f"ws://127.0.0.1:{self.port}/"

    def cut(self, mode: Cut = Cut.RESET) -> None:
        """Cut every connection, current and new, the way ``mode`` says."""
        self._call(self._cut(mode))

    def restore(self) -> None:
        """Forward again; connections blackholed meanwhile are reset (their streams lost bytes)."""
        self._call(self._restore())

    def stop(self) -> None:
        """Close the listener and every connection, and end the thread."""
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- inside the proxy's loop -----------------------------------------------------------------------------

    def _call(self, work: Coroutine[Any, Any, T], timeout: float = 10) -> T:
        return asyncio.run_coroutine_threadsafe(work, self._loop).result(timeout)

    async def _listen(self) -> asyncio.Server:
        return await asyncio.start_server(self._handle, "127.0.0.1", self.port, reuse_address=True)

    def _pick(self) -> int | None:
        """The next backend that is not down, round-robin over all of them."""
        for _ in range(len(self.backends)):
            index, self._next = self._next, (self._next + 1) % len(self.backends)
            if index not in self._down:
                return index
        return None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)
        link = _Link(writer)
        if self.cut_mode is Cut.RESET:
            link.reset()
            return
        self._links.add(link)
        try:
            if self.cut_mode is Cut.BLACKHOLE:
                link.blackholed = True
                await self._pump(reader, None, link)
                return
            index = self._pick()
            if index is None:
                link.reset()
                return
            try:
                up_reader, link.upstream = await asyncio.open_connection(*self.backends[index])
            except OSError:
                link.reset()  # a backend that is not there: the client sees a refused connection
                return
            link.backend = index
            self.per_backend[index] += 1
            if self.cut_mode is not None:  # cut while connecting
                link.blackholed = self.cut_mode is Cut.BLACKHOLE
                if self.cut_mode is Cut.RESET:
                    link.reset()
                    return
            await asyncio.gather(self._pump(reader, link.upstream, link), self._pump(up_reader, writer, link))
        finally:
            self._links.discard(link)
            link.close()

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter | None, link: _Link) -> None:
        try:
            while data := await src.read(65536):
                if link.blackholed or dst is None:
                    continue
                dst.write(data)
                await dst.drain()
        except (OSError, RuntimeError):
            pass
        finally:
            link.close()

    async def _cut(self, mode: Cut) -> None:
        self.cut_mode = mode
        for link in list(self._links):
            if mode is Cut.RESET:
                link.reset()
            else:
                link.blackholed = True

    async def _restore(self) -> None:
        self.cut_mode = None
        for link in list(self._links):
            if link.blackholed:
                link.reset()

    async def _shutdown(self) -> None:
        self._server.close()
        for link in list(self._links):
            link.reset()
        if self._handlers:  # let each connection's handler see its reset and end, so none is left pending
            _, pending = await asyncio.wait(list(self._handlers), timeout=2)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        await self._server.wait_closed()


class LoadBalancer(TcpProxy):
    """A stand-in load balancer: each new connection goes to the next backend round-robin, skipping those
    marked down (an executor refused by one gateway lands on another at its next attempt). Marking a backend
    down, as a failed health check would, leaves its current connections alone."""

    def __init__(self, *backends: int | tuple[str, int], port: int | None = None, name: str = "lb") -> None:
        super().__init__(*backends, port=port, name=name)

    def mark_down(self, index: int) -> None:
        self._loop.call_soon_threadsafe(self._down.add, index)

    def mark_up(self, index: int) -> None:
        self._loop.call_soon_threadsafe(self._down.discard, index)


# -- processes ----------------------------------------------------------------------------------------------------


def freeze(pid: int, *, group: bool = False) -> None:
    """SIGSTOP the process (its whole process group with ``group``): it holds its sockets and answers nothing."""
    (os.killpg if group else os.kill)(pid, signal.SIGSTOP)
    wait_until(lambda: process_state(pid) == "T", timeout=5, interval=0.01, what=f"{pid} stopped")


def thaw(pid: int, *, group: bool = False) -> None:
    """SIGCONT what ``freeze`` stopped (nothing if it has gone meanwhile)."""
    with contextlib.suppress(ProcessLookupError):
        (os.killpg if group else os.kill)(pid, signal.SIGCONT)


@dataclass
class Freeze:
    """``thawed_at``: the epoch second read just before SIGCONT, the earliest anyone may hear the process again (read
    after it, the clock of a test process that is one of several on two cores can trail a peer that already heard
    it: CI saw 0.01 s)."""

    thawed_at: float = 0.0


@contextlib.contextmanager
def frozen(pid: int, *, group: bool = False) -> Iterator[Freeze]:
    """Frozen for the block; thawed however it ends (a test failing mid-freeze must not leave it stopped)."""
    freeze(pid, group=group)
    state = Freeze()
    try:
        yield state
    finally:
        state.thawed_at = time.time()
        thaw(pid, group=group)


def process_state(pid: int) -> str | None:
    """The kernel's one-letter state (R, S, T for stopped, Z...), None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]


# -- the invariants -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecoveryRequest:
    """A ``recovery`` request one peer received."""

    peer: str
    executor_ids: tuple[str, ...]
    answered_success: bool = True


@dataclass(frozen=True)
class RegistryRow:
    status: str
    gateway_queue: str | None = None


@dataclass
class RunHistory:
    """What Relay did during a run, and what the test knows was true.

    ``stayed``: executors that kept a live socket, or regained one within the grace (however long Relay could
    not hear them). ``left``: executors that left for good. ``earliest_dead``: per executor that left, the epoch
    second before which it must not be DEAD (a grace after the later of its leaving and Relay regaining contact).
    ``live_gateway_queues``: the task queues of the gateways alive at the end (None: check only ``live_gateways``).
    """

    app: str
    stayed: frozenset[str]
    left: frozenset[str]
    audit: list[AuditRow]
    registry: dict[str, RegistryRow]
    recovery_requests: list[RecoveryRequest]
    watches: list[str]
    live_gateways: int
    live_gateway_queues: frozenset[str] | None = None
    earliest_dead: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Violation:
    """A rule broken. ``safety``: it can never be mended by waiting (a live executor declared DEAD); otherwise
    the run may simply not have settled yet (a recovery still under way)."""

    rule: str
    detail: str
    safety: bool
    executor_id: str | None = None

    def __str__(self) -> str:
        return f"[{'SAFETY' if self.safety else 'liveness'}] {self.rule}: {self.detail}"


RECOVERY_NAMING = ("executor.dead", "executor.recovery.dispatched", "executor.recovery.succeeded", "executor.deleted")


def violations(run: RunHistory) -> list[Violation]:
    """Every rule the run breaks (empty: it keeps them all)."""
    return [*_live_never_recovered(run), *_left_recovered_once(run), *_registry_is_reality(run), *_one_watch(run)]


def _ops(run: RunHistory, executor_id: str, operation: str) -> list[AuditRow]:
    return [r for r in run.audit if r.executor_id == executor_id and r.operation == operation]


def _requests_naming(run: RunHistory, executor_id: str) -> list[RecoveryRequest]:
    return [r for r in run.recovery_requests if executor_id in r.executor_ids]


def _live_never_recovered(run: RunHistory) -> Iterator[Violation]:
    rule = "no executor with a live socket is DEAD or recovered"
    for executor_id in sorted(run.stayed):
        for op in RECOVERY_NAMING:
            for row in _ops(run, executor_id, op):
                yield Violation(rule, f"{executor_id} (live) has {op} at {_when(row.emit_time)} {row.details}",
                                True, executor_id)
        for request in _requests_naming(run, executor_id):
            yield Violation(rule, f"{executor_id} (live) named in a recovery request to {request.peer}", True,
                            executor_id)


def _left_recovered_once(run: RunHistory) -> Iterator[Violation]:
    rule = "every executor that left for good is recovered exactly once"
    for executor_id in sorted(run.left):
        answered = [r for r in _requests_naming(run, executor_id) if r.answered_success]
        succeeded = _ops(run, executor_id, "executor.recovery.succeeded")
        deleted = _ops(run, executor_id, "executor.deleted")
        dead = _ops(run, executor_id, "executor.dead")
        for what, count in (("recovery requests answered success", len(answered)),
                            ("executor.recovery.succeeded rows", len(succeeded)),
                            ("executor.deleted rows", len(deleted)), ("executor.dead rows", len(dead))):
            if count > 1:
                yield Violation(rule, f"{executor_id}: {count} {what}", True, executor_id)
        not_before = run.earliest_dead.get(executor_id)
        for row in dead:
            if not_before is not None and row.emit_time < not_before:
                yield Violation("the grace counts only time Relay could hear", f"{executor_id} DEAD at "
                                f"{_when(row.emit_time)}, {not_before - row.emit_time:.2f} s before a full grace "
                                f"after it left and Relay could hear it again ({_when(not_before)})", True,
                                executor_id)
        # Only raw peers' requests are visible; a run recovered through real executors shows in the audit alone.
        if (run.recovery_requests and not answered) or not succeeded or not deleted \
                or executor_id in run.registry:
            yield Violation(rule, f"{executor_id} not recovered (yet): {len(answered)} requests, "
                            f"{len(succeeded)} succeeded, {len(deleted)} deleted, registry "
                            f"{run.registry.get(executor_id)}", False, executor_id)


def _registry_is_reality(run: RunHistory) -> Iterator[Violation]:
    rule = "the registry equals reality"
    actual = {e: row.status for e, row in run.registry.items()}
    expected = dict.fromkeys(run.stayed, "HEALTHY")
    if actual != expected:
        diff = {e: (actual.get(e), expected.get(e)) for e in sorted(set(actual) | set(expected))
                if actual.get(e) != expected.get(e)}
        yield Violation(rule, f"registry vs reality (executor: (registry, reality)): {diff}", False)
    if run.live_gateway_queues is not None:
        for executor_id in sorted(run.stayed & set(run.registry)):
            queue = run.registry[executor_id].gateway_queue
            if queue not in run.live_gateway_queues:
                yield Violation(rule, f"{executor_id} placed on {queue}, not a live gateway", False, executor_id)


def _one_watch(run: RunHistory) -> Iterator[Violation]:
    rule = "one running watch per live gateway"
    if run.live_gateway_queues is not None:
        from workflows.contracts.common import gateway_workflow_id

        expected = sorted(gateway_workflow_id(q) for q in run.live_gateway_queues)
        if sorted(run.watches) != expected:
            yield Violation(rule, f"running watches {sorted(run.watches)}, expected {expected}", False)
    elif len(run.watches) != run.live_gateways:
        yield Violation(rule, f"{len(run.watches)} running watches for {run.live_gateways} live gateways", False)


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%H:%M:%S.%f")[:-3]


# -- collecting a run's history, and waiting for it to keep the rules ----------------------------------------------


def registry_rows(data_dir: Path, app: str) -> dict[str, RegistryRow]:
    """Executor id → status and gateway queue, from Relay's database (works while no gateway runs)."""
    with contextlib.closing(sqlite3.connect(data_dir / "relay.db", timeout=10)) as db:
        rows = db.execute("SELECT executor_id, status, gateway_queue FROM executor WHERE app = ?", (app,)).fetchall()
    return {str(e): RegistryRow(str(s), q) for e, s, q in rows}


def recovery_requests(peers: Iterable[RawPeer]) -> list[RecoveryRequest]:
    """The ``recovery`` requests raw peers received (a RawPeer with the default answer says success)."""
    out = []
    for peer in peers:
        for request in peer.requests_of("recovery"):
            ids = request.get("executor_ids")
            out.append(RecoveryRequest(peer.executor_id, tuple(str(i) for i in ids) if isinstance(ids, list) else ()))
    return out


WATCH_QUERY = "WorkflowType = 'GatewayWorkflow' AND ExecutionStatus = 'Running'"


def running_watches(temporal_address: str, namespace: str = "default") -> list[str]:
    """The ids of the running gateway-watch workflows (visibility; the dev server's is close to immediate)."""
    from core.temporal import connect

    async def listing() -> list[str]:
        client = await connect(temporal_address, namespace)
        return [w.id async for w in client.list_workflows(WATCH_QUERY)]

    return asyncio.run(listing())


@dataclass
class Observed:
    """Where to read a run from: Relay's data dir, the raw peers, Temporal; and what the test knows."""

    data_dir: Path
    app: str
    temporal_address: str
    stayed: Iterable[str]
    left: Iterable[str]
    peers: Iterable[RawPeer] = ()
    live_gateways: int = 1
    live_gateway_queues: Iterable[str] | None = None
    earliest_dead: dict[str, float] = field(default_factory=dict)

    def collect(self) -> RunHistory:
        return RunHistory(
            app=self.app, stayed=frozenset(self.stayed), left=frozenset(self.left),
            audit=audit_rows(self.data_dir, self.app), registry=registry_rows(self.data_dir, self.app),
            recovery_requests=recovery_requests(self.peers), watches=running_watches(self.temporal_address),
            live_gateways=self.live_gateways,
            live_gateway_queues=None if self.live_gateway_queues is None else frozenset(self.live_gateway_queues),
            earliest_dead=dict(self.earliest_dead),
        )


def wait_for_invariants(collect: Callable[[], RunHistory], *, timeout: float, interval: float = 0.5) -> RunHistory:
    """Collect until the run keeps every rule; fail at once on a safety violation, or at ``timeout`` with what is
    still broken. The failure shows the violations, the audit trail, the registry and the watches."""
    deadline = time.monotonic() + timeout
    while True:
        run = collect()
        broken = violations(run)
        if not broken:
            return run
        if any(v.safety for v in broken) or time.monotonic() > deadline:
            raise AssertionError(report(run, broken))
        time.sleep(interval)


def report(run: RunHistory, broken: list[Violation]) -> str:
    """The violations, then the app's audit trail (times relative to its first row), registry and watches."""
    start = run.audit[0].emit_time if run.audit else 0.0
    lines = [f"{len(broken)} invariant(s) broken in app {run.app!r}:", *(f"  {v}" for v in broken),
             f"stayed={sorted(run.stayed)} left={sorted(run.left)}", "audit (s since first row):"]
    lines += [f"  {r.emit_time - start:7.2f} {r.operation:32} {r.executor_id or '-':12} {_brief(r.details)}"
              for r in run.audit]
    lines.append(f"registry: { {e: (r.status, r.gateway_queue) for e, r in sorted(run.registry.items())} }")
    lines.append(f"recovery requests: {[(r.peer, r.executor_ids) for r in run.recovery_requests]}")
    lines.append(f"running watches: {run.watches} (live gateways: {sorted(run.live_gateway_queues or ())} "
                 f"/ {run.live_gateways})")
    return "\n".join(lines)


def _brief(details: dict[str, object]) -> str:
    keep = ("candidate", "attempt", "reason", "previous_status", "executorTimeoutSecs", "recovered_by", "connection_id")
    return ", ".join(f"{k}={str(details[k])[:60]}" for k in keep if k in details)
