"""Who may open an executor socket, decided cheaply: Origin allow-list, the hashes of the keys that are live
(refreshed by the revocation watcher), a short memory of unknown keys (SDKs retry a refused upgrade every second,
forever), a budget of database look-ups for keys not known live, per-key handshake rate and connection caps, and
rate-limited reporting of refusals. Pure bookkeeping: no I/O, the caller supplies the clock."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta

from core.errors import AuthError, ForbiddenError, RateLimitedError

Clock = Callable[[], float]

UNKNOWN_KEY_MEMORY = timedelta(seconds=2)
LOOKUP_GRANTED_FOR = timedelta(seconds=1)
REPORT_EVERY = timedelta(seconds=60)


@dataclass
class TokenBucket:
    """A token bucket on a monotonic clock (seconds), for rate limits."""

    tokens: float
    updated: float

    def take(self, now: float, rate: float, capacity: float | None = None) -> bool:
        """Refill at ``rate`` tokens a second (up to ``capacity``, by default one second's worth), then take one
        if there is one."""
        self.tokens = min(rate if capacity is None else capacity, self.tokens + (now - self.updated) * rate)
        self.updated = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


@dataclass
class Admission:
    clock: Clock
    max_connections_per_key: int = 10_000
    handshakes_per_second: float = 100.0
    allowed_origins: frozenset[str] = frozenset()
    # Keys not known live may still be new (made on another gateway, or by `relay keys create`, since the last
    # refresh): this many a second, over all keys, are looked up in the database; the rest are refused at once.
    unknown_key_lookups_per_second: float = 10.0
    # The SHA-256 hashes of the live keys at the last refresh (None: not loaded yet, every key is looked up).
    live_keys: frozenset[str] | None = None
    _lookups: TokenBucket | None = None
    _granted: dict[str, float] = field(default_factory=dict)
    _unknown: dict[str, float] = field(default_factory=dict)
    _buckets: dict[str, TokenBucket] = field(default_factory=dict)
    _open: dict[str, int] = field(default_factory=dict)
    _reported: dict[tuple[str, str], float] = field(default_factory=dict)
    suppressed: int = 0

    def check_origin(self, origin: str | None) -> None:
        """Executors send no Origin; a browser does. A present Origin must be allow-listed."""
        if origin is not None and origin not in self.allowed_origins:
            raise ForbiddenError("this Origin may not open executor sockets")

    def check_key(self, key_hash: str) -> None:
        """Refuse without a database trip a key that is not live as of the last refresh, unless the look-up budget
        allows checking it (it may be newer than the refresh). A live key passes: the database has the last word on
        it (a key revoked since the refresh is refused there, at once).

        A look-up granted holds for the key's next check within ``LOOKUP_GRANTED_FOR``: the HTTP layer checks
        before the upgrade and the socket again after it, and one upgrade must cost one look-up."""
        if self.live_keys is None or key_hash in self.live_keys:
            return
        self.check_unknown(key_hash)
        now = self.clock()
        if self._granted.pop(key_hash, now - 1) >= now:
            return
        rate = self.unknown_key_lookups_per_second
        if self._lookups is None:
            self._lookups = TokenBucket(tokens=rate, updated=now)
        if not self._lookups.take(now, rate):
            raise AuthError("unknown or revoked API key")
        if len(self._granted) > 1000:  # grants never taken up (the client left), once expired
            self._granted = {k: t for k, t in self._granted.items() if t >= now}
        self._granted[key_hash] = now + LOOKUP_GRANTED_FOR.total_seconds()

    def check_unknown(self, key_hash: str) -> None:
        """Refuse without a database look-up a key that was unknown moments ago."""
        until = self._unknown.get(key_hash)
        if until is not None:
            if self.clock() < until:
                raise AuthError("unknown or revoked API key")
            del self._unknown[key_hash]

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
        now = self.clock()
        last = self._reported.get((source, reason))
        if last is not None and now - last < REPORT_EVERY.total_seconds():
            self.suppressed += 1
            return False
        if len(self._reported) > 10_000:
            self._reported.clear()
        self._reported[(source, reason)] = now
        return True
