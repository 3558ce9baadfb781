"""The gateway watch workflow, one per gateway process (id ``relay-gateway/{queue}``).

A gateway that dies (SIGKILL, lost host) never sends ``disconnected`` for the executors it held. This workflow
keeps a heartbeating activity running on the gateway's own task queue; when its heartbeats stop, Temporal fails
the activity at the heartbeat timeout. Missed heartbeats alone mean "no news" (Temporal itself may have been
away), so the workflow then probes the gateway (``workflows.fence``): a gateway that picks the probe up is alive
and its hold starts again; only one that does not is gone, and the workflow disconnects every executor the
registry still places on it — at that moment, so their grace periods start. The gateway restarts its watch
whenever it finds it not running, and the workflow id keeps it to one per gateway.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError

from workflows import fence
from workflows.timing import DB_ACTIVITY_TIMEOUT

with workflow.unsafe.imports_passed_through():
    from workflows.contracts.gateway_watch import (
        DisconnectGatewayInput,
        DisconnectGatewayResult,
        GatewayGoneInput,
        GatewayInput,
        HoldGatewayInput,
        ProbeGatewayInput,
        disconnect_gateway_executors,
        gateway_gone,
        hold_gateway,
    )

# Deprecated patches (docs/pages/contributing/patch-policy.md): their old branches are gone, and
# ``workflow.deprecate_patch`` keeps the runs that wrote their markers replaying while a new run writes them
# deprecated, which a release without the calls skips. A hold that fails is confirmed with a probe before the
# gateway's executors are disconnected (``CONFIRM_PATCH``); a gateway already known gone (``core.gateways``) is not
# probed, as the probe could only time out (``KNOWN_GONE_PATCH``).
CONFIRM_PATCH = "confirm-gateway-gone"
KNOWN_GONE_PATCH = "known-gone-gateways"


@workflow.defn
class GatewayWorkflow:
    @workflow.run
    async def run(self, input: GatewayInput) -> DisconnectGatewayResult:
        try:
            await workflow.execute_activity(
                hold_gateway,
                HoldGatewayInput(heartbeat_interval=input.heartbeat_timeout / 4, hold_for=input.hold_for),
                task_queue=input.gateway_queue,
                # A gateway that is already gone never picks the hold up: that too must count as gone.
                schedule_to_start_timeout=input.heartbeat_timeout,
                start_to_close_timeout=input.hold_for + input.heartbeat_timeout,
                heartbeat_timeout=input.heartbeat_timeout,
                retry_policy=RetryPolicy(maximum_attempts=1),
                summary=f"hold {input.gateway_queue}",
            )
        except ActivityError as err:
            workflow.deprecate_patch(CONFIRM_PATCH)
            if not await self._known_gone(input) and await fence.probe(
                    input.gateway_queue, ProbeGatewayInput(), timeout=input.heartbeat_timeout) is not None:
                workflow.continue_as_new(input)  # alive after all (Temporal was away, say): hold again
            reason = f"gateway gone: {err.cause or err}"
            return await workflow.execute_activity(
                disconnect_gateway_executors,
                DisconnectGatewayInput(input.gateway_queue, reason=reason),
                start_to_close_timeout=input.heartbeat_timeout * 6,
                summary="disconnect the executors it held",
            )
        workflow.continue_as_new(input)

    @staticmethod
    async def _known_gone(input: GatewayInput) -> bool:
        """A gateway that retired (SIGTERM) or was succeeded by a restart is known gone: no probe to wait out."""
        workflow.deprecate_patch(KNOWN_GONE_PATCH)
        reply = await workflow.execute_activity(
            gateway_gone, GatewayGoneInput(input.gateway_queue), start_to_close_timeout=DB_ACTIVITY_TIMEOUT,
            retry_policy=RetryPolicy(maximum_interval=timedelta(seconds=5)), summary="known gone?")
        return reply.gone
