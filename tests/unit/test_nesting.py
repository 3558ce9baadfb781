"""``core.nesting``: the one depth bound on free-form JSON Relay stores, forwards or signals, measured without
recursion. Where it is applied: REST bodies (tests/api/test_rest.py, test_alerts.py), executor identities at the
handshake (tests/unit/test_hardening.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core import alerts
from core.nesting import MAX_JSON_DEPTH, check_depth, json_depth, too_deep

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=3),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                    max_leaves=30)


def _depth_by_recursion(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((_depth_by_recursion(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((_depth_by_recursion(v) for v in value), default=0)
    return 0


@given(JSON)
def test_depth_is_the_nesting_of_objects_and_arrays(value: Any) -> None:
    assert json_depth(value, limit=1000) == _depth_by_recursion(value)


@pytest.mark.parametrize(("value", "depth"), [(1, 0), ("[[[", 0), (None, 0), ({}, 1), ([], 1), ({"a": [1]}, 2),
                                              ([{}, [[]]], 3), ({"a": 1, "b": {"c": {"d": []}}}, 4)])
def test_examples(value: Any, depth: int) -> None:
    assert json_depth(value) == depth


def test_a_value_far_deeper_than_python_recurses_is_measured_and_refused() -> None:
    deep = json.loads("[" * 500 + "]" * 500)
    for _ in range(200):  # 100,000 levels: beyond any recursion limit
        deep = [[[[[[[[[[deep]]]]]]]]]]
    assert json_depth(deep) == MAX_JSON_DEPTH + 1  # counting stops one level past the bound
    assert too_deep(deep)
    with pytest.raises(ValueError, match="attributes is nested deeper than 32 levels"):
        check_depth(deep, "attributes")


def test_the_bound_is_inclusive_and_shared() -> None:
    value: Any = {}
    for _ in range(MAX_JSON_DEPTH - 1):
        value = {"k": value}
    check_depth(value, "x")
    with pytest.raises(ValueError):
        check_depth([value], "x")
    assert alerts.MAX_METADATA_DEPTH == MAX_JSON_DEPTH == 32
