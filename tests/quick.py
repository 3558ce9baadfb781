"""`make check`'s quick run: the tiers without real processes as a one-minute loop.

`make check` sets ``RELAY_TESTS=quick``; the property tests then draw a tenth of their examples (at least 3), the
API fuzz skips schemathesis's coverage phase, and the replay tests replay a third of the recordings of older code
(each folder's, every third; the current recordings whole). `make test` (and CI) leave it unset and run them whole.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TypeVar

QUICK = os.environ.get("RELAY_TESTS") == "quick"

T = TypeVar("T")


def examples(full: int) -> int:
    """How many examples a property test draws: ``full``, or in the quick run a tenth of it (at least 3)."""
    return max(3, full // 10) if QUICK else full


def sample(items: Sequence[T]) -> list[T]:
    """``items``, or in the quick run every third of them (the first included)."""
    return list(items[::3] if QUICK else items)
