"""Every activity a workflow calls by reference (a stub in ``workflows.contracts``) is implemented under the same
name with the same parameters and annotations, and every implementation registered has its stub. The workflows
are type-checked against the stubs; this keeps the stubs true to what actually runs."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
from temporalio import activity

from activities.alerts import AlertActivities, OwnAlertActivities
from activities.gate import GateActivities
from activities.orphans import OrphanActivities
from activities.reconcile import ReconcileActivities
from activities.registry import RegistryActivities
from activities.retention import RetentionActivities
from core.models import make_engine
from core.store import Store
from gateway.activities import HubActivities
from gateway.hub import Hub
from workflows.contracts import (
    alerts,
    common,
    gate,
    gateway_watch,
    lifecycle,
    management,
    orphans,
    reconcile,
    retention,
)

CONTRACTS: list[ModuleType] = [common, lifecycle, retention, gateway_watch, management, gate, alerts, orphans,
                               reconcile]


def _name(fn: Callable[..., Any]) -> str:
    name = activity._Definition.must_from_callable(fn).name
    assert name is not None, f"{fn} is a dynamic activity"
    return name


def _stubs() -> dict[str, Callable[..., Any]]:
    found: dict[str, Callable[..., Any]] = {}
    for module in CONTRACTS:
        for _, fn in inspect.getmembers(module, inspect.iscoroutinefunction):
            if fn.__module__ == module.__name__ and activity._Definition.from_callable(fn) is not None:
                assert _name(fn) not in found, f"two stubs named {_name(fn)}"
                found[_name(fn)] = fn
    return found


@pytest.fixture(scope="module")
def implementations() -> Iterator[dict[str, Callable[..., Any]]]:
    """What the worker and the gateways register: the bound methods their ``all()`` lists."""
    store = Store(make_engine("sqlite://"))
    registered = [*RegistryActivities(store).all(), *RetentionActivities(store).all(), *HubActivities(Hub()).all(),
                  *GateActivities(store).all(), *AlertActivities(store).all(), *OwnAlertActivities(store).all(),
                  *OrphanActivities(store).all(), *ReconcileActivities(store).all()]
    yield {_name(fn): fn for fn in registered}
    store.engine.dispose()


def _shape(fn: Callable[..., Any]) -> tuple[list[tuple[str, Any]], dict[str, Any]]:
    """Parameter names and kinds, and the resolved annotations (parameters and return)."""
    params = [(p.name, p.kind) for p in inspect.signature(fn).parameters.values()]
    return params, typing.get_type_hints(fn)


def test_every_stub_is_implemented_and_every_implementation_has_a_stub(
        implementations: dict[str, Callable[..., Any]]) -> None:
    stubs = _stubs()
    assert stubs, "no stubs found"
    assert sorted(stubs) == sorted(implementations)
    assert sorted(stubs) == sorted(v for k, v in vars(common.Activity).items() if not k.startswith("_"))


@pytest.mark.parametrize("name", sorted(_stubs()))
def test_stub_and_implementation_agree(name: str, implementations: dict[str, Callable[..., Any]]) -> None:
    stub, impl = _stubs()[name], implementations[name]
    assert _shape(impl) == _shape(stub), f"{name}: the implementation's signature drifted from its contract"
    assert impl.__name__ == stub.__name__ == name  # activities are verb_noun, named as registered


@pytest.mark.parametrize("name", sorted(_stubs()))
async def test_a_stub_never_runs(name: str) -> None:
    """A stub registered by mistake fails loudly instead of doing nothing."""
    with pytest.raises(NotImplementedError):
        await _stubs()[name](None)
