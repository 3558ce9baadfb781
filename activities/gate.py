"""The recovery gate's activity (``core.gate``), run by the worker as a local activity of the lifecycle workflow.
An admission that trips the breaker says so (the trip's audit row), and the workflow starts its RecoveryBreaker
alert."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from temporalio import activity

from activities.database import database_calls
from core.gate import GatePolicy, breaker_event_key
from core.store import Store
from workflows.contracts.common import Activity
from workflows.contracts.gate import AdmitRecoveryInput, AdmitRecoveryReply

log = logging.getLogger("relay.worker")


class GateActivities:
    """Bound to one ``Store`` and the gate's policy (the worker's ``Settings.recovery_policy``; tests: the
    defaults)."""

    def __init__(self, store: Store, policy: GatePolicy | None = None) -> None:
        self._store = store
        self._db = database_calls(store)
        self.policy = policy or GatePolicy()

    @activity.defn(name=Activity.ADMIT_RECOVERY)
    async def admit_recovery(self, input: AdmitRecoveryInput) -> AdmitRecoveryReply:
        decision = await self._db(
            self._store.admit_recovery, org=input.org, app=input.app, executor_id=input.executor_id,
            ticket=input.ticket, now=input.now, policy=self.policy, event_key=input.event_key)
        if decision.tripped:
            log.warning("recovery-storm breaker tripped for %s/%s: %s of %s executors down within %s; recoveries "
                        "now paced one per %s", input.org, input.app, decision.storm.get("down"),
                        decision.storm.get("population"), self.policy.window, self.policy.pace)
        if decision.reset:
            log.info("recovery-storm breaker of %s/%s reset", input.org, input.app)
        tripped = breaker_event_key(input.org, input.app, decision.trip) if decision.tripped else ""
        return AdmitRecoveryReply(go=decision.go, until=decision.until, reason=decision.reason, tripped=tripped,
                                  storm=dict(decision.storm))

    def all(self) -> list[Callable[..., Any]]:
        return [self.admit_recovery]
