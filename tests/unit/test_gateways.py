"""Which gateway processes are known gone (``core.gateways``), on a real SQLite store."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from sqlmodel import Session

from core import gateways
from core.gateways import GatewayRegistry
from core.models import GatewayProcess, make_engine
from core.units import utcnow


@pytest.fixture
def registry(tmp_path: Path) -> GatewayRegistry:
    return GatewayRegistry(make_engine(f"sqlite:///{tmp_path / 'relay.db'}"))


def test_a_restart_under_the_same_identity_makes_the_predecessor_gone(registry: GatewayRegistry) -> None:
    assert registry.register("q1", "host-a:8090:/data") == []
    assert registry.register("other", "host-b:8090:/data") == []
    assert registry.gone_reason("q1") is None

    assert registry.register("q2", "host-a:8090:/data") == ["q1"]

    reason = registry.gone_reason("q1")
    assert reason is not None and reason.startswith(gateways.RESTARTED) and "q2" in reason
    assert registry.gone_reason("q2") is None
    assert registry.gone_reason("other") is None  # another identity: untouched
    assert registry.register("q3", "host-a:8090:/data") == ["q2"]  # q1 was already gone: not named again


def test_marked_gone_once_then_revived_by_itself(registry: GatewayRegistry) -> None:
    registry.register("q1", "id")
    assert registry.mark_gone("q1", gateways.WATCH) is True
    assert registry.mark_gone("q1", gateways.RETIRED) is False  # the first verdict stands
    assert registry.gone_reason("q1") == gateways.WATCH

    assert registry.revive("q1", "id") == gateways.WATCH
    assert registry.gone_reason("q1") is None
    assert registry.revive("q1", "id") is None


def test_an_unknown_queue_is_not_known_gone_until_marked(registry: GatewayRegistry) -> None:
    """A queue with no row (a database restored from before the process started) is probed, not skipped."""
    assert registry.gone_reason("never-seen") is None
    assert registry.mark_gone("never-seen", gateways.WATCH) is True
    assert registry.gone_reason("never-seen") == gateways.WATCH
    assert registry.revive("also-never-seen", "id") is None
    assert registry.gone_reason("also-never-seen") is None


def test_long_gone_rows_are_pruned_when_a_gateway_starts(registry: GatewayRegistry) -> None:
    with Session(registry.engine) as s:
        s.add(GatewayProcess(queue="old", identity="x", gone_at=utcnow() - gateways.KEEP_GONE - timedelta(days=1),
                             gone_reason=gateways.RETIRED))
        s.add(GatewayProcess(queue="recent", identity="x", gone_at=utcnow() - timedelta(days=1),
                             gone_reason=gateways.RETIRED))
        s.commit()

    registry.register("q1", "y")

    with Session(registry.engine) as s:
        assert s.get(GatewayProcess, "old") is None
        assert s.get(GatewayProcess, "recent") is not None
