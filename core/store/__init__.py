"""All of Relay's database access, by concern: one ``Store`` wraps one engine and is assembled from a part per
concern, each a module of this package:

- ``base``: the engine, SQLite's one thread (``call``, ``call_first``), the one app lookup (``find_app``,
  ``app_row``), the one key check (``check_key``), and what a database error means (``unavailable``, ``outage``);
- ``keys``: API keys, and what a request's key may do (``authorize_org``, ``authorize_app``);
- ``apps``: applications;
- ``registry``: the executor registry, written for the lifecycle workflows;
- ``claims``: who may carry work (eligible peers), a recovery's peer and its claim, an operator's request's
  candidates and its claim;
- ``gate``: drain, pause and the recovery gate (``core.gate``);
- ``audit``: the audit log and its subjects;
- ``retention``: workflow retention rounds;
- ``alerts``: alerting rules and their evaluation;
- ``autoscale``: autoscaling policies.

Methods are synchronous (SQLAlchemy); async callers run them through ``Store.call``.
"""

from __future__ import annotations

from core.store.alerts import AlertsStore
from core.store.apps import AppsStore
from core.store.audit import API_KEY_SUBJECT, SYSTEM_SUBJECT, TOKEN_OPERATIONS, AuditStore, subject_of, subject_of_key
from core.store.autoscale import AutoscaleStore
from core.store.base import KEY_PREFIX, Principal, _SerialThread, hash_key, outage, unavailable
from core.store.claims import MANAGEMENT_CLAIM_TTL, Candidates, ClaimsStore
from core.store.gate import TICKETS_KEPT, GateStore
from core.store.keys import AppAccess, KeysStore
from core.store.registry import (
    RECOVERY_STEPS,
    BlockedRecovery,
    GraceBegun,
    Move,
    RegistryStore,
    RowSeen,
    StatusWritten,
)
from core.store.retention import RetentionStore


class Store(KeysStore, AppsStore, RegistryStore, ClaimsStore, GateStore, AuditStore, RetentionStore, AlertsStore,
            AutoscaleStore):
    """Relay's database: every part above, on one engine."""


__all__ = [
    "API_KEY_SUBJECT",
    "KEY_PREFIX",
    "MANAGEMENT_CLAIM_TTL",
    "RECOVERY_STEPS",
    "SYSTEM_SUBJECT",
    "TICKETS_KEPT",
    "TOKEN_OPERATIONS",
    "AppAccess",
    "BlockedRecovery",
    "Candidates",
    "Principal",
    "GraceBegun",
    "Move",
    "RowSeen",
    "StatusWritten",
    "Store",
    "_SerialThread",
    "hash_key",
    "outage",
    "subject_of",
    "subject_of_key",
    "unavailable",
]
