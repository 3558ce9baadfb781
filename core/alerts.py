"""Alerts, as logic with no I/O: what a rule's metadata means, what to ask an executor to observe it, which rule
fires given the answer, how often it may, what an alert says, and how a webhook body is built and signed. The
activities (``activities.alerts``) call it and do the I/O; the evaluation workflow (``workflows.alerts``), which
may not import ``core``, orchestrates them. The shared types (``RuleType``, ``RuleState``, ``OwnEvents``) are
in ``workflows.contracts.alerts``.

Kinds. The upstream rule types (``WorkflowFailure``, ``SlowQueue``, ``UnresponsiveApplication``), each from an
alerting rule of the REST API, and Relay's own, from audit rows that need an operator's eye, sent to the app's
own receivers without any rule: ``RecoveryBlocked`` (``executor.recovery.blocked``), its resolution
``RecoveryUnblocked`` (``executor.recovery.unblocked``), ``RecoveryBreaker`` (``app.recovery.breaker_tripped``)
and ``OrphansFound`` (``orphans.found``). They go out as they happen (``core.own_alerts``).

``ruleMetadata`` (free-form upstream) is read as, every key optional unless said::

    WorkflowFailure          {"workflowName": str, "minFailures": int >= 1 (1)}
    SlowQueue                {"queueName": str (every queue when left out), "thresholdSecs": number > 0 (60)}
    UnresponsiveApplication  {"thresholdSecs": number > 0 (60)}

Unknown keys are kept and ignored; a known key of the wrong type is refused when the rule is created (422: the
REST schema, ``api.schemas.RuleMetadata``, states the same bounds), and so is metadata nested deeper than
``MAX_METADATA_DEPTH`` or larger than ``MAX_METADATA_BYTES`` as JSON (``check_metadata_bounds``): every round
carries every org's rules through Temporal's pydantic converter, whose serializer gives up on deep values.

When a rule fires:

- ``WorkflowFailure``: at least ``minFailures`` workflows (of ``workflowName``, when set) went to ERROR in the
  window since the rule's previous evaluation (the SDK's ``completed_after``/``completed_before``: its
  ``completed_at``). Windows follow each other without gap or overlap, ``WINDOW_LAG`` behind the round's clock.
- ``SlowQueue``: a workflow of the queue (of any queue, without ``queueName``) has been ENQUEUED since before
  ``now - threshold`` (the oldest one's ``min_created_at``, from ``get_workflow_aggregates``).
- ``UnresponsiveApplication``: no HEALTHY executor of the app in the registry for at least the threshold.
  It fires once per outage, then again every ``minIntervalSecs`` while it lasts (none when that is null).

Rate. A rule fires at most once per ``minIntervalSecs`` (null: no limit beyond the evaluation interval). A
firing held back by it is not lost: it is audited (``alert.suppressed``) and counted in the rule, and the next
alert the rule sends says how many were held back.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from core import nesting, units, wire
from core.types import OwnEvents, RuleState, RuleType


class OwnKind(StrEnum):
    """Relay's own alerts, and the audit operation each comes from."""

    RECOVERY_BLOCKED = "RecoveryBlocked"
    RECOVERY_UNBLOCKED = "RecoveryUnblocked"
    RECOVERY_BREAKER = "RecoveryBreaker"
    ORPHANS_FOUND = "OrphansFound"


OWN_OPERATIONS: dict[str, OwnKind] = {
    "executor.recovery.blocked": OwnKind.RECOVERY_BLOCKED,
    "executor.recovery.unblocked": OwnKind.RECOVERY_UNBLOCKED,
    "app.recovery.breaker_tripped": OwnKind.RECOVERY_BREAKER,
    "orphans.found": OwnKind.ORPHANS_FOUND,
}

DEFAULT_THRESHOLD = timedelta(seconds=60)
WINDOW_LAG = timedelta(seconds=2)
MAX_THRESHOLD = timedelta(days=365)
MAX_NAME = 1000  # a workflow or queue name in ruleMetadata
# ruleMetadata as stored: objects and arrays nested at most as deep as any JSON Relay keeps (``core.nesting``: a rule
# 300 deep failed every round), at most this long as compact JSON, small beside Temporal's 2 MB payload, which one
# round's rules of every org share.
MAX_METADATA_DEPTH = nesting.MAX_JSON_DEPTH
MAX_METADATA_BYTES = 8 * 1024


# -- ruleMetadata ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RuleParams:
    """A rule's metadata, read: durations as ``timedelta``."""

    workflow_name: str | None = None
    min_failures: int = 1
    queue_name: str | None = None
    threshold: timedelta = DEFAULT_THRESHOLD


def parse_metadata(rule_type: RuleType, metadata: Any) -> RuleParams:
    """``ruleMetadata`` as ``RuleParams``; ``ValueError`` (saying which key) for a value Relay cannot use."""
    if metadata is None:
        metadata = {}
    if not isinstance(metadata, dict):
        raise ValueError("ruleMetadata must be a JSON object (or null)")
    if rule_type is RuleType.WORKFLOW_FAILURE:
        return RuleParams(workflow_name=_name(metadata, "workflowName"),
                          min_failures=_count(metadata, "minFailures"))
    if rule_type is RuleType.SLOW_QUEUE:
        return RuleParams(queue_name=_name(metadata, "queueName"), threshold=_threshold(metadata))
    return RuleParams(threshold=_threshold(metadata))


def check_metadata_bounds(metadata: Any) -> None:
    """``ValueError`` (saying which bound) for ruleMetadata nested deeper than ``MAX_METADATA_DEPTH`` or larger
    than ``MAX_METADATA_BYTES`` as compact JSON. The depth is measured without recursion, so any value can be asked."""
    nesting.check_depth(metadata, "ruleMetadata", limit=MAX_METADATA_DEPTH)
    size = len(json.dumps(metadata, separators=(",", ":"), ensure_ascii=False).encode())
    if size > MAX_METADATA_BYTES:
        raise ValueError(f"ruleMetadata is {size} bytes as JSON, more than {MAX_METADATA_BYTES}")


def stored_rule_problem(rule_type: str, metadata: Any) -> str | None:
    """Why a stored rule cannot be shown or evaluated (None: it can): what the REST API refuses at creation, found
    in a row stored before it did (or edited by hand). Such a rule is skipped, never allowed to fail the others."""
    try:
        parse_metadata(RuleType(rule_type), metadata)
        check_metadata_bounds(metadata)
    except (ValueError, RecursionError) as err:
        return str(err) or type(err).__name__
    return None


def _name(metadata: dict[str, Any], key: str) -> str | None:
    value = metadata.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > MAX_NAME or "\x00" in value:
        raise ValueError(f"ruleMetadata.{key} must be a non-empty string or null")
    return value


def _count(metadata: dict[str, Any], key: str) -> int:
    value = metadata.get(key, 1)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 2**31 - 1:
        raise ValueError(f"ruleMetadata.{key} must be an integer of at least 1")
    return value


def _threshold(metadata: dict[str, Any]) -> timedelta:
    """``thresholdSecs``: the one place ruleMetadata has a unit (seconds, as its name says)."""
    value = metadata.get("thresholdSecs")
    if value is None:
        return DEFAULT_THRESHOLD
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not 0 < value <= MAX_THRESHOLD.total_seconds():
        raise ValueError(f"ruleMetadata.thresholdSecs must be a number of seconds in (0, "
                         f"{MAX_THRESHOLD.total_seconds():g}]")
    return timedelta(seconds=value)


# -- observations and decisions ----------------------------------------------------------------------------------


@dataclass
class Observation:
    """What was found about a rule's condition; ``failed`` when nothing could be found out (no executor answered):
    nothing fires and the window is not advanced, so the next round looks at it again."""

    failures: int = 0  # WorkflowFailure: workflows gone to ERROR in the window
    failed_names: list[str] = field(default_factory=list)
    oldest_enqueued_at: datetime | None = None  # SlowQueue: the oldest workflow still ENQUEUED
    max_queue_wait: timedelta | None = None  # SlowQueue: the longest wait of a dequeued, running workflow
    failed: str | None = None


@dataclass
class Decision:
    """What to do with a rule after one evaluation, and what to store for it."""

    message: str | None  # the alert's text when the condition holds
    fire: bool  # the condition holds and the rate allows it
    checked_until: datetime | None
    condition_since: datetime | None


def window(rule: RuleState, now: datetime) -> tuple[datetime, datetime]:
    """The WorkflowFailure window ``[start, end)``: from the end of the last one (at first, the rule's creation) to
    ``now``, both ``WINDOW_LAG`` earlier. The lag covers the executor's clock: SDKs on SQLite stamp
    ``completed_at`` to the whole second, and another host's clock may run a little behind Relay's."""
    return (rule.checked_until or rule.created_at - WINDOW_LAG), now - WINDOW_LAG


def may_fire(last_fired_at: datetime | None, min_interval: timedelta | None, now: datetime) -> bool:
    """A rule may fire unless it fired less than ``min_interval`` ago."""
    return last_fired_at is None or min_interval is None or now - last_fired_at >= min_interval


def decide(rule: RuleState, seen: Observation, now: datetime) -> Decision:
    params = parse_metadata(rule.rule_type, rule.metadata)
    if seen.failed is not None:
        return Decision(None, False, rule.checked_until, rule.condition_since)
    message: str | None = None
    checked_until, since = rule.checked_until, rule.condition_since
    if rule.rule_type is RuleType.WORKFLOW_FAILURE:
        start, checked_until = window(rule, now)
        if seen.failures >= params.min_failures:
            which = f" of {params.workflow_name!r}" if params.workflow_name else ""
            names = f" ({', '.join(sorted(set(seen.failed_names))[:5])})" if seen.failed_names else ""
            message = (f"{seen.failures} workflow(s){which}{names} failed in app {rule.app!r} between "
                       f"{_iso(start)} and {_iso(checked_until)}")
    elif rule.rule_type is RuleType.SLOW_QUEUE:
        waited = max((now - seen.oldest_enqueued_at) if seen.oldest_enqueued_at else timedelta(0),
                     seen.max_queue_wait or timedelta(0))
        if waited > params.threshold:
            queue = f"queue {params.queue_name!r}" if params.queue_name else "a queue"
            message = (f"a workflow of {queue} in app {rule.app!r} has waited "
                       f"{waited.total_seconds():.0f} s (threshold {params.threshold.total_seconds():g} s)")
    else:
        if rule.healthy_executors > 0:
            since = None
        else:
            since = since or min(rule.unhealthy_since or now, now)
            outage = now - since
            again = rule.min_interval is not None or rule.last_fired_at is None or rule.last_fired_at < since
            if outage >= params.threshold and again:
                message = (f"app {rule.app!r} has had no HEALTHY executor for {outage.total_seconds():.0f} s "
                           f"(threshold {params.threshold.total_seconds():g} s)")
    fire = message is not None and may_fire(rule.last_fired_at, rule.min_interval, now)
    if fire and rule.suppressed:
        message = f"{message}; {rule.suppressed} earlier firing(s) held back by minIntervalSecs"
    return Decision(message, fire, checked_until, since)


def aggregates_query(rule: RuleState, now: datetime) -> dict[str, Any] | None:
    """The ``get_workflow_aggregates`` body that observes the rule at ``now`` (None: the registry is enough).
    WorkflowFailure's window is ``[start, end)``; the SDK's bounds are inclusive, so it ends a millisecond early."""
    params = parse_metadata(rule.rule_type, rule.metadata)
    if rule.rule_type is RuleType.WORKFLOW_FAILURE:
        start, end = window(rule, now)
        body: dict[str, Any] = {"group_by_name": True, "select_count": True, "status": ["ERROR"],
                                "completed_after": units.datetime_to_wire_iso(start),
                                "completed_before": units.datetime_to_wire_iso(end - timedelta(milliseconds=1))}
        if params.workflow_name:
            body["name"] = [params.workflow_name]
        return body
    if rule.rule_type is RuleType.SLOW_QUEUE:
        body = {"group_by_queue_name": True, "select_count": True, "select_min_created_at": True,
                "status": ["ENQUEUED"]}
        if params.queue_name:
            body["queue_name"] = [params.queue_name]
        return body
    return None


def observe(rule_type: RuleType, reply: dict[str, Any] | None, failure: str | None = None) -> Observation:
    """A ``get_workflow_aggregates`` reply (rows Relay cannot read are skipped) as an observation; ``failure``:
    no executor answered; a reply with ``error_message`` (an SDK without aggregates, say) counts as one."""
    if failure is not None or rule_type is RuleType.UNRESPONSIVE_APPLICATION:
        return Observation(failed=failure)
    body = reply or {}
    if body.get("error_message"):
        return Observation(failed=f"get_workflow_aggregates failed: {wire.error_summary(str(body['error_message']))}")
    rows = [r for r in body.get("output") or [] if isinstance(r, dict)]
    if rule_type is RuleType.WORKFLOW_FAILURE:
        seen = Observation()
        for row in rows:
            count, group = row.get("count"), row.get("group")
            if isinstance(count, int) and not isinstance(count, bool):
                seen.failures += count
                name = group.get("name") if isinstance(group, dict) else None
                if isinstance(name, str):
                    seen.failed_names.append(name)
        return seen
    stamps = [t for t in (_instant(r.get("min_created_at")) for r in rows) if t is not None]
    return Observation(oldest_enqueued_at=min(stamps) if stamps else None)


def _instant(value: object) -> datetime | None:
    """Epoch milliseconds as the SDK sends ``min_created_at``; None for anything else."""
    if not isinstance(value, int | str):
        return None
    try:
        return units.epoch_ms_text_to_datetime(value)
    except ValueError:
        return None


def _iso(t: datetime) -> str:
    return t.astimezone(UTC).isoformat().replace("+00:00", "Z")


# -- Relay's own alerts ------------------------------------------------------------------------------------------


def own_message(events: OwnEvents) -> str:
    kind = OWN_OPERATIONS[events.operation]
    who = f" (executors: {', '.join(sorted(set(events.executor_ids))[:5])})" if events.executor_ids else ""
    details = events.latest_details
    reason = details.get("reason") or details.get("detail")
    if not reason and "down" in details and "population" in details:  # the breaker's row
        reason = f"{details['down']} of {details['population']} executors went down at once; recoveries are paced"
    tail = f": {str(reason)[:300]}" if reason else ""
    what = events.operation if events.count == 1 else f"{events.count} × {events.operation}"
    return f"{kind.value} in app {events.app!r}: {what}{who}{tail}"


# -- the webhook -------------------------------------------------------------------------------------------------

SIGNATURE_HEADER = "X-Relay-Signature"
ALERT_ID_HEADER = "X-Relay-Alert-Id"


def webhook_body(*, alert_id: str, org: str, app: str, kind: str, message: str, time: datetime,
                 rule_id: str | None = None) -> bytes:
    """The POST body: ``org``, ``app``, ``kind``, ``message`` and ``time`` (RFC 3339, UTC), plus the alert's id
    (the same on every retry: a receiver can drop repeats) and the rule's id (null for Relay's own alerts)."""
    body = {"id": alert_id, "org": org, "app": app, "kind": kind, "message": message, "time": _iso(time),
            "ruleId": rule_id}
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()


def sign(body: bytes, secret: str) -> str:
    """``X-Relay-Signature``'s value: ``sha256=`` and the hex HMAC-SHA256 of the exact body bytes."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def verify(body: bytes, secret: str, signature: str) -> bool:
    """What a receiver does (in constant time)."""
    return hmac.compare_digest(sign(body, secret), signature)
