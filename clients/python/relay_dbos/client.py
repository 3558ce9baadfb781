"""The public interface: ``executor_id()`` for DBOS's config, ``connect()`` once DBOS is launched, and the ``Relay``
handle it returns.

Identity: Relay recovers a dead executor by the id DBOS recorded as the owner of its workflows, so every process
needs an id of its own. ``executor_id()`` gives each process a new UUID (a forked child gets its own), and DBOS,
run without a conductor, records the id from its config. A restarted process is therefore a new executor: its
predecessor's PENDING workflows come back through Relay's recovery by a peer. A fixed id (a StatefulSet pod's
name) may be given instead; then ``DBOS.launch()`` itself recovers that id's PENDING workflows of the running
version, and Relay sees the same executor come back.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import uuid
from collections.abc import Callable
from datetime import timedelta
from types import TracebackType
from typing import Any

from dbos import DBOS

from relay_dbos.connection import PING_INTERVAL, PONG_TIMEOUT, Backoff, Connection
from relay_dbos.operations import Operations
from relay_dbos.retention import Retention

log = logging.getLogger("relay_dbos")

_process_id: tuple[int, str] | None = None  # (pid, id): the id of the process that drew it
_lock = threading.Lock()


def executor_id(fixed: str | None = None) -> str:
    """This process's executor id for DBOS's config: ``fixed`` when given, else a UUID drawn once per process."""
    global _process_id
    if fixed is not None:
        if not fixed.strip():
            raise ValueError("relay_dbos.executor_id: a fixed executor id must not be empty")
        return fixed
    with _lock:
        if _process_id is None or _process_id[0] != os.getpid():
            _process_id = (os.getpid(), str(uuid.uuid4()))
        return _process_id[1]


def _app_name() -> str:
    """The application's name as DBOS registered it: the owner of the running version (public
    ``list_application_versions``), for a ``connect`` that was not told it."""
    running = DBOS.application_version
    for v in DBOS.list_application_versions():
        if v["version_name"] == running and v.get("application_name"):
            return str(v["application_name"])
    raise ValueError("relay_dbos.connect: cannot tell the application's name; pass app_name= (the name in "
                     "DBOS's config)")


class Relay:
    """A connection to Relay, kept up on a background thread until ``close()``. A context manager too."""

    def __init__(self, connection: Connection, retention: Retention) -> None:
        self._connection = connection
        self._retention = retention

    @property
    def connected(self) -> bool:
        """True while a socket to Relay is open and answering."""
        return self._connection.connected.is_set()

    def wait_connected(self, timeout: timedelta = timedelta(seconds=10)) -> bool:
        return self._connection.connected.wait(timeout.total_seconds())

    def close(self, timeout: timedelta = timedelta(seconds=5)) -> None:
        """Close the socket cleanly and stop the thread; idempotent. Call it after ``DBOS.destroy()``: Relay takes
        a closed socket for a disconnect and, past the app's grace, recovers the executor's PENDING workflows
        elsewhere, so the socket should outlive the workflows ``destroy`` lets finish."""
        self._connection.close(timeout)
        self._retention.join(timeout)

    def __enter__(self) -> Relay:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def connect(url: str | None = None, key: str | None = None, *, app_name: str | None = None,
            executor_metadata: dict[str, Any] | None = None,
            on_alert: Callable[[str, str, dict[str, str]], None] | None = None, metadata_only: bool = False,
            ping_interval: timedelta = PING_INTERVAL, pong_timeout: timedelta = PONG_TIMEOUT,
            backoff: Backoff | None = None) -> Relay:
    """Connect this launched DBOS application to Relay, on a background thread, and return at once.

    ``url``: Relay's base URL (``ws://relay:8090/``), else ``RELAY_URL``; ``key``: an API key of Relay's, else
    ``RELAY_API_KEY``. ``app_name``: DBOS's ``name`` (read from the system database when left out).
    ``executor_metadata``: any JSON object, shown with the executor. ``on_alert(name, message, metadata)``: takes
    the alerts Relay sends (logged when absent). ``metadata_only``: inputs, outputs and data stay in the process.
    """
    url = url or os.environ.get("RELAY_URL")
    key = key or os.environ.get("RELAY_API_KEY")
    if not url:
        raise ValueError("relay_dbos.connect: no Relay URL (pass url= or set RELAY_URL)")
    if not key:
        raise ValueError("relay_dbos.connect: no API key (pass key= or set RELAY_API_KEY)")
    stopping = threading.Event()
    retention = Retention(stopping=stopping)
    operations = Operations(metadata=executor_metadata, on_alert=on_alert, metadata_only=metadata_only,
                            retention=retention).table()
    connection = Connection(base_url=url, app_name=app_name or _app_name(), key=key, operations=operations,
                            metadata_only=metadata_only, stopping=stopping, ping_interval=ping_interval,
                            pong_timeout=pong_timeout, backoff=backoff)
    relay = Relay(connection, retention)
    connection.start()
    atexit.register(relay.close)
    return relay
