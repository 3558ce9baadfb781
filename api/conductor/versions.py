"""Application versions: the SDKs' version rows, upstream's ``ApplicationVersion`` and setLatestAppVersion's
body."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, Field

from api.conductor.common import RequiredEpochMs, SdkReply
from api.schemas import InputBody, extended


class SdkVersion(SdkReply):
    version_id: str
    version_name: str
    version_timestamp: RequiredEpochMs
    created_at: RequiredEpochMs


class ListVersionsReply(SdkReply):
    output: list[SdkVersion] = []


class ApplicationVersion(BaseModel):
    """Upstream ``ApplicationVersion``."""

    versionId: str
    versionName: str
    versionTimestamp: datetime
    createdAt: datetime


def version_of(v: SdkVersion) -> ApplicationVersion:
    return ApplicationVersion(versionId=v.version_id, versionName=v.version_name,
                              versionTimestamp=v.version_timestamp, createdAt=v.created_at)


class PatchLatestVersionInputBody(InputBody):
    versionName: Annotated[str, Field(min_length=1, json_schema_extra=extended("must not be empty"))]
