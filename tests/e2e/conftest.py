"""Everything under tests/e2e starts real processes, so every test here is in the ``e2e`` tier (``-m "not e2e"``
deselects it), also where its module does not say so. ``concurrent`` (a module's own mark here, or a test's) says
an e2e test asserts no timing: `make test` runs those two at a time, and the rest one at a time."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Called with the whole session's items, whichever conftest defines it: mark only this directory's. The e2e
    # tests elsewhere (the PostgreSQL variants of the api, unit and workflow tests) assert no timing: concurrent.
    for item in items:
        here = item.path.is_relative_to(HERE)
        if here and item.get_closest_marker("e2e") is None:
            item.add_marker(pytest.mark.e2e)
        if not here and item.get_closest_marker("e2e") is not None:
            item.add_marker(pytest.mark.concurrent)
