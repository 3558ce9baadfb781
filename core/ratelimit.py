"""A token bucket on a monotonic clock: the gateway's per-key handshake rate and database look-up budget, and the
REST API's bulk-operation limit."""

from __future__ import annotations

from dataclasses import dataclass


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
