"""`make check`'s quick run: the tiers without real processes as a one-minute loop.

`make check` sets ``RELAY_TESTS=quick``; the property tests then draw a fifth of their examples (at least 5), and
the API fuzz skips schemathesis's coverage phase. `make test` (and CI) leave it unset and run them whole.
"""

from __future__ import annotations

import os

QUICK = os.environ.get("RELAY_TESTS") == "quick"


def examples(full: int) -> int:
    """How many examples a property test draws: ``full``, or in the quick run a fifth of it (at least 5)."""
    return max(5, full // 5) if QUICK else full
