"""Closing executor sockets that lost their right to be open: their key was revoked, or their app deleted.

The gateway process that handles the REST call closes its own sockets at once; every gateway process also runs a
``watch`` loop that, every ``interval``, checks the keys and apps of the sockets it holds against the shared
database, so a revocation or deletion made through another gateway closes them too (within about ``interval``).
A closed socket is an ordinary disconnect: the WebSocket endpoint signals ``disconnected`` as for any other.

The same sweep refreshes the hashes of the live keys that admission refuses unknown keys against, so a flood of
wrong keys costs a set look-up each, not a database trip (see ``Admission.check_key``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from datetime import timedelta

from sqlalchemy.exc import SQLAlchemyError

from core.errors import AuthError, ForbiddenError
from core.logs import OncePerWindow
from core.store import Store, outage
from gateway.admission import Admission
from gateway.hub import Connection, Hub

log = logging.getLogger("relay.gateway")

REVOKED_REASON = "API key revoked"
DB_FAILURE_REPORT_EVERY = timedelta(minutes=1)
APP_DELETED_REASON = "application deleted"


async def close_key_sockets(hub: Hub, key_ids: set[str]) -> int:
    """Close every socket of this process that authenticated with one of ``key_ids`` (close code 1008)."""
    return await _close([c for key_id in key_ids for c in hub.with_key(key_id)], AuthError.close_code,
                        REVOKED_REASON)


async def close_app_sockets(hub: Hub, org: str, app: str) -> int:
    """Close every socket of this process that belongs to the app (close code 1008)."""
    return await _close(hub.in_app(org, app), ForbiddenError.close_code, APP_DELETED_REASON)


async def _close(conns: list[Connection], code: int, reason: str) -> int:
    for conn in conns:
        log.info("closing executor %s of %s/%s: %s", conn.executor_id, conn.org, conn.app, reason)
        await conn.close(code, reason)
    return len(conns)


class Watcher:
    """Checks this process's sockets against the database: revoked keys, deleted (or re-created) apps.

    A sweep costs one trip to the database (three small queries) and work per key and per app held, not per
    socket: it runs every half second on a gateway holding thousands of idle executors. With ``admission``, it
    also refreshes ``admission.live_keys``.
    """

    def __init__(self, *, store: Store, hub: Hub, admission: Admission | None = None) -> None:
        self._store = store
        self._hub = hub
        self._admission = admission

    async def sweep(self) -> int:
        """One check; returns how many sockets it closed."""
        key_ids, apps = self._hub.key_ids() - {""}, self._hub.apps()
        revoked, app_ids, live = await asyncio.to_thread(self._read, key_ids, apps)
        if self._admission is not None and live is not None:
            self._admission.live_keys = live
        if not apps:
            return 0
        closed = await close_key_sockets(self._hub, revoked)
        gone = []
        for org, app in apps:
            current = app_ids.get((org, app))
            if current is None:
                gone += self._hub.in_app(org, app)
            elif self._hub.app_ids_in(org, app) - {current, ""}:
                # A socket accepted before the app was deleted and registered again belongs to the old app.
                gone += [c for c in self._hub.in_app(org, app) if c.app_id and c.app_id != current]
        gone = [c for c in gone if c.key_id not in revoked]
        return closed + await _close(gone, ForbiddenError.close_code, APP_DELETED_REASON)

    def _read(self, key_ids: set[str], apps: set[tuple[str, str]]
              ) -> tuple[set[str], dict[tuple[str, str], str], frozenset[str] | None]:
        """In the database thread: revoked keys, registered apps, and the live key hashes (when they are kept)."""
        live = self._store.live_key_hashes() if self._admission is not None else None
        if not apps:
            return set(), {}, live
        revoked, app_ids = self._store.still_valid(key_ids, apps)
        return revoked, app_ids, live


@contextlib.asynccontextmanager
async def watch(*, store: Store, hub: Hub, admission: Admission | None = None,
                interval: timedelta = timedelta(milliseconds=500)) -> AsyncIterator[Watcher]:
    """Run a ``Watcher`` every ``interval`` for the duration of the block."""
    watcher = Watcher(store=store, hub=hub, admission=admission)

    async def loop() -> None:
        failures = OncePerWindow(DB_FAILURE_REPORT_EVERY, clock=asyncio.get_running_loop().time)
        while True:
            await asyncio.sleep(interval.total_seconds())
            try:
                await watcher.sweep()
            except SQLAlchemyError as err:  # a locked or unreachable database: try again next round
                # Twice a second for the whole outage: one short line a minute is enough.
                if failures.due():
                    log.warning("revocation check failed (database unavailable): %s", outage(err))
            except Exception:  # a bug here must not end the loop: revocation would silently stop working
                log.exception("revocation check failed")

    task = asyncio.create_task(loop(), name="relay-revocation-watch")
    try:
        yield watcher
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
