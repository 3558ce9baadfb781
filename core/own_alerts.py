"""Relay's own alerts as they happen: the alert an audit row makes, its id, and its rate (the ``ownalertstate``
table).

Whoever writes one of the rows of ``core.alerts.OWN_OPERATIONS`` starts the alert's delivery at once (the lifecycle
workflow for a blocked and an unblocked recovery, and for the breaker trip its admission at the gate wrote; the
orphan sweep's activity for orphans): an ``OwnAlertWorkflow`` whose id derives from the row's event key
(``alert_id``), so the alerts round, which starts any delivery nobody started, and a retried start can never send
one row twice.

Rate. At most one alert per (org, app, kind) per ``RELAY_OWN_ALERT_MIN_INTERVAL_SECS`` (0: no minimum), claimed by
``claim`` under the row's lock, so two deliveries at once cannot both send. An alert held back is not lost: the
first one held back after a send waits until the interval is over and goes out then, saying how many more were held
back, unless another alert of its kind went out first and counted them; each one held back is audited
(``alert.suppressed``). So a ``RecoveryBlocked`` held back behind a ``RecoveryBlocked`` a moment earlier still
arrives, a little late, instead of leaving its ``RecoveryUnblocked`` as the last word.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import Engine
from sqlmodel import Session

from core import alerts
from core.models import OwnAlertState
from core.store.base import InsertOnce
from core.types import Alert, OwnAlertEvent, OwnEvents

# uuid5's namespace for alert ids: any constant (a uuid4 drawn once); changing it would send every row again.
_ALERT_IDS = uuid.UUID("6f1d8a52-3c1e-4f49-9a3c-7f0f4f1f2b4d")


def alert_id(event_key: str) -> str:
    """The alert's id, the same for every start of one audit row's alert (and the webhook's ``id``)."""
    return str(uuid.uuid5(_ALERT_IDS, event_key))


def alert_of(event: OwnAlertEvent) -> Alert:
    """The alert an audit row makes, sent to the app's own receivers."""
    executors = [event.executor_id] if event.executor_id else []
    group = OwnEvents(event.org, event.app, event.operation, 1, executors, dict(event.details))
    kind = alerts.OWN_OPERATIONS[event.operation].value
    return Alert(alert_id(event.event_key), event.org, event.app, event.app, kind, alerts.own_message(group),
                 event.time)


# -- the rate ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rate:
    """One (org, app, kind)'s ``ownalertstate`` row."""

    last_sent_at: datetime | None = None
    last_alert_id: str = ""
    held: int = 0  # alerts held back since ``last_sent_at`` and not yet counted by a sent one


@dataclass(frozen=True)
class Claim:
    send: bool
    held_back: int = 0  # sent: the alerts held back before it that it reports (itself not counted)
    flush_at: datetime | None = None  # held back, the first since the last send: send it then (``claim`` again)
    held_behind: datetime | None = None  # held back: the send it was held behind


def claim(rate: Rate, *, alert_id: str, now: datetime, min_interval: timedelta | None,
          held_behind: datetime | None = None) -> tuple[Rate, Claim]:
    """Whether ``alert_id`` may go out at ``now``, and the row to store. ``held_behind``: the alert was held back
    behind the one sent then and has waited out the interval (its ``flush_at``)."""
    if rate.last_alert_id == alert_id:
        return rate, Claim(send=True)  # a retried claim that went through
    if held_behind is not None:
        if rate.last_sent_at != held_behind or rate.held == 0:
            return rate, Claim(send=False)  # another one went out meanwhile and counted this one
        return Rate(now, alert_id, 0), Claim(send=True, held_back=rate.held - 1)
    if not min_interval or alerts.may_fire(rate.last_sent_at, min_interval, now):
        return Rate(now, alert_id, 0), Claim(send=True, held_back=rate.held)
    assert rate.last_sent_at is not None  # may_fire says so
    first = rate.held == 0
    return (Rate(rate.last_sent_at, rate.last_alert_id, rate.held + 1),
            Claim(send=False, flush_at=rate.last_sent_at + min_interval if first else None,
                  held_behind=rate.last_sent_at))


def message(alert: Alert, outcome: Claim, *, flushed: bool) -> str:
    """The alert's text with what its claim says was held back."""
    more = outcome.held_back
    if flushed:
        since = f"; {more} more {alert.kind} alert(s) of this app held back since" if more else ""
        return f"{alert.message} (sent late: held back by the minimum interval between alerts{since})"
    if more:
        return (f"{alert.message}; {more} earlier {alert.kind} alert(s) of this app held back by the minimum "
                "interval (alert.suppressed in the audit log)")
    return alert.message


# The row is created the first time, and locked before it is read (``InsertOnce.lock``), as the gate's is.
_RATES = InsertOnce(OwnAlertState, "org", "app", "kind")


class OwnAlertRates:
    """The ``ownalertstate`` rows, on the store's engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def claim(self, *, org: str, app: str, kind: str, alert_id: str, now: datetime, min_interval: timedelta | None,
              held_behind: datetime | None = None) -> Claim:
        """``claim`` on the stored row, in one transaction under its lock."""
        with Session(self.engine) as s:
            row = _RATES.lock(s, OwnAlertState(org=org, app=app, kind=kind))
            rate, outcome = claim(Rate(row.last_sent_at, row.last_alert_id, row.held), alert_id=alert_id, now=now,
                                  min_interval=min_interval, held_behind=held_behind)
            row.last_sent_at, row.last_alert_id, row.held = rate.last_sent_at, rate.last_alert_id, rate.held
            s.add(row)
            s.commit()
            return outcome
