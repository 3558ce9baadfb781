"""What every resource's mapping shares: the base of the SDKs' replies and the field types they are read with,
the optional-but-not-null field types of upstream's request bodies, and the renaming of a body's fields to the
SDKs' names."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from api.schemas import JSON_INT, MAX_JSON_INT, BodyTime
from core import nesting, units

INT32_MAX = 2**31 - 1


# -- the SDKs' replies ----------------------------------------------------------------------------------------------


def _lenient_int(value: Any) -> int | None:
    """An integer the SDKs send as text (``Priority``, ``WorkflowTimeoutMS``). TypeScript writes
    ``String(undefined)`` for a priority it does not have: anything not an integer counts as absent."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _iso_or_none(value: Any) -> datetime | None:
    """``last_fired_at``: the scheduler's ``datetime.isoformat()``, naive when its clock was (taken as UTC). A
    value that does not parse is reported as unknown rather than failing the whole list."""
    return units.iso_to_utc(value)


# An instant as epoch milliseconds, integer or decimal text (``str(created_at)``): parsed by pydantic-core itself
# (``val_temporal_unit``, on every ``SdkReply``), a quarter of the cost of a Python validator per field, as a page
# holds up to a thousand workflows of six instants. The same instant as ``units.epoch_ms_text_to_datetime``; an
# RFC 3339 text with an offset is accepted too, a naive one is not.
EpochMs = AwareDatetime | None
RequiredEpochMs = AwareDatetime
IntText = Annotated[int | None, BeforeValidator(_lenient_int)]
IsoTime = Annotated[datetime | None, BeforeValidator(_iso_or_none)]


class SdkReply(BaseModel):
    """An executor's reply: unknown fields are ignored, a missing required one or a wrong type is an error."""

    model_config = ConfigDict(extra="ignore", val_temporal_unit="milliseconds")


# -- upstream response schemas --------------------------------------------------------------------------------------


class WorkflowIdOutput(BaseModel):
    workflowId: str


class WorkflowIdsOutput(BaseModel):
    workflowIds: list[str]


# -- upstream request bodies ----------------------------------------------------------------------------------------


Count = Annotated[int, Field(ge=0, le=MAX_JSON_INT), JSON_INT]
Names = list[str] | None  # upstream: ``["array", "null"]`` of strings


def _not_null(value: Any) -> Any:
    if value is None:
        raise ValueError("leave the field out instead of sending null")
    return value


def _shallow(value: Any) -> Any:
    """Free-form JSON forwarded to an executor is bounded in depth (``core.nesting``): 422, not a frame the SDK's
    parser or Relay's own serializer gives up on."""
    nesting.check_depth(value, "attributes")
    return value


# Optional and not nullable, as upstream: left out is None (defaults are not validated), an explicit null is refused.
NotNull = BeforeValidator(_not_null)
OptStr = Annotated[str | SkipJsonSchema[None], NotNull]
OptBool = Annotated[bool | SkipJsonSchema[None], NotNull]
OptTime = Annotated[BodyTime | SkipJsonSchema[None], NotNull]
OptAttributes = Annotated[dict[str, Any] | SkipJsonSchema[None], NotNull, BeforeValidator(_shallow)]
OptNames = Annotated[list[str] | SkipJsonSchema[None], NotNull]
BucketMs = Annotated[Annotated[int, Field(gt=0, le=MAX_JSON_INT), JSON_INT] | SkipJsonSchema[None], NotNull]


def _wire(value: Any) -> Any:
    return units.datetime_to_wire_iso(value) if isinstance(value, datetime) else value


def sdk_fields(model: BaseModel, names: dict[str, str]) -> dict[str, Any]:
    """The fields of ``model`` named in ``names`` that are set (not None), under their SDK names."""
    return {sdk: _wire(getattr(model, rest)) for rest, sdk in names.items() if getattr(model, rest) is not None}
