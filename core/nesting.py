"""The one bound on how deeply nested a JSON value Relay stores, forwards or signals may be, and the one way to
measure it.

Size bounds alone do not keep a value usable: 300 levels of ``[`` fit in a kilobyte, yet Python's ``json`` and
pydantic's serializer recurse, and give up (``RecursionError``, or pydantic's own depth limit) somewhere between a
few hundred and a thousand levels. A value accepted there fails later, where it hurts: a rule stored but failing
every alerts round, an executor's ``connected`` signal that Temporal's converter cannot serialize, retried for
ever. So every free-form value is measured here when it comes in, without recursion (any value can be asked), and
refused when it is deeper than ``MAX_JSON_DEPTH``: 422 on the REST API, a permanent 1008 at an executor's
handshake.
"""

from __future__ import annotations

from typing import Any

# Objects and arrays nested at most this deep (a scalar is 0 deep, ``{"a": [1]}`` 2). Far below where the parsers
# and serializers Relay's values pass through give up, and far above what settings or metadata need.
MAX_JSON_DEPTH = 32


def json_depth(value: Any, *, limit: int = MAX_JSON_DEPTH) -> int:
    """How many levels of objects (``dict``) and arrays (``list``, ``tuple``) ``value`` nests, counted level by level
    without recursion. Counting stops one level past ``limit``: a result over ``limit`` means "too deep", and the
    levels below are not walked."""
    level: list[Any] = [value]
    depth = 0
    while depth <= limit:
        containers = [v for v in level if isinstance(v, dict | list | tuple)]
        if not containers:
            break
        depth += 1
        level = [item for c in containers for item in (c.values() if isinstance(c, dict) else c)]
    return depth


def too_deep(value: Any, *, limit: int = MAX_JSON_DEPTH) -> bool:
    return json_depth(value, limit=limit) > limit


def check_depth(value: Any, what: str, *, limit: int = MAX_JSON_DEPTH) -> None:
    """``ValueError`` naming ``what`` when ``value`` nests deeper than ``limit`` (a pydantic validator's error: 422)."""
    if too_deep(value, limit=limit):
        raise ValueError(f"{what} is nested deeper than {limit} levels")
