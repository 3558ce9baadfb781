"""Metrics: the SDKs' counts over a range and upstream's ``Metric``, one bucket per metric."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from api.conductor.common import INT32_MAX, SdkReply
from core import units


class SdkMetric(SdkReply):
    metric_type: str
    metric_name: str
    value: int


class MetricsReply(SdkReply):
    metrics: list[SdkMetric] = []


class Metric(BaseModel):
    """Upstream ``Metric``. The SDKs count over the whole requested range, so each metric is one bucket: it
    starts at ``startTime`` and ``granularity`` is the range's length in seconds."""

    appId: str
    metricType: str
    metricName: str
    granularity: int
    timeBucket: datetime
    value: int


def metric_of(m: SdkMetric, *, app_id: str, start: datetime, end: datetime) -> Metric:
    return Metric(appId=app_id, metricType=m.metric_type, metricName=m.metric_name,
                  granularity=min(units.seconds_between(start, end), INT32_MAX), timeBucket=start, value=m.value)
