"""``relay temporal setup`` where the server refuses the operator API (Temporal Cloud manages search attributes
itself): it stops with the exact attributes and types to create, never claiming success. A stand-in for the
server's operator service, one piece only: the real dev server's path is tests/e2e/test_temporal_tls.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from temporalio.service import RPCError, RPCStatusCode

from cli.temporal_setup_steps import SetupRefused, ensure_search_attributes
from workflows.contracts.common import (
    LIFECYCLE_WORKFLOW_TYPE,
    RELAY_APP,
    RELAY_APP_VERSION,
    RELAY_EXECUTOR_ID,
    RELAY_EXECUTOR_STATUS,
    RELAY_ORG,
    SEARCH_ATTRIBUTES,
)
from workflows.lifecycle import ExecutorLifecycleWorkflow


@dataclass
class _Operator:
    """Answers list_search_attributes from ``present`` (or refuses) and refuses or records add_search_attributes."""

    present: dict[str, Any] | None = None
    refuse_list: RPCStatusCode | None = None
    refuse_add: RPCStatusCode | None = None
    added: list[Any] = field(default_factory=list)

    async def list_search_attributes(self, request: Any) -> Any:
        if self.refuse_list is not None:
            raise RPCError("refused", self.refuse_list, b"")
        return type("Listed", (), {"custom_attributes": self.present or {}})()

    async def add_search_attributes(self, request: Any) -> None:
        if self.refuse_add is not None:
            raise RPCError("refused", self.refuse_add, b"")
        self.added.append(request)


@dataclass
class _Client:
    operator_service: _Operator


def _says_what_to_create(message: str) -> None:
    for name, kind in SEARCH_ATTRIBUTES.items():
        assert name in message and kind in message, (name, kind, message)


@pytest.mark.parametrize("status", [RPCStatusCode.PERMISSION_DENIED, RPCStatusCode.UNIMPLEMENTED])
async def test_a_server_that_will_not_list_them_gets_instructions(status: RPCStatusCode) -> None:
    with pytest.raises(SetupRefused) as refused:
        await ensure_search_attributes(_Client(_Operator(refuse_list=status)), "ns.acct")  # type: ignore[arg-type]
    _says_what_to_create(str(refused.value))


async def test_a_server_that_lists_but_will_not_add_gets_instructions_for_the_missing_ones() -> None:
    operator = _Operator(present={}, refuse_add=RPCStatusCode.PERMISSION_DENIED)
    with pytest.raises(SetupRefused) as refused:
        await ensure_search_attributes(_Client(operator), "ns.acct")  # type: ignore[arg-type]
    _says_what_to_create(str(refused.value))
    assert "PERMISSION_DENIED" in str(refused.value) and not operator.added


def test_every_registered_search_attribute_has_its_typed_key_and_no_other() -> None:
    """The names are written once (core.types); the typed keys every workflow and activity use are made from them."""
    keys = [RELAY_ORG, RELAY_APP, RELAY_EXECUTOR_ID, RELAY_APP_VERSION, RELAY_EXECUTOR_STATUS]
    assert {key.name: "Keyword" for key in keys} == SEARCH_ATTRIBUTES
    assert ExecutorLifecycleWorkflow.__name__ == LIFECYCLE_WORKFLOW_TYPE  # the type name said once, as the class's
