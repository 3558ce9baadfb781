"""REST routes for autoscaling (upstream getAutoscale, getAutoscalingPolicy, setAutoscalingPolicy,
deleteAutoscalingPolicy): an app's policy, stored by Relay (audited), and the recommendation computed from its queue's
backlog by ``api.autoscaling`` (``core.autoscale`` has the formula). Advice only: Relay starts and stops nothing; the
same numbers are the gauge ``relay_app_desired_executors`` for an HPA or KEDA to act on."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from api import autoscaling
from api import conductor as c
from api.deps import AppName, AppPrincipal, OrgName, StoreDep, source_ip
from api.managed import PREFIX, READ_ERRORS, WRITE_ERRORS, ManagedDep
from api.problems import responses
from core import metrics
from core.autoscale import Policy
from core.errors import NotFoundError
from core.store import Store, subject_of

router = APIRouter(prefix=PREFIX, tags=["Queues"])

STORED_ERRORS = responses(401, 403, 404, 422)


async def _policy(store: Store, org: str, app: str) -> Policy:
    """The app's policy; 404 when it has none (or the app is unknown)."""
    policy = await run_in_threadpool(store.get_autoscaling_policy, org, app)
    if policy is None:
        raise NotFoundError(f"app {app!r} has no autoscaling policy: set one with PUT "
                            f"/v2/orgs/{org}/apps/{app}/autoscaling-policy")
    return policy


@router.get("/autoscale", operation_id="getAutoscale", summary="Get autoscaling recommendation",
            responses=READ_ERRORS, response_model=list[c.QueueAutoscale])
async def get_autoscale(m: ManagedDep) -> Response:
    """How many executors each application version needs now for the backlog of the policy's queue: the latest
    version, then old versions with a backlog (``rollout``). ``desiredExecutors`` is max(1, ceil(queueDepth /
    worker_concurrency)), an old version's capped at ``maxExecutorsForOldApplicationVersions``. 404 without a
    policy."""
    policy = await _policy(m.store, m.org, m.app)
    recommendations = await autoscaling.observe(m, policy)
    return JSONResponse([c.queue_autoscale_of(r) for r in recommendations])


@router.get("/autoscaling-policy", operation_id="getAutoscalingPolicy", summary="Get autoscaling policy",
            responses=STORED_ERRORS, response_model=c.PolicyOutputBody)
async def get_autoscaling_policy(orgName: OrgName, appName: AppName, _p: AppPrincipal, store: StoreDep) -> Response:
    """The app's stored policy; 404 when none is set."""
    return JSONResponse(c.policy_output(await _policy(store, orgName, appName)))


@router.put("/autoscaling-policy", operation_id="setAutoscalingPolicy", summary="Set autoscaling policy",
            responses=WRITE_ERRORS, response_model=c.PolicyOutputBody)
async def set_autoscaling_policy(m: ManagedDep, body: c.AutoscalePolicy) -> Response:
    """Checks the queue on a HEALTHY executor (422 when it does not exist, is partitioned or has no
    worker_concurrency; 503 when no executor is connected to check it), then stores the policy, replacing any, and
    echoes it as stored. Audited as ``app.autoscaling_policy.set``."""
    policy = c.policy_from_body(body)
    await autoscaling.require_scalable(m, policy.queue)
    stored = await run_in_threadpool(m.store.set_autoscaling_policy, m.org, m.app, policy,
                                     subject=subject_of(m.principal), source_ip=m.source_ip)
    return JSONResponse(c.policy_output(stored))


@router.delete("/autoscaling-policy", operation_id="deleteAutoscalingPolicy", summary="Delete autoscaling policy",
               status_code=204, responses=STORED_ERRORS)
async def delete_autoscaling_policy(orgName: OrgName, appName: AppName, p: AppPrincipal, store: StoreDep,
                                    request: Request) -> Response:
    """Clears the policy (deleting an absent one succeeds); the app's ``relay_app_desired_executors`` series go
    with it. Audited as ``app.autoscaling_policy.deleted`` when there was one."""
    await run_in_threadpool(store.delete_autoscaling_policy, orgName, appName, subject=subject_of(p),
                            source_ip=source_ip(request))
    metrics.DESIRED_EXECUTORS.remove(orgName, appName)
    return Response(status_code=204)
