"""Who may open an executor socket, decided cheaply: Origin allow-list, the hashes of the keys that are live
(refreshed by the revocation watcher), a short memory of unknown keys (SDKs retry a refused upgrade every second,
forever), a budget of database look-ups for keys not known live, per-key handshake rate and connection caps, and
rate-limited reporting of refusals. Pure bookkeeping: no I/O, the caller supplies the clock.

Only the database says a key is unknown (401). A key refused because the look-up budget is spent may be a good one
made since the last refresh: that refusal is "retry" (503), never 401."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from core.errors import AuthError, ForbiddenError, RateLimitedError, ServiceUnavailableError
from core.logs import OncePerWindow
from core.ratelimit import TokenBucket

Clock = Callable[[], float]

UNKNOWN_KEY_MEMORY = timedelta(seconds=2)
LOOKUP_GRANTED_FOR = timedelta(seconds=1)
REPORT_EVERY = timedelta(seconds=60)


@dataclass
class Admission:
    clock: Clock
    max_connections_per_key: int = 10_000
    handshakes_per_second: float = 100.0
    allowed_origins: frozenset[str] = frozenset()
    # Keys not known live may still be new (made on another gateway, or by `relay keys create`, since the last
    # refresh): this many a second, over all keys, are looked up in the database; the rest are told to retry.
    unknown_key_lookups_per_second: float = 10.0
    # The SHA-256 hashes of the live keys at the last refresh (None: not loaded yet, every key is looked up).
    live_keys: frozenset[str] | None = None
    _lookups: TokenBucket | None = None
    _granted: dict[str, tuple[int, float]] = field(default_factory=dict)  # look-ups not yet used: (count, until)
    _unknown: dict[str, float] = field(default_factory=dict)
    _buckets: dict[str, TokenBucket] = field(default_factory=dict)
    _open: dict[str, int] = field(default_factory=dict)
    _reports: OncePerWindow = field(init=False)

    def __post_init__(self) -> None:
        self._reports = OncePerWindow(REPORT_EVERY, clock=self.clock)

    @property
    def suppressed(self) -> int:
        """Reports held back by ``should_report`` so far."""
        return self._reports.suppressed

    def check_origin(self, origin: str | None) -> None:
        """Executors send no Origin; a browser does. A present Origin must be allow-listed."""
        if origin is not None and origin not in self.allowed_origins:
            raise ForbiddenError("this Origin may not open executor sockets")

    def check_key(self, key_hash: str, *, upgraded: bool = False) -> None:
        """Refuse without a database trip a key that is not live as of the last refresh, unless the look-up budget
        allows checking it (it may be newer than the refresh). A live key passes: the database has the last word on
        it (a key revoked since the refresh is refused there, at once).

        Raises ``AuthError`` for a key the database found unknown moments ago, and ``ServiceUnavailableError`` (retry
        shortly) when the budget is spent: sixty executors dialling at once with a key made a moment earlier must
        not be told it is wrong (``remember_live`` lets the rest of such a burst through once one got in).

        One upgrade costs one look-up: the HTTP layer checks before the upgrade, and each look-up it is granted is
        kept for ``LOOKUP_GRANTED_FOR``; the socket's own check after the upgrade (``upgraded``) uses one of those
        rather than the budget. They are counted per key: of ten upgrades of one key let through at once, each
        socket finds its own."""
        if self.live_keys is None or key_hash in self.live_keys:
            return
        self.check_unknown(key_hash)
        now = self.clock()
        if upgraded and self._use_grant(key_hash, now):
            return
        rate = self.unknown_key_lookups_per_second
        if self._lookups is None:
            self._lookups = TokenBucket(tokens=rate, updated=now)
        if not self._lookups.take(now, rate):
            raise ServiceUnavailableError("this key is not known to this gateway yet and too many such keys are "
                                          "being checked now; retry shortly")
        if not upgraded:
            self._grant(key_hash, now)

    def _grant(self, key_hash: str, now: float) -> None:
        if len(self._granted) > 1000:  # grants never taken up (the client left), once expired
            self._granted = {k: g for k, g in self._granted.items() if g[1] >= now}
        count, until = self._granted.get(key_hash, (0, now))
        self._granted[key_hash] = ((count if until >= now else 0) + 1, now + LOOKUP_GRANTED_FOR.total_seconds())

    def _use_grant(self, key_hash: str, now: float) -> bool:
        count, until = self._granted.pop(key_hash, (0, now))
        if count == 0 or until < now:
            return False
        if count > 1:
            self._granted[key_hash] = (count - 1, until)
        return True

    def check_unknown(self, key_hash: str) -> None:
        """Refuse without a database look-up a key that was unknown moments ago."""
        until = self._unknown.get(key_hash)
        if until is not None:
            if self.clock() < until:
                raise AuthError("unknown or revoked API key")
            del self._unknown[key_hash]

    def remember_live(self, key_hash: str) -> None:
        """The database found this key live: pass it without a look-up until the next refresh (which keeps it, or
        drops it if it was revoked meanwhile)."""
        if self.live_keys is not None and key_hash not in self.live_keys:
            self.live_keys = self.live_keys | {key_hash}

    def remember_unknown(self, key_hash: str) -> None:
        if len(self._unknown) > 100_000:
            self._unknown.clear()  # bound memory under a flood of distinct bad keys
        self._unknown[key_hash] = self.clock() + UNKNOWN_KEY_MEMORY.total_seconds()

    def admit(self, key_id: str) -> None:
        """Take one handshake token and one connection slot for ``key_id``; ``release`` gives the slot back."""
        if self._open.get(key_id, 0) >= self.max_connections_per_key:
            raise RateLimitedError(f"this key already holds {self.max_connections_per_key} connections")
        now = self.clock()
        rate = self.handshakes_per_second
        bucket = self._buckets.setdefault(key_id, TokenBucket(tokens=rate, updated=now))
        if not bucket.take(now, rate):
            raise RateLimitedError("too many handshakes for this key; retry shortly")
        self._open[key_id] = self._open.get(key_id, 0) + 1

    def release(self, key_id: str) -> None:
        left = self._open.get(key_id, 0) - 1
        if left > 0:
            self._open[key_id] = left
        else:
            self._open.pop(key_id, None)

    def open_connections(self, key_id: str) -> int:
        return self._open.get(key_id, 0)

    def should_report(self, source: str, reason: str) -> bool:
        """At most one log line and audit row per source and reason per minute; the rest are counted."""
        return self._reports.due((source, reason))
