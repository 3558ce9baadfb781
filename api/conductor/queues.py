"""Queues: the SDKs' queue rows and upstream's ``Queue``."""

from __future__ import annotations

from pydantic import BaseModel

from api.conductor.common import SdkReply


class SdkQueue(SdkReply):
    name: str
    concurrency: int | None = None
    worker_concurrency: int | None = None
    rate_limit_max: int | None = None
    rate_limit_period_sec: float | None = None
    priority_enabled: bool = True
    partition_queue: bool = False
    polling_interval_sec: float = 1.0
    application_name: str | None = None


class ListQueuesReply(SdkReply):
    output: list[SdkQueue] = []


class GetQueueReply(SdkReply):
    output: SdkQueue | None = None


class Queue(BaseModel):
    """Upstream ``Queue``."""

    name: str
    concurrency: int | None
    workerConcurrency: int | None
    rateLimitMax: int | None
    rateLimitPeriodSecs: float | None
    priorityEnabled: bool
    partitionQueue: bool
    pollingIntervalSecs: float
    applicationName: str | None


def queue_of(q: SdkQueue) -> Queue:
    return Queue(name=q.name, concurrency=q.concurrency, workerConcurrency=q.worker_concurrency,
                 rateLimitMax=q.rate_limit_max, rateLimitPeriodSecs=q.rate_limit_period_sec,
                 priorityEnabled=q.priority_enabled, partitionQueue=q.partition_queue,
                 pollingIntervalSecs=q.polling_interval_sec, applicationName=q.application_name)
