"""Closing executor sockets that lost their right to be open: their key was revoked, or their app deleted.

The gateway process that handles the REST call closes its own sockets at once; every gateway process also runs a
``watch`` loop that, every ``interval``, checks the keys and apps of the sockets it holds against the shared
database, so a revocation or deletion made through another gateway closes them too (within about ``interval``).
A closed socket is an ordinary disconnect: the WebSocket endpoint signals ``disconnected`` as for any other.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from datetime import timedelta

from sqlalchemy.exc import SQLAlchemyError

from gateway.errors import AuthError, ForbiddenError
from gateway.hub import Connection, Hub
from gateway.store import Store

log = logging.getLogger("relay.gateway")

REVOKED_REASON = "API key revoked"
APP_DELETED_REASON = "application deleted"


async def close_key_sockets(hub: Hub, key_ids: set[str]) -> int:
    """Close every socket of this process that authenticated with one of ``key_ids`` (close code 1008)."""
    return await _close([c for c in hub.connections() if c.key_id in key_ids], AuthError.close_code,
                        REVOKED_REASON)


async def close_app_sockets(hub: Hub, org: str, app: str) -> int:
    """Close every socket of this process that belongs to the app (close code 1008)."""
    return await _close([c for c in hub.connections() if (c.org, c.app) == (org, app)],
                        ForbiddenError.close_code, APP_DELETED_REASON)


async def _close(conns: list[Connection], code: int, reason: str) -> int:
    for conn in conns:
        log.info("closing executor %s of %s/%s: %s", conn.executor_id, conn.org, conn.app, reason)
        await conn.close(code, reason)
    return len(conns)


class Watcher:
    """Checks this process's sockets against the database: revoked keys, deleted (or re-created) apps."""

    def __init__(self, *, store: Store, hub: Hub) -> None:
        self._store = store
        self._hub = hub
        # The app id each socket was first seen with: an app deleted and registered again (by a reconnecting
        # executor, say) has a new id, and a socket of the old one must still close.
        self._app_id: dict[str, str] = {}

    async def sweep(self) -> int:
        """One check; returns how many sockets it closed."""
        conns = self._hub.connections()
        live = {c.connection_id for c in conns}
        self._app_id = {k: v for k, v in self._app_id.items() if k in live}
        if not conns:
            return 0
        revoked = await asyncio.to_thread(self._store.revoked_key_ids, {c.key_id for c in conns if c.key_id})
        app_ids = await asyncio.to_thread(self._store.app_ids, {(c.org, c.app) for c in conns})
        closed = await _close([c for c in conns if c.key_id in revoked], AuthError.close_code, REVOKED_REASON)
        gone = []
        for conn in conns:
            if conn.key_id in revoked:
                continue
            current = app_ids.get((conn.org, conn.app))
            first = self._app_id.setdefault(conn.connection_id, current or "")
            if current is None or current != first:
                gone.append(conn)
        return closed + await _close(gone, ForbiddenError.close_code, APP_DELETED_REASON)


@contextlib.asynccontextmanager
async def watch(*, store: Store, hub: Hub, interval: timedelta = timedelta(milliseconds=500)
                ) -> AsyncIterator[Watcher]:
    """Run a ``Watcher`` every ``interval`` for the duration of the block."""
    watcher = Watcher(store=store, hub=hub)

    async def loop() -> None:
        while True:
            await asyncio.sleep(interval.total_seconds())
            try:
                await watcher.sweep()
            except SQLAlchemyError as err:  # a locked or unreachable database: try again next round
                log.warning("revocation check failed: %s", err)
            except Exception:  # a bug here must not end the loop: revocation would silently stop working
                log.exception("revocation check failed")

    task = asyncio.create_task(loop(), name="relay-revocation-watch")
    try:
        yield watcher
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
