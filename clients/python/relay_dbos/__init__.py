"""relay-dbos: connect a DBOS Transact (Python) application to Relay, on DBOS's MIT-licensed public API.

Use it instead of ``conductor_key``::

    DBOS(config={..., "executor_id": relay_dbos.executor_id()})   # unique per process; a fixed one may be given
    DBOS.launch()
    relay = relay_dbos.connect(url="ws://relay:8090/", key=os.environ["RELAY_API_KEY"])   # background thread
    ...
    DBOS.destroy(workflow_completion_timeout_sec=30)
    relay.close()

It imports nothing from ``dbos_enterprise``, never sets ``conductor_key`` and does not touch the SDK's entitlement
code: it is an application-level client of Relay. The installed dbos must be in ``SUPPORTED``; any other is refused
at import, in one line.
"""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _installed

__version__ = "0.1.0"
SUPPORTED = ((3, 3), (3, 5))  # dbos>=3.3,<3.5
SUPPORTED_TEXT = "dbos>=3.3,<3.5"


def check_dbos_version(found: str) -> None:
    """``ImportError`` unless ``found`` (a dbos version) is in the supported range: a release outside it may have
    moved or renamed a call this client makes, and would fail later, at a worse moment."""
    match = re.fullmatch(r"(\d+)\.(\d+)(?:\.\d+)?(\.post\d+)?", found)
    # A pre-release (3.3.0rc1) or a local build is refused too: its calls are not the release's.
    low, high = SUPPORTED
    if match is None or not (low <= (int(match.group(1)), int(match.group(2))) < high):
        raise ImportError(f"relay-dbos {__version__} supports {SUPPORTED_TEXT}; dbos {found} is installed")


def _dbos_version() -> str:
    try:
        return _installed("dbos")
    except PackageNotFoundError:
        raise ImportError(f"relay-dbos {__version__} supports {SUPPORTED_TEXT}; dbos is not installed") from None


check_dbos_version(_dbos_version())

from relay_dbos.client import Relay, connect, executor_id  # noqa: E402  (only once the version is known good)

__all__ = ["Relay", "connect", "executor_id", "check_dbos_version", "SUPPORTED_TEXT", "__version__"]
