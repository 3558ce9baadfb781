"""The gateway watch workflow's contract (one ``GatewayWorkflow`` per gateway process), and the fence's probe,
which the lifecycle workflow asks of a gateway too. Stubs of their activities: ``hold_gateway`` and
``probe_gateway`` are implemented in ``gateway.activities`` (they run in the gateway process, on its own task
queue), ``disconnect_gateway_executors`` and ``gateway_gone`` in ``activities.registry``."""

# No ``from __future__ import annotations``: a contract's annotations are types, not names (the package's docstring).
from dataclasses import dataclass
from datetime import datetime, timedelta

from temporalio import activity

from workflows.contracts.common import STUB, Activity, ConnectedSignal


@dataclass
class GatewayInput:
    """Watch one gateway process. A gateway that dies sends no ``disconnected``: this workflow notices for it."""

    gateway_queue: str
    heartbeat_timeout: timedelta = timedelta(seconds=10)
    # Each hold lasts this long, then the run continues as new (bounded history for a gateway up for months).
    hold_for: timedelta = timedelta(hours=6)


@dataclass
class HoldGatewayInput:
    heartbeat_interval: timedelta
    hold_for: timedelta


@dataclass
class ProbeGatewayInput:
    """Ask a gateway whether it is alive and, when ``executor_id`` is set, whether it holds that executor's socket.

    ``answer_at`` (the fence before DEAD, asked ahead of the grace's end): look then, not now, answering at once if
    the executor's socket appears first. The probe's round trip then runs inside the grace, not after it."""

    org: str = ""
    app: str = ""
    executor_id: str = ""
    answer_at: datetime | None = None


@dataclass
class ProbeGatewayReply:
    """The gateway picked the probe up, so it is alive and in contact with Temporal.

    ``connection`` is the live socket it holds for the executor (as its ``connected`` signal said), or None.
    ``contact_for`` is how long the gateway has been in contact with Temporal without a break: an executor that
    left while its gateway could not reach Temporal is owed a full grace from the moment contact came back.
    ``held``: the gateway looked at ``answer_at`` (or when the socket appeared), as asked; a gateway that predates
    ``answer_at`` answers at once, and its answer says nothing of the grace's end.
    """

    connection: ConnectedSignal | None = None
    contact_for: timedelta = timedelta(0)
    held: bool = False


@dataclass
class GatewayGoneInput:
    """Is the gateway process on this task queue known gone (``core.gateways``)?"""

    gateway_queue: str


@dataclass
class GatewayGoneReply:
    """``gone``: recorded as gone (its watch found it gone, it retired, or a successor started under its identity),
    so it holds no socket and is not probed. ``reason`` says which."""

    gone: bool
    reason: str = ""


@dataclass
class DisconnectGatewayInput:
    gateway_queue: str
    reason: str = "gateway gone"


@dataclass
class DisconnectGatewayResult:
    signalled: int


# -- activities (stubs, called by reference; the implementations are registered under the same names) ----------


@activity.defn(name=Activity.HOLD_GATEWAY)
async def hold_gateway(input: HoldGatewayInput) -> None:
    """Heartbeat for as long as the gateway process lives (up to ``hold_for``)."""
    raise NotImplementedError(STUB)


@activity.defn(name=Activity.PROBE_GATEWAY)
async def probe_gateway(input: ProbeGatewayInput) -> ProbeGatewayReply:
    """The fence's question: picked up at all, the gateway is alive; does it hold the executor's socket?"""
    raise NotImplementedError(STUB)


@activity.defn(name=Activity.DISCONNECT_GATEWAY_EXECUTORS)
async def disconnect_gateway_executors(input: DisconnectGatewayInput) -> DisconnectGatewayResult:
    """Record the gateway as gone, then signal ``disconnected`` for every executor the registry places on it."""
    raise NotImplementedError(STUB)


@activity.defn(name=Activity.GATEWAY_GONE)
async def gateway_gone(input: GatewayGoneInput) -> GatewayGoneReply:
    """Whether the gateway is known gone: the fence never waits on a probe of one that is."""
    raise NotImplementedError(STUB)
