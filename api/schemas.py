"""REST request and response models, in the upstream Conductor field names and units.

This is one of the two edges where seconds and milliseconds exist; conversions go through ``core.units``.
Relay-only properties carry ``x-relay-extension: true`` in the spec; upstream properties that Relay accepts
more of (or less of) say how in ``x-relay-extended``.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StringConstraints,
    ValidationInfo,
    field_serializer,
    field_validator,
    model_validator,
)

from core import alerts, models, units
from core.names import APP_PATTERN
from core.store import API_KEY_SUBJECT
from workflows.contracts.alerts import RuleType
from workflows.contracts.common import ExecutorStatus

MAX_EXECUTOR_TIMEOUT = timedelta(days=7)
# Upstream says int64; Relay bounds durations so they fit a timedelta and every database's interval type.
MAX_RETENTION_DURATION = timedelta(days=36_525)  # 100 years
# Upstream's int64 counts are bounded here by the largest integer every JSON client (JavaScript's included)
# reads exactly; the spec states the bound as a float, exact for this value, not for 2**63 - 1.
MAX_JSON_INT = 2**53 - 1

# Upstream leaves token names and audit filters unconstrained; Relay refuses control characters in them
# (PostgreSQL text cannot hold NUL) and bounds their length.
PRINTABLE_PATTERN = r"^[^\x00-\x1f\x7f]+$"
TOKEN_NAME_MAX = 100
FILTER_MAX = 200

EXTENSION: dict[str, Any] = {"x-relay-extension": True}


def extended(how: str) -> dict[str, Any]:
    """Marks an upstream property whose Relay semantics differ, and says how."""
    return {"x-relay-extended": how}


AppNameStr = Annotated[str, StringConstraints(min_length=3, max_length=30, pattern=APP_PATTERN)]


class InputBody(BaseModel):
    """A strict request body: unknown fields and wrong JSON types are refused. Upstream bodies may carry their
    JSON Schema's URL in ``$schema`` (a client echoing a response back); it is accepted and ignored."""

    model_config = ConfigDict(extra="forbid", strict=True)

    schema_url: str = Field(default="", alias="$schema",
                            description="A URL to the JSON Schema for this object (accepted and ignored).")


def _integral(value: Any) -> Any:
    """JSON has one number type: ``60.0`` is the integer 60 to JSON Schema (and to schemathesis), so take it;
    ``60.5``, ``"60"`` and ``true`` still fail the strict integer check."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


JSON_INT = BeforeValidator(_integral)  # in strict models: no strings, booleans or fractions for an integer


# -- applications --------------------------------------------------------------------------------------------


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
    crossVersionRecovery: bool = Field(
        default=False, json_schema_extra={**EXTENSION, "description": (
            "Relay extension: when no HEALTHY executor runs a dead executor's version, recover through another "
            "version. Current SDKs recover only their own version's workflows, so this rarely helps.")})

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
            crossVersionRecovery=app.cross_version_recovery,
        )


class PutAppInputBody(InputBody):
    """Upstream ``PutAppInputBody``: ``privateMode`` left out keeps the current value."""

    privateMode: bool = False


# The bounds sit inside each type, before the validator, so the spec states them on the integer branch of
# ``X | None`` as minimum/maximum.
ExecutorTimeoutSecs = Annotated[int, Field(ge=1, le=units.timedelta_to_seconds(MAX_EXECUTOR_TIMEOUT)), JSON_INT]


def _a_second_at_least(value: Any, info: ValidationInfo) -> Any:
    """A threshold under a second is a unit slip (``core.units.MIN_THRESHOLD``): refused, saying what it may have
    meant. Runs after ``JSON_INT`` (``7.0`` is 7) and before the strict integer check, whose bound would say less."""
    if isinstance(value, int) and not isinstance(value, bool):
        problem = units.threshold_ms_problem(info.field_name or "the threshold", value)
        if problem is not None:
            raise ValueError(problem)
    return value


RetentionMs = Annotated[int, Field(ge=units.timedelta_to_ms(units.MIN_THRESHOLD),
                                   le=units.timedelta_to_ms(MAX_RETENTION_DURATION)),
                        BeforeValidator(_a_second_at_least), JSON_INT]
RowCount = Annotated[int, Field(gt=0, le=MAX_JSON_INT), JSON_INT]
_CLEARABLE = extended("null clears the setting (Relay extension; upstream accepts integers only)")


class PatchAppInputBody(InputBody):
    """Fields left out change nothing. Relay extension: an explicit ``null`` clears a retention setting."""

    executorTimeoutSecs: ExecutorTimeoutSecs = 60
    gcRowsThreshold: RowCount | None = Field(default=None, json_schema_extra=_CLEARABLE)
    gcTimeThresholdMs: RetentionMs | None = Field(default=None, json_schema_extra=_CLEARABLE)
    globalTimeoutMs: RetentionMs | None = Field(default=None, json_schema_extra=_CLEARABLE)
    privateMode: bool = False
    crossVersionRecovery: bool = Field(default=False, json_schema_extra=EXTENSION)

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
        if "crossVersionRecovery" in given:
            out["cross_version_recovery"] = self.crossVersionRecovery
        return out


class Executor(BaseModel):
    """Upstream ``Executor``."""

    executorId: str
    appId: str
    appVersion: str
    status: ExecutorStatus
    hostId: str | None
    hostname: str | None
    createdAt: datetime
    updatedAt: datetime
    language: str | None
    dbosVersion: str | None
    executorMetadata: dict[str, Any] | None
    gateway: str | None = Field(default=None, json_schema_extra={**EXTENSION, "description": (
        "Relay extension: the gateway process that holds (or last held) its socket, by its RELAY_GATEWAY_ID; null "
        "when unknown")})

    @classmethod
    def of(cls, row: models.Executor, *, app_id: str, gateway: str | None = None) -> Executor:
        return cls(
            executorId=row.executor_id,
            appId=app_id,
            appVersion=row.app_version,
            status=row.status,
            hostId=None,
            hostname=row.hostname,
            createdAt=row.created_at,
            updatedAt=row.updated_at,
            language=row.language,
            dbosVersion=row.dbos_version,
            executorMetadata=row.executor_metadata,
            gateway=gateway,
        )


# -- tokens --------------------------------------------------------------------------------------------------


class CreateTokenInputBody(InputBody):
    """Upstream ``CreateTokenInputBody``. ``appNames`` restricts the token to those apps (null or empty: every
    app of the org). Relay tokens carry no permissions beyond that, so ``permissions`` must be empty."""

    appNames: list[AppNameStr] | None = Field(
        default=None, max_length=100, json_schema_extra={"uniqueItems": True, **extended("at most 100 names")})
    permissions: list[str] | None = Field(
        default=None, max_length=0, json_schema_extra=extended("Relay has no permissions: null or [] only"))

    @field_validator("appNames")
    @classmethod
    def _unique(cls, names: list[str] | None) -> list[str] | None:
        if names is not None and len(set(names)) != len(names):
            raise ValueError("appNames must not repeat a name")
        return names


class TokenCreated(BaseModel):
    """Upstream ``TokenCreated``: the key itself, shown this once (only its hash is stored)."""

    token: str
    tokenName: str


class Token(BaseModel):
    """Upstream ``Token``, never with its secret."""

    tokenName: str
    createdAt: datetime
    permissions: list[str]
    appIds: list[str] = Field(description="ids of the registered apps among the token's apps; [] when org-wide")
    appNames: list[str] | None = Field(
        description="the apps the token is restricted to, by name, registered or not; null when org-wide",
        json_schema_extra=EXTENSION)


# -- audit log -----------------------------------------------------------------------------------------------


class AuditSubject(BaseModel):
    """Upstream ``AuditSubject``: who acted. Relay extension: ``type: system`` for Relay's own actions (the
    lifecycle workflow, recoveries, retention)."""

    type: Literal["user", "api_key", "system"] = Field(json_schema_extra={"x-relay-extension-enum": ["system"]})
    id: str
    display: str

    @classmethod
    def of(cls, stored: str, key_names: dict[str, str]) -> AuditSubject:
        """A stored subject (``system`` or ``api_key:<key id>``; older rows ``key:<key name>``), the key by its
        name from ``key_names`` (by key id), or by its id once the key is gone."""
        if stored.startswith(API_KEY_SUBJECT):
            key_id = stored.removeprefix(API_KEY_SUBJECT)
            return cls(type="api_key", id=key_id, display=key_names.get(key_id, key_id))
        if stored.startswith("key:"):  # rows written before subjects carried the key id
            name = stored.removeprefix("key:")
            return cls(type="api_key", id=name, display=name)
        return cls(type="system", id="system", display="Relay")


class AuditTarget(BaseModel):
    """Upstream ``AuditTarget``: what was acted on (an application by name, a token by name, or the org)."""

    type: Literal["application", "token", "organization"]
    id: str


class AuditLogEntry(BaseModel):
    """Upstream ``AuditLogEntry``. Entries about an executor target its application and carry its id in
    ``details.executorId``."""

    id: str
    emitTime: datetime
    operation: str
    status: Literal["success", "failure"]
    subject: AuditSubject
    target: AuditTarget
    sourceIp: str
    details: dict[str, Any] | None


# RFC 3339 ``date-time`` (the spec's format), not every form pydantic parses (``0.5`` is a Unix time to it).
_RFC3339 = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")


def _rfc3339(value: Any) -> Any:
    if isinstance(value, str) and not _RFC3339.fullmatch(value):
        raise ValueError("not an RFC 3339 date-time, e.g. 2025-01-31T12:00:00Z")
    return value


def _utc(value: datetime) -> datetime:
    try:
        return value.astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+01:00 is before datetime.min in UTC
        raise ValueError("date-time out of range") from None


UTCTime = Annotated[AwareDatetime, BeforeValidator(_rfc3339), AfterValidator(_utc)]


def _rfc3339_text(value: Any) -> Any:
    """A request body's date-time is RFC 3339 text: not a number (pydantic's lax mode reads 0.5 as a Unix time)."""
    if not isinstance(value, str):
        raise ValueError("not an RFC 3339 date-time, e.g. 2025-01-31T12:00:00Z")
    return _rfc3339(value)  # the pattern the query parameters use too


# Strict bodies take JSON only: a date-time is parsed from its text here (strict mode would refuse any string).
BodyTime = Annotated[AwareDatetime, Field(strict=False), BeforeValidator(_rfc3339_text), AfterValidator(_utc)]


class Health(BaseModel):
    status: Literal["ok"] = "ok"


# -- drain, pause and the recovery-storm breaker (Relay extensions) ------------------------------------------------

# The longest drain or pause one request may set: a forgotten one then ends by itself within a month.
MAX_SAFETY_EXPIRY = timedelta(days=30)
ExpiresInSecs = Annotated[int, Field(ge=1, le=units.timedelta_to_seconds(MAX_SAFETY_EXPIRY)), JSON_INT]
Reason = Annotated[str, StringConstraints(max_length=FILTER_MAX, pattern=r"^[^\x00-\x1f\x7f]*$")]


class _ExpiringInputBody(InputBody):
    """What a drain or a pause is set with: it ends by itself after ``expiresInSecs`` seconds."""

    model_config = ConfigDict(json_schema_extra=EXTENSION)

    expiresInSecs: ExpiresInSecs
    reason: Reason = ""

    @property
    def expires_in(self) -> timedelta:
        return units.seconds_to_timedelta(self.expiresInSecs)


SUBJECT_NAME = "the subject as the audit log displays it: the key's name (its id once deleted), `Relay` for system"


class DrainInputBody(_ExpiringInputBody):
    """Relay extension: drain an executor for ``expiresInSecs`` seconds (it then ends by itself)."""


class Drain(BaseModel):
    """Relay extension: an executor's drain. While ``active``, the executor is never chosen to recover others or
    to carry an operator's request; its own lifecycle (and its recovery, should it die) is unchanged. An expired
    drain is kept, inactive, until it is replaced or deleted."""

    model_config = ConfigDict(json_schema_extra=EXTENSION)

    executorId: str
    until: datetime
    active: bool
    reason: str
    subject: str = Field(description="who drained it: `system`, or `api_key:<key id>`")
    subjectName: str = Field(description=SUBJECT_NAME)
    createdAt: datetime

    @classmethod
    def of(cls, row: models.ExecutorDrain, *, now: datetime, key_names: dict[str, str]) -> Drain:
        return cls(executorId=row.executor_id, until=row.until, active=row.until > now, reason=row.reason,
                   subject=row.subject, subjectName=AuditSubject.of(row.subject, key_names).display,
                   createdAt=row.created_at)


class PauseInputBody(_ExpiringInputBody):
    """Relay extension: pause an app's recoveries for ``expiresInSecs`` seconds (a maintenance window)."""


class RecoveryPause(BaseModel):
    """Relay extension: an app's recovery pause. While ``active``, DEAD executors wait (durably) for it to end;
    then they are recovered one at a time, at the breaker's pace."""

    model_config = ConfigDict(json_schema_extra=EXTENSION)

    until: datetime
    active: bool
    reason: str
    subject: str = Field(description="who paused it: `system`, or `api_key:<key id>`")
    subjectName: str = Field(description=SUBJECT_NAME)
    createdAt: datetime

    @classmethod
    def of(cls, row: models.RecoveryPause, *, now: datetime, key_names: dict[str, str]) -> RecoveryPause:
        return cls(until=row.until, active=row.until > now, reason=row.reason, subject=row.subject,
                   subjectName=AuditSubject.of(row.subject, key_names).display, createdAt=row.created_at)


class RecoveryBreaker(BaseModel):
    """Relay extension: the app's recovery-storm breaker. Tripped, recoveries go one at a time, one per
    RELAY_RECOVERY_PACE_SECS; it resets once no executor died for a window and the backlog is through."""

    model_config = ConfigDict(json_schema_extra=EXTENSION)

    tripped: bool
    trippedAt: datetime | None
    trips: int = Field(description="times it tripped, ever")
    lastSlotAt: datetime | None = Field(description="the last paced slot handed out (may be in the future)")


class RecoveryWaiting(BaseModel):
    """Relay extension: a DEAD executor whose recovery the gate holds."""

    model_config = ConfigDict(json_schema_extra=EXTENSION)

    executorId: str
    diedAt: datetime
    slotAt: datetime | None = Field(description="when it may go (paced); null while paused")
    reason: str = Field(description="`paused` or `paced`")


class RecoveryBlocked(BaseModel):
    """Relay extension: a DEAD executor whose recovery waits for a peer (no HEALTHY, undrained executor of its
    version): it goes ahead when one connects, or a drain of one ends."""

    model_config = ConfigDict(json_schema_extra=EXTENSION)

    executorId: str
    appVersion: str
    diedAt: datetime
    blockedAt: datetime
    reason: str
    drainedPeers: list[str] = Field(description="HEALTHY executors of its version that a drain keeps from recovering "
                                                "it (`relay drain clear` ends a drain)")


class RecoveryStatus(BaseModel):
    """Relay extension: an app's recovery gate: its pause (null: none was set), breaker and waiting recoveries,
    and the recoveries blocked for lack of a peer."""

    model_config = ConfigDict(json_schema_extra=EXTENSION)

    pause: RecoveryPause | None
    breaker: RecoveryBreaker
    waiting: list[RecoveryWaiting]
    blocked: list[RecoveryBlocked]


# -- alerting rules ------------------------------------------------------------------------------------------

RuleTypeName = Literal["WorkflowFailure", "SlowQueue", "UnresponsiveApplication"]
# Upstream's int32.
MinIntervalSecs = Annotated[int, Field(ge=0, le=2**31 - 1), JSON_INT]
# A workflow or queue name: any text but NUL, which PostgreSQL's JSON cannot hold.
RuleName = Annotated[str, StringConstraints(min_length=1, max_length=alerts.MAX_NAME, pattern=r"^[^\x00]+$")]


class RuleMetadata(BaseModel):
    """What Relay reads of ``ruleMetadata`` (free-form upstream); other keys are kept and ignored. Which rule type
    reads which key, and the defaults, are in ``core.alerts``."""

    model_config = ConfigDict(extra="allow", strict=True, json_schema_extra=extended(
        "Relay reads workflowName and minFailures (WorkflowFailure), queueName (SlowQueue; every queue when left "
        "out) and thresholdSecs (SlowQueue, UnresponsiveApplication; default 60); the whole object at most "
        f"{alerts.MAX_METADATA_DEPTH} levels deep and {alerts.MAX_METADATA_BYTES} bytes as JSON"))

    workflowName: RuleName | None = None
    minFailures: Annotated[int, Field(ge=1, le=2**31 - 1), JSON_INT] = 1
    queueName: RuleName | None = None
    thresholdSecs: Annotated[float, Field(gt=0, le=alerts.MAX_THRESHOLD.total_seconds())] = \
        alerts.DEFAULT_THRESHOLD.total_seconds()

    @field_serializer("thresholdSecs")
    def _as_sent(self, value: float) -> int | float:
        """A whole number of seconds is stored and shown back as one (``120``, not ``120.0``): pydantic makes every
        number of a ``float`` field a float."""
        return int(value) if value.is_integer() else value

    @model_validator(mode="before")
    @classmethod
    def _bounded(cls, value: Any) -> Any:
        """Stored metadata is bounded (``core.alerts.check_metadata_bounds``): a rule nested hundreds deep could
        be stored but not shown, and failed every org's alerts round."""
        alerts.check_metadata_bounds(value)
        return value


class CreateAlertInputBody(InputBody):
    """Upstream ``CreateAlertInputBody``. ``receivingAppName`` left out: the rule's own app receives its alerts
    (by webhook, RELAY_ALERT_WEBHOOK_URL, and by the ``alert`` message to one of its executors)."""

    ruleType: RuleTypeName
    ruleMetadata: RuleMetadata | None
    minIntervalSecs: MinIntervalSecs | None = Field(
        default=None, json_schema_extra=extended("null or left out: no minimum beyond the evaluation interval"))
    receivingAppName: AppNameStr | None = Field(
        default=None, json_schema_extra=extended("left out or null: the rule's own app"))

    def metadata(self) -> dict[str, Any] | None:
        """``ruleMetadata`` as sent (the keys given, unknown ones included), to store and show back."""
        return None if self.ruleMetadata is None else self.ruleMetadata.model_dump(exclude_unset=True)


class AlertingRule(BaseModel):
    """Upstream ``AlertingRule``: ``appId`` and ``receivingAppId`` are the apps' ids (``Application.id``);
    ``receivingAppName`` (Relay extension) is the receiving app by name, as ``CreateAlertInputBody`` takes it."""

    id: str
    appId: str
    receivingAppId: str
    receivingAppName: str = Field(description="the app that receives the rule's alerts, by name",
                                  json_schema_extra=EXTENSION)
    ruleType: RuleTypeName
    ruleMetadata: Any
    minIntervalSecs: int | None
    lastFiredAt: datetime | None

    @classmethod
    def of(cls, rule: models.AlertingRule) -> AlertingRule:
        return cls(id=rule.id, appId=rule.app_id, receivingAppId=rule.receiving_app_id,
                   receivingAppName=rule.receiving_app, ruleType=RuleType(rule.rule_type).value,
                   ruleMetadata=rule.rule_metadata,
                   minIntervalSecs=None if rule.min_interval is None else units.timedelta_to_seconds(rule.min_interval),
                   lastFiredAt=rule.last_fired_at)
