"""Storage models (SQLModel tables) and the engine factory.

Timestamps are stored as timezone-aware UTC (SQLite drops the zone, so a column type restores it); durations
are stored as ``timedelta`` (SQLAlchemy ``Interval``), never as raw seconds or milliseconds.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Engine,
    Interval,
    TypeDecorator,
    UniqueConstraint,
    event,
    false,
)
from sqlmodel import Field, SQLModel, create_engine

from core import migrations
from core.settings import DatabasePool, Settings
from core.types import ExecutorStatus
from core.units import utcnow


class UTCDateTime(TypeDecorator[datetime]):
    """A ``DateTime`` that always comes back timezone-aware (UTC)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is not None and value.tzinfo is None:
            raise ValueError("naive datetime")
        return None if value is None else value.astimezone(UTC)

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def new_id() -> str:
    return str(uuid.uuid4())


DEFAULT_EXECUTOR_TIMEOUT = timedelta(seconds=60)
DEFAULT_GC_ROWS_THRESHOLD = 1_000_000


class ApiKey(SQLModel, table=True):
    id: str = Field(default_factory=new_id, primary_key=True)
    org: str = Field(index=True)
    name: str
    key_hash: str = Field(unique=True, index=True)
    apps: list[str] | None = Field(default=None, sa_column=Column(JSON))
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    revoked_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


class Application(SQLModel, table=True):
    __table_args__ = (UniqueConstraint("org", "name"),)

    id: str = Field(default_factory=new_id, primary_key=True)
    org: str = Field(index=True)
    name: str
    executor_timeout: timedelta = Field(default=DEFAULT_EXECUTOR_TIMEOUT, sa_type=Interval)
    gc_time_threshold: timedelta | None = Field(default=None, sa_type=Interval)
    gc_rows_threshold: int | None = DEFAULT_GC_ROWS_THRESHOLD
    global_timeout: timedelta | None = Field(default=None, sa_type=Interval)
    private_mode: bool = False
    # Relay extension: when no HEALTHY executor runs a dead executor's version, try other versions (current SDKs
    # recover only their own version's workflows, so confirmation may keep failing).
    cross_version_recovery: bool = False
    language: str | None = None
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class RecoveryClaim(SQLModel, table=True):
    """Which peer a dead executor's recovery is on: counts recoveries in flight, to spread them."""

    org: str = Field(primary_key=True)
    app: str = Field(primary_key=True)
    dead_executor_id: str = Field(primary_key=True)
    candidate_id: str = Field(index=True)
    claimed_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class ManagementClaim(SQLModel, table=True):
    """Which executor an operator's slow request is on: counted as work in flight there, beside the recovery
    claims, so a recovery goes to a free peer; one left behind by a gateway that died mid-request expires."""

    org: str = Field(primary_key=True)
    app: str = Field(primary_key=True)
    request_id: str = Field(primary_key=True)
    candidate_id: str
    claimed_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class Executor(SQLModel, table=True):
    """The registry row the REST API reads; written only by activities on behalf of the lifecycle workflow."""

    org: str = Field(primary_key=True)
    app: str = Field(primary_key=True)
    executor_id: str = Field(primary_key=True)
    app_version: str = ""
    status: ExecutorStatus = ExecutorStatus.HEALTHY
    hostname: str | None = None
    language: str | None = None
    dbos_version: str | None = None
    executor_metadata: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))
    # Where the executor's socket lives, so a socket-bound activity can be routed to that gateway process.
    gateway_queue: str | None = None
    connection_id: str | None = None
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class AuditLog(SQLModel, table=True):
    id: str = Field(default_factory=new_id, primary_key=True)
    # Set by the writer when the same event may be written twice (a retried activity): unique, so it lands once.
    event_key: str | None = Field(default=None, unique=True)
    emit_time: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime, index=True)
    org: str = Field(index=True)
    app: str | None = None
    executor_id: str | None = None
    operation: str = Field(index=True)
    status: str = "success"
    subject: str = "system"
    source_ip: str = ""
    details: dict[str, Any] | None = Field(default=None, sa_column=Column(JSON))


class RetentionState(SQLModel, table=True):
    """When each app's last retention round was started. A table of its own rather than a column on
    ``Application``: it predates migrations, when ``create_all`` added missing tables, never missing columns."""

    org: str = Field(primary_key=True)
    app: str = Field(primary_key=True)
    # The round's own clock (the workflow's), the instant its cutoffs were computed from.
    last_started_at: datetime = Field(sa_type=UTCDateTime)
    executor_id: str | None = None
    request_id: str | None = None


class ExecutorDrain(SQLModel, table=True):
    """An operator's drain of one executor until ``until``: never chosen to recover others or to carry an operator's
    request. A table of its own, not a column of ``Executor``: the lifecycle workflow rewrites that row on every
    status change, and a drain must outlive those writes. An expired row is ignored, not deleted."""

    org: str = Field(primary_key=True)
    app: str = Field(primary_key=True)
    executor_id: str = Field(primary_key=True)
    until: datetime = Field(sa_type=UTCDateTime)
    subject: str = "system"
    reason: str = ""
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class RecoveryPause(SQLModel, table=True):
    """An app's recovery paused until ``until`` (a maintenance window): DEAD executors wait, then are paced."""

    org: str = Field(primary_key=True)
    app: str = Field(primary_key=True)
    until: datetime = Field(sa_type=UTCDateTime)
    subject: str = "system"
    reason: str = ""
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class AutoscalingPolicy(SQLModel, table=True):
    """An app's autoscaling policy (upstream ``AutoscalePolicy``, ``core.autoscale``): its queue, and the rollout's
    fields, None where left out. One per app, deleted with it."""

    org: str = Field(primary_key=True)
    app: str = Field(primary_key=True)
    queue: str
    # BIGINT: upstream's fields are int64, and the API takes any JSON-safe integer (PostgreSQL's INTEGER is 32-bit).
    max_old_versions: int | None = Field(default=None, sa_type=BigInteger)
    max_old_executors: int | None = Field(default=None, sa_type=BigInteger)
    subject: str = "system"
    updated_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class RecoveryGate(SQLModel, table=True):
    """An app's recovery gate (``core.gate``): the storm breaker and the last paced slot handed out. Every
    admission locks the row first (inserted if absent, then ``SELECT ... FOR UPDATE``; SQLite's write lock), then
    bumps ``version``, so admissions of one app are serialized."""

    org: str = Field(primary_key=True)
    app: str = Field(primary_key=True)
    tripped_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    trips: int = 0
    last_slot_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    last_granted_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    version: int = 0


class RecoveryTicket(SQLModel, table=True):
    """One death's passage through the gate: when it asked first, the slot it was given, when it was let through,
    and the peer that carried it (recent tickets spread recoveries over the survivors)."""

    org: str = Field(primary_key=True)
    app: str = Field(primary_key=True)
    executor_id: str = Field(primary_key=True)
    # The death this is about (the lifecycle workflow's own key): a revived executor that dies again asks anew.
    ticket: str
    died_at: datetime = Field(sa_type=UTCDateTime)
    slot_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    granted_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    paused: bool = False  # it waited for a pause: paced afterwards, and not counted as part of a storm
    held: str = ""  # why it was last told to wait ("paused", "paced"): audited once per reason
    candidate_id: str | None = None


class GatewayProcess(SQLModel, table=True):
    """One gateway process (an incarnation), by its own task queue, and whether it is known gone.

    ``identity`` is the stable name the process runs under (``RELAY_GATEWAY_ID``): a process restarted under the
    same identity makes its predecessors gone. ``gone_at`` is set when the process is known gone — its watch found
    it gone, it retired (SIGTERM), or a successor started — and cleared only by the process itself, back in contact
    with Temporal and before it accepts a socket again (``core.gateways``). The fence never probes a gateway known
    gone: it holds no socket, and probing it would only wait out the probe's timeout."""

    queue: str = Field(primary_key=True)
    identity: str = Field(index=True)
    started_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)
    gone_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    gone_reason: str = ""
    # What the process last reported to its peers (``gateway.balance``): the executor sockets it held, whether it
    # took new ones (not draining, not fenced), and when. A row not reported lately is not counted among the live.
    sockets: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    accepting: bool = Field(default=False, sa_column_kwargs={"server_default": false()})
    reported_at: datetime | None = Field(default=None, sa_type=UTCDateTime)


PG_CONNECT_TIMEOUT_S = 5


def engine_url(url: str) -> str:
    """``url`` with Relay's driver: SQLAlchemy's default PostgreSQL driver is psycopg2, Relay's ``postgres`` extra
    installs psycopg (3). libpq's own options (``sslmode``, ``sslrootcert``, ...) pass through in the query."""
    if url.startswith("postgresql://"):
        return "postgresql+psycopg://" + url.removeprefix("postgresql://")
    return url


def open_engine(settings: Settings) -> Engine:
    """The process's engine, as its settings say: RELAY_DATABASE_URL (or the data dir's SQLite file), its pool,
    and whether it migrates on start (RELAY_MIGRATE_ON_START)."""
    return make_engine(settings.db_url, settings.database_pool, migrate=settings.migrate_on_start)


def make_engine(url: str, database: DatabasePool | None = None, *, migrate: bool = True) -> Engine:
    """Engine on a database at the newest schema (``core.migrations``). With ``migrate`` an older database is
    upgraded first, safely when several processes start at once; without, it is only checked, with no DDL. A
    database this code cannot run on, newer than its head or (without ``migrate``) older, raises
    ``SchemaVersionError``. SQLite gets WAL and a busy timeout: gateway and worker share the file. PostgreSQL
    (``postgresql+psycopg://``, the ``postgres`` extra) gets a pre-pinged pool sized, and a statement timeout, from
    ``database`` (default: ``DatabasePool``'s). A process opens its store with ``open_engine``."""
    url = engine_url(url)
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})

        @event.listens_for(engine, "connect")
        def _pragmas(conn: Any, _record: Any) -> None:
            cur = conn.cursor()
            cur.execute("PRAGMA busy_timeout=30000")
            _wal(cur)
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()
    else:
        db = database or DatabasePool()
        # Pre-ping: a pooled connection that a restarted PostgreSQL dropped is replaced at checkout instead of
        # failing the next query. A connect timeout (libpq's, in seconds) keeps an unreachable host from holding a
        # request or an activity for the kernel's TCP timeout (minutes): it fails, and is retried, in seconds.
        args: dict[str, Any] = {}
        if url.startswith("postgresql"):
            args["connect_timeout"] = PG_CONNECT_TIMEOUT_S
            if db.statement_timeout_secs:
                args["options"] = f"-c statement_timeout={round(db.statement_timeout_secs * 1000)}"
        engine = create_engine(url, pool_pre_ping=True, pool_size=db.pool_size, max_overflow=db.max_overflow,
                               pool_timeout=db.pool_timeout_secs, connect_args=args)
    try:
        if migrate:
            migrations.upgrade(engine)
        else:
            migrations.check(engine)
    except BaseException:
        engine.dispose()
        raise
    return engine


# Turning a new database to WAL needs it to itself, and SQLite answers "database is locked" at once rather than
# through the busy timeout: processes (or threads) opening a new database together retry for this long.
WAL_SWITCH_WAIT = timedelta(seconds=10)


def _wal(cur: Any) -> None:
    deadline = time.monotonic() + WAL_SWITCH_WAIT.total_seconds()
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as err:
            if "locked" not in str(err) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


class AlertingRule(SQLModel, table=True):
    """An alerting rule (upstream ``AlertingRule``) and its evaluation state (``core.alerts``). The app and the
    receiving app are kept by name (what delivery routes by) and by id (what the REST API shows): rules of an app
    deleted and registered again under the same name are not its rules."""

    id: str = Field(default_factory=new_id, primary_key=True)
    org: str = Field(index=True)
    app: str
    app_id: str = Field(index=True)
    receiving_app: str
    receiving_app_id: str
    rule_type: str
    rule_metadata: Any = Field(default=None, sa_column=Column(JSON))
    min_interval: timedelta | None = Field(default=None, sa_type=Interval)
    last_fired_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    # The end of the last window evaluated (WorkflowFailure), and since when the app has been seen without a
    # HEALTHY executor (UnresponsiveApplication).
    checked_until: datetime | None = Field(default=None, sa_type=UTCDateTime)
    condition_since: datetime | None = Field(default=None, sa_type=UTCDateTime)
    # Firings held back by min_interval since the rule last fired: the next alert counts them.
    suppressed: int = 0
    created_at: datetime = Field(default_factory=utcnow, sa_type=UTCDateTime)


class AlertWatermark(SQLModel, table=True):
    """How far the alerts round has read the audit log for Relay's own alerts (one row, ``name`` "audit")."""

    name: str = Field(primary_key=True)
    until: datetime = Field(sa_type=UTCDateTime)


class OwnAlertState(SQLModel, table=True):
    """The rate of Relay's own alerts of one kind about one app (``core.own_alerts``): the last one sent, and how
    many were held back since."""

    org: str = Field(primary_key=True)
    app: str = Field(primary_key=True)
    kind: str = Field(primary_key=True)
    last_sent_at: datetime | None = Field(default=None, sa_type=UTCDateTime)
    last_alert_id: str = ""
    held: int = 0
