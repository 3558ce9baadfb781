"""The recovery gate's activities (``core.gate``), run by the worker as local activities of the lifecycle workflow:
``admit_recovery``, and ``declare_dead``, which records DEAD and asks the gate and the recovery's next steps in one
local activity. An admission that trips the breaker says so (the trip's audit row), and the workflow starts its
RecoveryBreaker alert."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from temporalio import activity

from activities.database import database_calls
from activities.registry import RegistryActivities
from core.gate import GatePolicy, breaker_event_key
from core.store import Store
from workflows.contracts.common import Activity
from workflows.contracts.gate import AdmitRecoveryInput, AdmitRecoveryReply
from workflows.contracts.gateway_watch import GatewayGoneInput
from workflows.contracts.lifecycle import DeclaredDead, DeclareDeadInput

log = logging.getLogger("relay.worker")


class GateActivities:
    """Bound to one ``Store`` and the gate's policy (the worker's ``Settings.recovery_policy``; tests: the
    defaults)."""

    def __init__(self, store: Store, policy: GatePolicy | None = None) -> None:
        self._store = store
        self._db = database_calls(store)
        self.policy = policy or GatePolicy()
        self._registry = RegistryActivities(store)

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

    @activity.defn(name=Activity.DECLARE_DEAD)
    async def declare_dead(self, input: DeclareDeadInput) -> DeclaredDead:
        """The three or four local activities the lifecycle workflow asked one after the other at a death (in one
        workflow task), as one: a round through the worker each, in a burst of deaths most of the worker's time
        between the graces' end and the DEAD rows. Each step is the activity of its name, so a retry of this one
        repeats what they would have: a row lands once by its key, the gate answers its ticket again."""
        at = await self._registry.record_status(input.record)
        admission = await self.admit_recovery(input.admit)
        declared = DeclaredDead(at, admission)
        if admission.go or admission.until is None:
            declared.selected = True
            declared.candidate = await self._registry.select_candidate(input.select)
            if declared.candidate is not None and input.gateway_queue:
                declared.gateway_gone = await self._registry.gateway_gone(GatewayGoneInput(input.gateway_queue))
        return declared

    def all(self) -> list[Callable[..., Any]]:
        return [self.admit_recovery, self.declare_dead]
