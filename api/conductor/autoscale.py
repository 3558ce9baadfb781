"""Autoscaling: upstream's ``AutoscalePolicy`` (with its ``RolloutPolicy``), ``PolicyOutputBody`` and
``QueueAutoscale``, to and from ``core.autoscale``; and the queue facts a policy needs from an SDK's queue row."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from api.conductor.common import Count, NotNull
from api.conductor.queues import SdkQueue
from api.schemas import InputBody
from core import autoscale, units

OptCount = Annotated[Count | SkipJsonSchema[None], NotNull]


class RolloutPolicy(BaseModel):
    """Upstream ``RolloutPolicy``: how old application versions are reported and sized."""

    model_config = ConfigDict(extra="forbid", strict=True)

    maxExecutorsForOldApplicationVersions: OptCount = Field(default=None, description=(
        "Cap every old version's recommendation at this many executors. Omit to size old versions from their own "
        "queue utilization, uncapped."))
    maxOldApplicationVersions: OptCount = Field(default=None, description=(
        "How many old application versions (with a backlog on the queue) the autoscale response may include, "
        "newest registered first. Defaults to 0: only the latest version is reported."))


class AutoscalePolicy(InputBody):
    """Upstream ``AutoscalePolicy``: the queue whose backlog sizes the app's executors."""

    queue: str = Field(description="The queue whose utilization drives the desired executor count. Must exist, not "
                                   "be partitioned and have worker_concurrency set.")
    rollout: Annotated[RolloutPolicy | SkipJsonSchema[None], NotNull] = Field(default=None, description=(
        "Rollout preferences for non-latest application versions. Omitted means old versions are sized to their own "
        "backlog."))


class PolicyOutputBody(BaseModel):
    """Upstream ``PolicyOutputBody``: the policy as stored (a rollout with no field set is left out)."""

    policy: AutoscalePolicy


class QueueAutoscale(BaseModel):
    """Upstream ``QueueAutoscale``: one application version's recommendation."""

    applicationVersion: str
    isLatest: bool
    desiredExecutors: int
    queueDepth: int
    observedAt: int = Field(description="Epoch ms when the backlog was read from an executor.")
    queueName: str | SkipJsonSchema[None] = Field(default=None, description=(
        "The policy queue; absent when it is no longer usable (gone, partitioned, or without worker_concurrency)."))


def policy_from_body(body: AutoscalePolicy) -> autoscale.Policy:
    rollout = body.rollout
    if rollout is None:
        return autoscale.Policy(queue=body.queue)
    return autoscale.Policy(queue=body.queue, rollout=autoscale.Rollout(
        max_old_versions=rollout.maxOldApplicationVersions,
        max_old_executors=rollout.maxExecutorsForOldApplicationVersions))


def policy_output(policy: autoscale.Policy) -> dict[str, Any]:
    """``PolicyOutputBody`` as JSON (``Policy.rest``: fields left out stay out)."""
    return {"policy": policy.rest()}


def queue_autoscale_of(r: autoscale.Recommendation) -> dict[str, Any]:
    """``QueueAutoscale`` as JSON: ``queueName`` left out when the queue is no longer usable."""
    return QueueAutoscale(applicationVersion=r.version, isLatest=r.latest, desiredExecutors=r.desired,
                          queueDepth=r.depth, observedAt=units.datetime_to_epoch_ms(r.observed_at),
                          queueName=r.queue).model_dump(mode="json", exclude_none=True)


def queue_facts_of(q: SdkQueue) -> autoscale.QueueFacts:
    return autoscale.QueueFacts(name=q.name, worker_concurrency=q.worker_concurrency, partitioned=q.partition_queue)
