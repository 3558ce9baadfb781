"""Continue-as-new hands the next run every setting its run was started with, not just the carried state."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from workflows.contracts.lifecycle import LifecycleInput, LifecycleState
from workflows.lifecycle import ExecutorLifecycleWorkflow


def test_continue_as_new_carries_every_input_field() -> None:
    started = LifecycleInput("acme", "shop", "exec-1", recovery_timeout=timedelta(seconds=7),
                             probe_timeout=timedelta(seconds=3))
    state = LifecycleState()
    following = ExecutorLifecycleWorkflow(started)._next_input(state)
    assert following.state is state
    for field in dataclasses.fields(LifecycleInput):
        if field.name != "state":
            assert getattr(following, field.name) == getattr(started, field.name), field.name
