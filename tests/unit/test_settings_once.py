"""One ``Settings``, built at start and passed down: the pool and the recovery gate's policy come from it, under the
same ``RELAY_DATABASE_*`` and ``RELAY_RECOVERY_*`` variables as ever; nothing else reads the environment."""

from __future__ import annotations

import ast
from datetime import timedelta
from pathlib import Path

import pytest
from pydantic import ValidationError

from activities.gate import GateActivities
from core.gate import GatePolicy
from core.models import make_engine
from core.settings import DatabasePool, Settings
from core.store import Store

ROOT = Path(__file__).resolve().parents[2]


def test_pool_and_policy_come_from_the_same_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"RELAY_DATABASE_POOL_SIZE": "2", "RELAY_DATABASE_MAX_OVERFLOW": "0",
                        "RELAY_DATABASE_POOL_TIMEOUT_SECS": "4", "RELAY_DATABASE_STATEMENT_TIMEOUT_SECS": "1.5",
                        "RELAY_RECOVERY_STORM_SHARE": "0.25", "RELAY_RECOVERY_STORM_MIN_EXECUTORS": "7",
                        "RELAY_RECOVERY_STORM_WINDOW_SECS": "30", "RELAY_RECOVERY_PACE_SECS": "0.5",
                        "RELAY_RECOVERY_PAUSE_RECHECK_SECS": "9"}.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.database_pool == DatabasePool(pool_size=2, max_overflow=0, pool_timeout_secs=4,
                                                  statement_timeout_secs=1.5)
    assert settings.recovery_policy == GatePolicy(storm_share=0.25, storm_min=7, window=timedelta(seconds=30),
                                                  pace=timedelta(milliseconds=500), pause_recheck=timedelta(seconds=9))


def test_defaults_are_the_documented_ones() -> None:
    settings = Settings()
    assert settings.database_pool == DatabasePool()
    assert settings.recovery_policy == GatePolicy()


@pytest.mark.parametrize(("name", "value"), [("RELAY_DATABASE_POOL_SIZE", "0"), ("RELAY_RECOVERY_STORM_SHARE", "1.5"),
                                             ("RELAY_RECOVERY_PACE_SECS", "0")])
def test_bad_values_are_refused_at_start(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ValidationError, match=name.removeprefix("RELAY_").lower()):
        Settings()


def test_the_gate_activities_use_the_policy_passed_down(tmp_path: Path) -> None:
    policy = GatePolicy(pace=timedelta(seconds=1))
    store = Store(make_engine(f"sqlite:///{tmp_path / 'relay.db'}"))
    assert GateActivities(store, policy).policy is policy


def test_settings_are_built_only_at_the_entry_points() -> None:
    """``Settings()`` is built by the command line (``cli/main.py``) and the spec generator, and nowhere else in the
    product: every other piece is handed the one built at start."""
    built = []
    for path in [*ROOT.glob("*.py"), *(p for d in ("activities", "api", "cli", "core", "gateway", "workflows")
                                       for p in (ROOT / d).rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id.endswith("Settings"):
                built.append(str(path.relative_to(ROOT)))
    assert sorted(set(built)) == ["api/openapi.py", "cli/main.py"]
