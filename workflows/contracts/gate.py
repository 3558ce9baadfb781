"""The recovery gate's contract (``core.gate``): the lifecycle workflow asks ``admit_recovery`` before a recovery's
first request goes out, and waits as long as it is told to. Implemented in ``activities.gate``."""

# No ``from __future__ import annotations``: a contract's annotations are types, not names (the package's docstring).
from dataclasses import dataclass, field
from datetime import datetime

from temporalio import activity

from workflows.contracts.common import STUB, Activity


@dataclass
class AdmitRecoveryInput:
    org: str
    app: str
    executor_id: str
    # The death being recovered (``LifecycleState.gate_ticket``): asking again about it is idempotent.
    ticket: str
    # The workflow's clock when it asked: the gate decides on it, so retries and replays see one instant.
    now: datetime
    # Audit rows the gate writes for this death land once (a retried activity).
    event_key: str = ""


@dataclass
class AdmitRecoveryReply:
    go: bool
    # When not ``go``: ask again at this instant, at the latest.
    until: datetime | None = None
    # When not ``go``: "paused" (an operator's pause) or "paced" (the storm breaker, or a pause's backlog).
    reason: str = ""
    # This admission tripped the storm breaker: the event key of the ``app.recovery.breaker_tripped`` row it wrote
    # (empty otherwise), and the storm's size (``down``, ``population``): the RecoveryBreaker alert's.
    tripped: str = ""
    storm: dict[str, int] = field(default_factory=dict)


@activity.defn(name=Activity.ADMIT_RECOVERY)
async def admit_recovery(input: AdmitRecoveryInput) -> AdmitRecoveryReply:
    """Whether the recovery may go now; if not, until when to wait (the gate's slot, or the pause's end)."""
    raise NotImplementedError(STUB)
