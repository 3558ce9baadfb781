"""REST routes for what an app's executors know of the app as a whole: its application versions (upstream
listAppVersions, setLatestAppVersion) and its metrics (listMetrics)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from api import conductor as c
from api.managed import PREFIX, READ_ERRORS, WRITE_ERRORS, ManagedDep
from api.schemas import UTCTime
from core import units

router = APIRouter(prefix=PREFIX)

# The one metric class the SDKs answer (any other is "Unexpected metric class").
METRIC_CLASS = "workflow_step_count"


@router.get("/versions", operation_id="listAppVersions", summary="List application versions",
            responses=READ_ERRORS, tags=["Versions"])
async def list_app_versions(m: ManagedDep) -> list[c.ApplicationVersion]:
    """As the system database records them; the latest is the one with the newest ``versionTimestamp``."""
    reply = await m.read("list_application_versions", {}, c.ListVersionsReply)
    return [c.version_of(v) for v in reply.output]


@router.patch("/versions/latest", operation_id="setLatestAppVersion", summary="Set latest application version",
              status_code=204, responses=WRITE_ERRORS, tags=["Versions"])
async def set_latest_app_version(m: ManagedDep, body: c.PatchLatestVersionInputBody) -> Response:
    """Makes ``versionName`` the latest (its timestamp becomes now), so resume and fork go to its executors."""
    await m.mutate("version.set_latest", "set_latest_application_version", {"version_name": body.versionName},
                   c.SdkReply, details={"versionName": body.versionName})
    return Response(status_code=204)


@router.get("/metrics", operation_id="listMetrics", summary="List metrics", responses=READ_ERRORS,
            tags=["Metrics"])
async def list_metrics(m: ManagedDep, startTime: Annotated[UTCTime, Query()],
                       endTime: Annotated[UTCTime, Query()]) -> list[c.Metric]:
    """Workflows and steps that ran in [startTime, endTime), by name: one bucket per metric, the whole range."""
    if endTime <= startTime:
        return []  # an empty range: nothing ran in it
    fields = {"start_time": units.datetime_to_wire_iso(startTime), "end_time": units.datetime_to_wire_iso(endTime),
              "metric_class": METRIC_CLASS}
    reply = await m.read("get_metrics", fields, c.MetricsReply)
    return [c.metric_of(x, app_id=m.app_id, start=startTime, end=endTime) for x in reply.metrics]
