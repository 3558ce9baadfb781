"""REST routes for schedules (upstream listSchedules ... triggerSchedule), carried to any HEALTHY executor of the
app. Pausing, resuming, triggering and backfilling are audited."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Response

from api import conductor as c
from api.managed import PREFIX, READ_ERRORS, WRITE_ERRORS, ManagedDep
from core import units
from core.errors import NotFoundError

router = APIRouter(prefix=PREFIX, tags=["Schedules"])

ScheduleName = Annotated[str, Path(min_length=1)]


@router.get("/schedules", operation_id="listSchedules", summary="List schedules", responses=READ_ERRORS)
async def list_schedules(m: ManagedDep, status: str | None = None, workflowName: str | None = None,
                         scheduleNamePrefix: str | None = None, loadContext: bool | None = None) -> list[c.Schedule]:
    """``loadContext`` left out: as the executor's default (the SDKs load it)."""
    body: dict[str, object] = {"status": status, "workflow_name": workflowName,
                               "schedule_name_prefix": scheduleNamePrefix, "load_context": loadContext}
    reply = await m.read("list_schedules", {"body": {k: v for k, v in body.items() if v is not None}},
                         c.ListSchedulesReply)
    return [c.schedule_of(s) for s in reply.output]


@router.get("/schedules/{scheduleName}", operation_id="getSchedule", summary="Get schedule", responses=READ_ERRORS)
async def get_schedule(m: ManagedDep, scheduleName: ScheduleName) -> c.Schedule:
    reply = await m.read("get_schedule", {"schedule_name": scheduleName}, c.GetScheduleReply)
    if reply.output is None:
        raise NotFoundError(f"schedule {scheduleName!r} not found")
    return c.schedule_of(reply.output)


@router.post("/schedules/{scheduleName}/pause", operation_id="pauseSchedule", summary="Pause schedule",
             status_code=204, responses=WRITE_ERRORS)
async def pause_schedule(m: ManagedDep, scheduleName: ScheduleName) -> Response:
    await m.mutate("schedule.pause", "pause_schedule", {"schedule_name": scheduleName}, c.SdkReply,
                   details={"scheduleName": scheduleName}, schedule=scheduleName)
    return Response(status_code=204)


@router.post("/schedules/{scheduleName}/resume", operation_id="resumeSchedule", summary="Resume schedule",
             status_code=204, responses=WRITE_ERRORS)
async def resume_schedule(m: ManagedDep, scheduleName: ScheduleName) -> Response:
    await m.mutate("schedule.resume", "resume_schedule", {"schedule_name": scheduleName}, c.SdkReply,
                   details={"scheduleName": scheduleName}, schedule=scheduleName)
    return Response(status_code=204)


@router.post("/schedules/{scheduleName}/trigger", operation_id="triggerSchedule", summary="Trigger schedule",
             status_code=201, responses=WRITE_ERRORS)
async def trigger_schedule(m: ManagedDep, scheduleName: ScheduleName) -> c.TriggerOutputBody:
    """Starts the scheduled workflow now."""
    reply = await m.mutate("schedule.trigger", "trigger_schedule", {"schedule_name": scheduleName}, c.TriggerReply,
                           details={"scheduleName": scheduleName}, outcome=lambda r: {"workflowId": r.workflow_id},
                           schedule=scheduleName)
    return c.TriggerOutputBody(workflowId=reply.workflow_id)


@router.post("/schedules/{scheduleName}/backfill", operation_id="backfillSchedule", summary="Backfill schedule",
             responses=WRITE_ERRORS)
async def backfill_schedule(m: ManagedDep, scheduleName: ScheduleName,
                            body: c.BackfillInputBody) -> c.BackfillOutputBody:
    """Starts the runs the schedule would have made between ``startTime`` and ``endTime``."""
    fields = {"schedule_name": scheduleName, "start": units.datetime_to_wire_iso(body.startTime),
              "end": units.datetime_to_wire_iso(body.endTime)}
    reply = await m.mutate("schedule.backfill", "backfill_schedule", fields, c.BackfillReply,
                           details={"scheduleName": scheduleName, "startTime": fields["start"],
                                    "endTime": fields["end"]},
                           outcome=lambda r: {"workflowIds": r.workflow_ids}, schedule=scheduleName)
    return c.BackfillOutputBody(workflowIds=reply.workflow_ids)
