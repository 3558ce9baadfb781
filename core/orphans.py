"""The orphan sweep's decision, as logic with no I/O: what to ask an executor, and which executor ids in its
answer are orphans. The activities (``activities.orphans``) call it; the sweep workflow (``workflows.orphans``),
which may not import ``core``, orchestrates them.

An **orphan** is an executor id that owns PENDING workflows created before ``now - min_age`` and that

- has no registry row, in any status, in any app (a row means its lifecycle workflow owns it: HEALTHY,
  DISCONNECTED in its grace, or DEAD being recovered; any app, because two apps may share a system database);
- is not ``local``: DBOS's executor id for a process with no conductor, which recovers its own ``local``
  workflows when it restarts, and which may be alive right now with no way for Relay to know;
- (checked when its lifecycle workflow is started) has no lifecycle workflow running.

The ask (``get_workflow_aggregates``): PENDING workflows grouped by executor id and application version, with
their count and oldest ``created_at``, created no later than ``now - min_age`` (``end_time``: the SDKs compare it,
inclusive, with ``created_at`` in epoch milliseconds, parsing the ISO text with ``datetime.fromisoformat``).
The age is checked again here on ``min_created_at``, in case an SDK ignores the filter.

One executor id with PENDING workflows of several versions: the version of its oldest one is recovered first
(a peer recovers only its own version's workflows); the rest are found by a later sweep.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from core import units
from core.types import Orphan, OrphanInfo

# DBOS's executor id when no conductor key and no DBOS__VMID is set (``dbos._dbos``: ``os.environ.get("DBOS__VMID")
# or "local"``); such a process recovers its own pending workflows at launch.
LOCAL_EXECUTOR_ID = "local"


def aggregates_body(now: datetime, min_age: timedelta) -> dict[str, Any]:
    """The ``get_workflow_aggregates`` body of a sweep at ``now``."""
    return {"group_by_executor_id": True, "group_by_application_version": True, "select_count": True,
            "select_min_created_at": True, "status": ["PENDING"],
            "end_time": units.datetime_to_wire_iso(now - min_age)}


def find_orphans(reply: dict[str, Any], *, registered: set[str], now: datetime,
                 min_age: timedelta) -> list[Orphan]:
    """The orphans in an aggregates reply (``{"output": [{"group": {...}, "count": n, "min_created_at": ms}]}``),
    by executor id. Rows Relay cannot read (no executor id, no count or time) are left out: never guessed."""
    cutoff = now - min_age
    rows: dict[str, list[tuple[datetime, str, int]]] = {}
    output = reply.get("output")
    for row in output if isinstance(output, list) else []:
        if not isinstance(row, dict) or not isinstance(row.get("group"), dict):
            continue
        executor_id, version = row["group"].get("executor_id"), row["group"].get("application_version")
        count, oldest = row.get("count"), _instant(row.get("min_created_at"))
        if (not isinstance(executor_id, str) or not executor_id or executor_id == LOCAL_EXECUTOR_ID
                or executor_id in registered or oldest is None or oldest > cutoff):
            continue
        pending = count if isinstance(count, int) and not isinstance(count, bool) and count > 0 else 0
        if pending == 0:
            continue
        rows.setdefault(executor_id, []).append((oldest, version if isinstance(version, str) else "", pending))
    orphans = []
    for executor_id, versions in sorted(rows.items()):
        versions.sort()
        oldest, version, pending = versions[0]
        others = sorted({v for _, v, _ in versions[1:] if v != version})
        orphans.append(Orphan(executor_id, OrphanInfo(version, pending, oldest, others)))
    return orphans


def audit_details(orphans: list[Orphan], *, asked: str, min_age: timedelta) -> dict[str, Any]:
    """The ``orphans.found`` row's details: ids, counts, oldest ``created_at``; the minimum age in its REST unit."""
    return {
        "executorIds": [o.executor_id for o in orphans],
        "orphans": [{"executorId": o.executor_id, "appVersion": o.info.app_version, "pending": o.info.pending,
                     "oldestCreatedAt": o.info.oldest_created_at.isoformat() if o.info.oldest_created_at else None,
                     "otherVersions": o.info.other_versions} for o in orphans],
        "askedExecutor": asked,
        "orphanMinAgeSecs": units.timedelta_to_seconds(min_age),
        "reason": f"{len(orphans)} executor id(s) with PENDING workflows and no registry row: "
                  + ", ".join(o.executor_id for o in orphans[:5]),
    }


def _instant(value: object) -> datetime | None:
    """``min_created_at`` as the SDKs send it: epoch milliseconds (an int, or its text)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    return units.epoch_ms_to_datetime(value) if isinstance(value, int) else None
