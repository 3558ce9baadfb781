"""Everything under tests/e2e starts real processes, so every test here is in the ``e2e`` tier (``-m "not e2e"``
deselects it), also where its module does not say so."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Called with the whole session's items, whichever conftest defines it: mark only this directory's.
    for item in items:
        if item.path.is_relative_to(HERE) and item.get_closest_marker("e2e") is None:
            item.add_marker(pytest.mark.e2e)
