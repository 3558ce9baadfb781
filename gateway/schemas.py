"""REST request and response models, in the upstream Conductor field names and units.

This is one of the two edges where seconds and milliseconds exist; conversions go through ``gateway.units``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from gateway import models, units

MAX_EXECUTOR_TIMEOUT = timedelta(days=7)

ORG_PATTERN = r"^[a-z0-9_]+$"
APP_PATTERN = r"^[a-z0-9-_]+$"


class Application(BaseModel):
    """Upstream ``Application``."""

    id: str
    name: str
    orgId: str
    status: Literal["AVAILABLE", "UNAVAILABLE"]
    language: str | None
    gcTimeThresholdMs: int | None
    gcRowsThreshold: int | None
    globalTimeoutMs: int | None
    executorTimeoutSecs: int
    privateMode: bool
    dbosCloud: bool

    @classmethod
    def of(cls, app: models.Application, *, available: bool, language: str | None) -> Application:
        return cls(
            id=app.id,
            name=app.name,
            orgId=app.org,
            status="AVAILABLE" if available else "UNAVAILABLE",
            language=app.language or language,
            gcTimeThresholdMs=units.optional_timedelta_to_ms(app.gc_time_threshold),
            gcRowsThreshold=app.gc_rows_threshold,
            globalTimeoutMs=units.optional_timedelta_to_ms(app.global_timeout),
            executorTimeoutSecs=units.timedelta_to_seconds(app.executor_timeout),
            privateMode=app.private_mode,
            dbosCloud=False,
        )


class PutAppInputBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    privateMode: bool | None = None


class PatchAppInputBody(BaseModel):
    """Fields left out change nothing. Relay extension: an explicit ``null`` clears a retention setting."""

    model_config = ConfigDict(extra="forbid", strict=True)

    executorTimeoutSecs: int = Field(default=60, ge=1, le=units.timedelta_to_seconds(MAX_EXECUTOR_TIMEOUT))
    gcRowsThreshold: int | None = Field(default=None, gt=0)
    gcTimeThresholdMs: int | None = Field(default=None, gt=0)
    globalTimeoutMs: int | None = Field(default=None, gt=0)
    privateMode: bool = False

    def changes(self) -> dict[str, Any]:
        """The storage fields to change, as ``timedelta`` where they are durations."""
        given = self.model_fields_set
        out: dict[str, Any] = {}
        if "executorTimeoutSecs" in given:
            out["executor_timeout"] = units.seconds_to_timedelta(self.executorTimeoutSecs)
        if "gcRowsThreshold" in given:
            out["gc_rows_threshold"] = self.gcRowsThreshold
        if "gcTimeThresholdMs" in given:
            out["gc_time_threshold"] = units.optional_ms_to_timedelta(self.gcTimeThresholdMs)
        if "globalTimeoutMs" in given:
            out["global_timeout"] = units.optional_ms_to_timedelta(self.globalTimeoutMs)
        if "privateMode" in given:
            out["private_mode"] = self.privateMode
        return out


class Executor(BaseModel):
    """Upstream ``Executor``."""

    executorId: str
    appId: str
    appVersion: str
    status: Literal["HEALTHY", "DISCONNECTED", "DEAD"]
    hostId: str | None
    hostname: str | None
    createdAt: datetime
    updatedAt: datetime
    language: str | None
    dbosVersion: str | None
    executorMetadata: dict[str, Any] | None

    @classmethod
    def of(cls, row: models.Executor, *, app_id: str) -> Executor:
        return cls(
            executorId=row.executor_id,
            appId=app_id,
            appVersion=row.app_version,
            status=row.status.value,
            hostId=None,
            hostname=row.hostname,
            createdAt=row.created_at,
            updatedAt=row.updated_at,
            language=row.language,
            dbosVersion=row.dbos_version,
            executorMetadata=row.executor_metadata,
        )


class Health(BaseModel):
    status: Literal["ok"] = "ok"
