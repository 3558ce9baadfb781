"""Schedules: the SDKs' schedule rows (``last_fired_at`` in ISO 8601), upstream's ``Schedule``, and the trigger
and backfill bodies and replies."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from api.conductor.common import IsoTime, SdkReply, WorkflowIdOutput, WorkflowIdsOutput
from api.schemas import BodyTime, InputBody


class SdkSchedule(SdkReply):
    schedule_id: str
    schedule_name: str
    workflow_name: str
    workflow_class_name: str | None = None
    schedule: str
    status: str
    context: str | None = None
    last_fired_at: IsoTime = None
    automatic_backfill: bool = False
    cron_timezone: str | None = None
    application_name: str | None = None


class ListSchedulesReply(SdkReply):
    output: list[SdkSchedule] = []


class GetScheduleReply(SdkReply):
    output: SdkSchedule | None = None


class BackfillReply(SdkReply):
    workflow_ids: list[str] = []


class TriggerReply(SdkReply):
    workflow_id: str


class Schedule(BaseModel):
    """Upstream ``Schedule``."""

    scheduleId: str
    scheduleName: str
    workflowName: str
    workflowClass: str | None
    cronExpression: str
    status: str
    context: str | None
    lastFiredAt: datetime | None
    automaticBackfill: bool
    cronTimezone: str | None
    applicationName: str | None


class TriggerOutputBody(WorkflowIdOutput):
    """Upstream ``TriggerOutputBody``."""


class BackfillOutputBody(WorkflowIdsOutput):
    """Upstream ``BackfillOutputBody``."""


def schedule_of(s: SdkSchedule) -> Schedule:
    return Schedule(scheduleId=s.schedule_id, scheduleName=s.schedule_name, workflowName=s.workflow_name,
                    workflowClass=s.workflow_class_name, cronExpression=s.schedule, status=s.status,
                    context=s.context, lastFiredAt=s.last_fired_at, automaticBackfill=s.automatic_backfill,
                    cronTimezone=s.cron_timezone, applicationName=s.application_name)


class BackfillInputBody(InputBody):
    startTime: BodyTime
    endTime: BodyTime
