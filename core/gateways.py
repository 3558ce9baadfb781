"""Which gateway processes are known gone (the ``gatewayprocess`` table), so the fence never waits on one.

The fence (``workflows.fence``) asks a gateway on its own task queue whether it holds an executor's socket, and
counts it gone only when the question is not picked up within the probe's timeout. For a gateway that is already
known to be gone, that wait is pure delay: every DEAD and every recovery request behind it comes a probe timeout
late. So a process is recorded as gone, durably (Relay's database outlives Temporal's state), when:

- its watch found it gone (``workflows.gateway_watch``: heartbeats stopped and a probe went unanswered);
- it retired: on SIGTERM, after its sockets are closed and no new one can come in;
- a successor started under the same identity (``RELAY_GATEWAY_ID``): the previous incarnation crashed.

A process marked gone holds no socket: a gateway its watch found gone has fenced itself (closed its sockets)
before the probe timed out; one that retired or was succeeded is no longer serving. The mark is cleared only by
the process itself (``revive``), back in contact with Temporal, after closing whatever sockets it still held and
before it accepts another: from then on the fence probes it again, as any live gateway.

Rows are per process (per task queue); a row gone for longer than ``KEEP_GONE`` is deleted when a gateway starts. A
queue with no row is not known gone: the fence probes it, as before this table existed.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from sqlalchemy import Engine, bindparam
from sqlalchemy import delete as sa_delete
from sqlalchemy import update as sa_update
from sqlmodel import Session, col, select

from core.models import GatewayProcess
from core.store.base import InsertOnce
from core.units import utcnow

# Long past any grace or blocked recovery that could still name the queue; a queue forgotten is merely probed.
KEEP_GONE = timedelta(days=30)
RESTARTED = "restarted"
RETIRED = "retired"
WATCH = "its watch found it gone"
# A queue's row is written by the process itself (``register``, ``revive``) and by whoever finds it gone
# (``mark_gone``: its watch, its own retirement, a successor), possibly at once: each inserts it if absent.
_PROCESSES = InsertOnce(GatewayProcess, "queue")
_GONE = select(col(GatewayProcess.gone_at), col(GatewayProcess.gone_reason)).where(
    col(GatewayProcess.queue) == bindparam("queue"))


class GatewayRegistry:
    """The ``gatewayprocess`` rows, on the store's engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def register(self, queue: str, identity: str) -> list[str]:
        """A process starts serving on ``queue`` under ``identity``: record it, and mark every earlier process of
        the same identity gone (it crashed, or it would still hold the identity's lock). Returns their queues."""
        now = utcnow()
        with Session(self.engine) as s:
            s.exec(sa_delete(GatewayProcess).where(col(GatewayProcess.gone_at) < now - KEEP_GONE))
            earlier = s.exec(select(GatewayProcess).where(GatewayProcess.identity == identity,
                                                          GatewayProcess.queue != queue,
                                                          col(GatewayProcess.gone_at).is_(None))).all()
            for row in earlier:
                row.gone_at, row.gone_reason = now, f"{RESTARTED}: succeeded by {queue}"
                s.add(row)
            if not _PROCESSES(s.connection(), GatewayProcess(queue=queue, identity=identity, started_at=now)):
                s.exec(sa_update(GatewayProcess).where(col(GatewayProcess.queue) == queue)
                       .values(gone_at=None, gone_reason=""))
            s.commit()
            return sorted(row.queue for row in earlier)

    def mark_gone(self, queue: str, reason: str) -> bool:
        """Record ``queue``'s process as gone; True when this call marked it (it was not already)."""
        now = utcnow()
        with self.engine.begin() as c:
            if _PROCESSES(c, GatewayProcess(queue=queue, identity="", gone_at=now, gone_reason=reason)):
                return True
            # One UPDATE, so of two marks at once only one finds the row not gone yet.
            return c.execute(sa_update(GatewayProcess).where(col(GatewayProcess.queue) == queue,
                                                             col(GatewayProcess.gone_at).is_(None))
                             .values(gone_at=now, gone_reason=reason)).rowcount == 1

    def revive(self, queue: str, identity: str) -> str | None:
        """The process on ``queue`` is back and serving again (it closed the sockets it held first): clear its
        mark. Returns the reason it had been marked gone, or None when it was not."""
        with Session(self.engine) as s:
            # Inserted when there is none: a database restored from before this process started.
            row = _PROCESSES.lock(s, GatewayProcess(queue=queue, identity=identity))
            if row.gone_at is None:
                s.commit()
                return None
            reason = row.gone_reason or "gone"
            row.gone_at, row.gone_reason = None, ""
            s.add(row)
            s.commit()
            return reason

    def gone_reason(self, queue: str) -> str | None:
        """Why ``queue``'s process is known gone, or None when it is not (or is unknown: then it is probed)."""
        with self.engine.connect() as c:  # a plain row: asked twice a death, in a burst under SQLite's one thread
            row = c.execute(_GONE, {"queue": queue}).first()
        return None if row is None or row.gone_at is None else (row.gone_reason or "gone")

    def report(self, queue: str, *, sockets: int, accepting: bool) -> None:
        """What ``queue``'s process tells its peers (``gateway.balance``): the executor sockets it holds and whether it
        takes new ones. Only over its own row, never one known gone (a process marked gone holds no socket)."""
        with Session(self.engine) as s:
            s.exec(sa_update(GatewayProcess)
                   .where(col(GatewayProcess.queue) == queue, col(GatewayProcess.gone_at).is_(None))
                   .values(sockets=sockets, accepting=accepting, reported_at=utcnow()))
            s.commit()

    def live_counts(self, fresh: timedelta) -> dict[str, tuple[int, datetime]]:
        """The executor sockets of every process that takes new ones, and when it said so, by queue: not known gone,
        accepting, and reported within ``fresh`` (one that stopped reporting, crashed or cut off, is not counted)."""
        with Session(self.engine) as s:
            rows = s.exec(select(GatewayProcess.queue, GatewayProcess.sockets, GatewayProcess.reported_at).where(
                col(GatewayProcess.gone_at).is_(None), col(GatewayProcess.accepting).is_(True),
                col(GatewayProcess.reported_at) >= utcnow() - fresh)).all()
        return {queue: (sockets, at) for queue, sockets, at in rows if at is not None}
