"""Relay's error hierarchy. Each error knows its HTTP status and its WebSocket close code, so that the
mapping lives here and nowhere else::

    RelayError                      500 / 1011
    ├── AuthError                   401 / 1008   unknown, malformed or revoked key
    ├── ForbiddenError              403 / 1008   key of another org, or not allowed for this app
    ├── NotFoundError               404          unknown org, app or executor
    ├── ConflictError               409
    ├── ProtocolError                     1002   an executor reply that breaks the protocol
    │   ├── IdentityError                 1008   an executor identity Temporal would refuse: permanent
    │   └── NestingError                  1002   a frame nested too deep to parse (at the handshake: an
    │                                            IdentityError, permanent)
    ├── ExecutorUnavailableError    503          no socket for that executor here, or it closed
    │   └── NoExecutorError         503          no HEALTHY executor can take an operator's request
    ├── ExecutorTimeoutError        502          the executor did not answer in time
    │   └── ExecutorsFailedError    502          every executor tried for an operator's request failed
    ├── ExecutorRefusedError        409          the executor refused the request (metadata-only mode, ...)
    │   └── ExecutorUnsupportedError 501         its SDK release cannot do it (an operation dbos 3.4 moved out of
    │                                            its MIT package, answered so by Relay's client)
    ├── TemporalUnavailableError    503          Temporal did not take a signal, after retries
    ├── ServiceUnavailableError     503 / 1013   a dependency (database, Temporal) is away for now: retry later
    ├── RateLimitedError            429 / 1008   too many connections or handshakes for one key
    └── SchemaVersionError          500          the database's schema is not the revision this code needs: the
                                                 process does not start
"""

from __future__ import annotations


class RelayError(Exception):
    """Root of every error Relay raises on purpose."""

    status: int = 500
    title: str = "Internal Server Error"
    close_code: int = 1011

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


class AuthError(RelayError):
    status = 401
    title = "Unauthorized"
    close_code = 1008


class ForbiddenError(RelayError):
    status = 403
    title = "Forbidden"
    close_code = 1008


class NotFoundError(RelayError):
    status = 404
    title = "Not Found"


class ConflictError(RelayError):
    status = 409
    title = "Conflict"


class ProtocolError(RelayError):
    status = 400
    title = "Protocol Error"
    close_code = 1002

    def __init__(self, detail: str, *, request_id: str | None = None) -> None:
        super().__init__(detail)
        self.request_id = request_id  # the request the bad reply answers, when that much could be read


class IdentityError(ProtocolError):
    """An ``executor_info`` reply whose identity Temporal (or the registry) would refuse: too long, or not valid
    UTF-8. Permanent: the same values fail the same way, so the socket is closed with 1008 (policy violation) and
    a reason saying so, and nothing of it is sent to Temporal or retried."""

    close_code = 1008

    def __init__(self, detail: str, *, field: str) -> None:
        super().__init__(detail)
        self.field = field


class NestingError(ProtocolError):
    """A frame nested deeper than Python's JSON parser goes (it recurses, and gives up near a thousand levels). Any
    other malformed reply costs only the request it answers; the ``executor_info`` reply is refused for good
    (``gateway.identity.nested_too_deep``): the SDK would send the same frame again every second."""


class ExecutorUnavailableError(RelayError):
    """The executor has no socket on this gateway (never had, or it closed)."""

    status = 503
    title = "Service Unavailable"


class ExecutorTimeoutError(RelayError):
    """The executor did not answer in time."""

    status = 502
    title = "Bad Gateway"


class NoExecutorError(ExecutorUnavailableError):
    """An operator's request (workflow management) found no HEALTHY executor of the app to carry it."""

    def __init__(self, detail: str, *, tried: list[str] | None = None) -> None:
        super().__init__(detail)
        self.tried = tried or []


class ExecutorsFailedError(ExecutorTimeoutError):
    """Every executor an operator's request was sent to failed or timed out; ``tried`` names them in order."""

    def __init__(self, detail: str, *, tried: list[str]) -> None:
        super().__init__(detail)
        self.tried = tried


class ExecutorRefusedError(RelayError):
    """The executor answered that it will not do this (an executor in metadata-only mode refuses to move workflow
    data, for one); asking another executor of the same app would get the same answer."""

    status = 409
    title = "Conflict"

    def __init__(self, detail: str, *, executor_id: str) -> None:
        super().__init__(detail)
        self.executor_id = executor_id


class ExecutorUnsupportedError(ExecutorRefusedError):
    """Every executor asked answered that its SDK release cannot do this at all (``unsupported: true`` in the reply,
    as Relay's own client for dbos 3.3/3.4 answers the operations DBOS moved out of its MIT package): not the
    executor's failure, so not a 502."""

    status = 501
    title = "Not Implemented"


class TemporalUnavailableError(RelayError):
    """Temporal could not be reached (after retries) for something a request needs done durably."""

    status = 503
    title = "Service Unavailable"


class ServiceUnavailableError(RelayError):
    """Something Relay depends on (its database; Temporal, for a fenced gateway) cannot be reached right now; the
    same request may succeed later.

    1013 is RFC 6455's "Try Again Later": the SDKs reconnect after any close, so nothing more is needed from them.
    """

    status = 503
    title = "Service Unavailable"
    close_code = 1013


class RateLimitedError(RelayError):
    """Too many connections or handshakes for one key."""

    status = 429
    title = "Too Many Requests"
    close_code = 1008


class SchemaVersionError(RelayError):
    """The database's schema revision is not the one this Relay's code needs (``core.migrations``): older, with
    migrations left to ``relay migrate`` (RELAY_MIGRATE_ON_START=false), or newer, migrated by a newer Relay. Raised
    when the store is opened; the process says so in one line and exits 1."""

    def __init__(self, detail: str, *, database: frozenset[str], code: frozenset[str]) -> None:
        super().__init__(detail)
        self.database = database  # the database's current revisions (none: a new database)
        self.code = code  # the head revisions this code's migrations end at
