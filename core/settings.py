"""Relay's settings: one class, read from ``RELAY_*`` environment variables at start-up.

Durations enter as seconds (the unit the variable names say) and become ``timedelta`` here, at the edge.
"""

from __future__ import annotations

import socket
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from core import units
from core.gate import GatePolicy

# RELAY_WORKER_STICKY_TIMEOUT_SECS unset (``Settings.worker_sticky_timeout``), and a worker built without settings.
# 1 s made a SIGKILLed worker's timers later by at most 1 s, but under a burst (a gateway's executors moving at once,
# deaths at once) nearly every task timed out on its sticky queue and loaded the server with a second dispatch and a
# whole-history fetch; at the SDK's 10 s, 1,000 deaths at once still timed out 1,710 tasks on one worker, each redone
# from its whole history, which slowed the rest: DEAD up to 63 s late (p99) against 43 s with none timed out at 30 s
# (docs/pages/guides/scaling.md). A SIGTERMed worker tells the server its sticky queue is gone, so a deploy costs no
# lateness at any value.
DEFAULT_WORKER_STICKY_TIMEOUT = timedelta(seconds=30)


@dataclass(frozen=True)
class DatabasePool:
    """Relay's connection pool on PostgreSQL (``Settings``' ``RELAY_DATABASE_*``; SQLite ignores it), as
    ``core.models.make_engine`` applies it."""

    # Connections kept open per process (gateway, worker), and how many more it may open under load.
    pool_size: int = 5
    max_overflow: int = 10
    # How long a request or activity waits for a free pooled connection before it fails (as unavailable: 503).
    pool_timeout_secs: float = 30
    # PostgreSQL's statement_timeout for Relay's sessions; 0: none (the server's own setting).
    statement_timeout_secs: float = 0


class Settings(BaseSettings):
    """Every ``RELAY_*`` environment setting, with its default (docs/pages/reference/settings.md lists them, with what
    each means)."""

    # Inputs hidden in validation errors: they would print secrets (a key, a database URL with its password).
    model_config = SettingsConfigDict(env_prefix="RELAY_", extra="ignore", hide_input_in_errors=True)

    host: str = Field(default="127.0.0.1", description="Address the gateway listens on (WebSocket and REST).")
    port: int = Field(default=8090, ge=0, le=65535, description=(
        "Port the gateway listens on (WebSocket and REST); 0 picks a free one."))
    data_dir: Path = Field(default=Path(".relay"), description=(
        "Where `relay dev` keeps its embedded Temporal database, Relay's SQLite database and the dev key."))
    database_url: str | None = Field(default=None, description=(
        "Relay's database, as a SQLAlchemy URL. Unset: SQLite in the data dir. PostgreSQL: "
        "`postgresql+psycopg://user@host:port/db`, with the `postgres` extra."))
    # Secrets may come from files instead (RELAY_DATABASE_URL_FILE, RELAY_API_KEY_FILE,
    # RELAY_ALERT_WEBHOOK_SECRET_FILE: a mounted Kubernetes or Docker secret), never both (``_secrets_from_files``).
    database_url_file: Path | None = Field(default=None, description=(
        "Read `RELAY_DATABASE_URL` from this file instead (a mounted Kubernetes or Docker secret), one trailing "
        "newline stripped; setting both is an error at start."))
    # Relay's connection pool on PostgreSQL (SQLite ignores these): connections kept open per process (gateway,
    # worker), how many more it may open under load, how long a request or activity waits for a free one (then it
    # fails as unavailable: 503, or a retry), and PostgreSQL's statement_timeout for its sessions (0: the server's).
    database_pool_size: int = Field(default=5, ge=1, description=(
        "PostgreSQL: connections each process (gateway, worker) keeps open."))
    database_max_overflow: int = Field(default=10, ge=0, description=(
        "PostgreSQL: connections each process may open beyond the pool under load."))
    database_pool_timeout_secs: float = Field(default=30, gt=0, description=(
        "PostgreSQL: how long a request or activity waits for a free pooled connection before it fails as "
        "unavailable (503, or a retry)."))
    database_statement_timeout_secs: float = Field(default=0, ge=0, description=(
        "PostgreSQL: `statement_timeout` of Relay's sessions; 0: none (the server's own setting)."))
    # The recovery gate's policy (``core.gate``): the breaker trips when at least this share of an app's executors,
    # and at least this many, went down (DEAD, or DISCONNECTED on their way to it) within the window; while it is
    # tripped, and for the backlog a pause leaves, one recovery starts per pace; a recovery held by a pause asks
    # again at least every recheck, so a pause lifted early lets it go soon after.
    recovery_storm_share: float = Field(default=0.5, gt=0, le=1, description=(
        "The recovery-storm breaker trips when at least this share of an app's executors went down (DEAD, or "
        "DISCONNECTED on their way to it) within the window."))
    recovery_storm_min_executors: int = Field(default=3, ge=1, description="…and at least this many of them.")
    recovery_storm_window_secs: float = Field(default=60, gt=0, description=(
        "The window the breaker counts an app's executors going down in."))
    recovery_pace_secs: float = Field(default=5, gt=0, description=(
        "While the breaker is tripped, and for the backlog a pause leaves, one recovery starts per pace."))
    recovery_pause_recheck_secs: float = Field(default=15, gt=0, description=(
        "A recovery held by a pause asks again at least this often, so a pause lifted early lets it go soon after."))
    # The admin CLI's key for the REST API (its --api-key wins).
    api_key: SecretStr | None = Field(default=None, description=(
        "The admin CLI's key for the REST API (its `--api-key` wins). Never logged."))
    api_key_file: Path | None = Field(default=None, description=(
        "Read `RELAY_API_KEY` from this file instead, one trailing newline stripped; setting both is an error at "
        "start."))
    alert_webhook_secret_file: Path | None = Field(default=None, description=(
        "Read `RELAY_ALERT_WEBHOOK_SECRET` from this file instead, one trailing newline stripped; setting both is "
        "an error at start."))
    # Whether a process that opens the store migrates it to this code's schema first (``core.migrations``). False in
    # production, where `relay migrate` is a release step: processes then only check the revision and run no DDL,
    # so their database role needs no CREATE rights.
    migrate_on_start: bool = Field(default=True, description=(
        "Whether a process that opens the database migrates it first. `false` (production, where `relay migrate` is"
        " a release step): it only checks the schema revision and runs no DDL, so its role needs no CREATE rights."))
    # Audit rows older than this are deleted by the retention round (upstream Conductor allows 7 to 3,650 days).
    audit_retention_days: int = Field(default=90, ge=7, le=3650, description=(
        "Audit rows older than this are deleted by the retention round (upstream Conductor allows 7 to 3,650 days)."))
    # Temporal: where it is and which namespace, when set, win over the SDK's own TEMPORAL_* variables and
    # profiles (``core.temporal.temporal_connection``), which carry the rest (TLS, API key). `relay dev` runs its
    # embedded server unless RELAY_TEMPORAL_ADDRESS is set: a TEMPORAL_ADDRESS left in a shell never redirects it.
    temporal_address: str | None = Field(default=None, description=(
        "An external Temporal frontend, `host:port`; wins over `TEMPORAL_ADDRESS`. Unset: `relay dev` runs its "
        "embedded dev server; `relay gateway` and `relay worker` use `TEMPORAL_ADDRESS`, else "
        "`127.0.0.1:RELAY_TEMPORAL_PORT`."))
    temporal_port: int = Field(default=7233, ge=1, le=65535, description=(
        "Port of the embedded Temporal dev server (`relay dev`)."))
    temporal_ui_port: int = Field(default=8233, ge=1, le=65535, description=(
        "Port of the embedded Temporal dev server's UI (`relay dev`)."))
    # Where operators open the Temporal UI: the console links each recovery to its lifecycle workflow there. Unset,
    # `relay dev`'s embedded UI (http://127.0.0.1:RELAY_TEMPORAL_UI_PORT), and no link with an external Temporal.
    temporal_ui_url: str | None = Field(default=None, description=(
        "The Temporal UI's address, for the console's links to lifecycle workflows. Unset: the embedded server's UI"
        " under `relay dev`, no link with an external Temporal."))
    temporal_namespace: str | None = Field(default=None, description=(
        "Temporal namespace; wins over `TEMPORAL_NAMESPACE`. Unset: `TEMPORAL_NAMESPACE`, else `default`."))
    # How long a starting process keeps trying to reach an unreachable Temporal before it exits (a refused TLS
    # handshake or a missing namespace ends it at once: waiting would not change them).
    temporal_connect_timeout_secs: float = Field(default=60, gt=0, description=(
        "How long a starting process retries an unreachable Temporal before it exits (a refused TLS handshake or a "
        "missing namespace ends it at once)."))
    executor_ping_wait_secs: float = Field(default=25, gt=0, description=(
        "An executor silent this long (no frame of any kind) is disconnected."))
    server_ping_interval_secs: float = Field(default=20, gt=0, description=(
        "The gateway pings every executor this often."))
    retention_interval_secs: float = Field(default=300, gt=0, description="Time between retention rounds.")
    # Rows per delete batch sent in ``retention``; the SDKs' own defaults differ (10,000 in 2.x, 50,000 in 3.x).
    retention_gc_batch_size: int = Field(default=10_000, ge=1, description=(
        "`gc_batch_size` sent to executors in `retention`: rows per delete batch (the SDKs' own defaults differ: "
        "10,000 in 2.x, 50,000 in 3.x)."))
    handshake_timeout_secs: float = Field(default=10, gt=0, description=(
        "Time an executor has to answer `executor_info`."))
    # How long a workflow task may wait on a worker's own (sticky) queue before any worker may take it
    # (``DEFAULT_WORKER_STICKY_TIMEOUT`` says what it trades).
    worker_sticky_timeout_secs: float = Field(
        default=units.timedelta_to_seconds(DEFAULT_WORKER_STICKY_TIMEOUT), gt=0,
        description=(
        "How long a workflow task waits on the worker that cached its workflow before any worker may take it: after "
        "a worker is SIGKILLed, how late the timers and signals of the workflows it held can be. Lower bounds a "
        "crash's cost at a price under bursts (see Scaling)."))
    # A gateway process silent this long is declared gone; the executors it held are disconnected then.
    gateway_heartbeat_timeout_secs: float = Field(default=10, gt=0, description=(
        "A gateway process silent this long is probed; one that does not pick the probe up within as long again, or"
        " does not answer it within as long after that, is gone: its executors are disconnected."))
    # A gateway out of contact with Temporal this long fences itself: it closes its executor sockets (they
    # reconnect to a gateway that can speak for them) and refuses upgrades until contact is back. It must be
    # shorter than the time its watch needs to declare it gone: a missed heartbeat, then an unanswered probe,
    # each RELAY_GATEWAY_HEARTBEAT_TIMEOUT_SECS; and shorter than a probe's timeout alone, the heartbeat timeout
    # (a probe picked up by a gateway that then loses contact counts as gone that long later). Unset: 80 % of it.
    gateway_fence_secs: float | None = Field(default=None, gt=0, description=(
        "A gateway out of contact with Temporal this long fences itself (closes its executor sockets with 1012, "
        "refuses upgrades with 503) until contact is back. With the contact check's own lag it must stay under the "
        "heartbeat timeout. Unset: half the heartbeat timeout."))
    # The gateway's stable identity: a gateway started under the identity of one that crashed makes that one known
    # gone at once (``core.gateways``), so nothing waits on a probe of it. Unset: this host's name, RELAY_PORT and
    # the data dir (two gateways on one host may share a data dir, never a port). Set it per replica where the host
    # name changes across restarts (a Kubernetes StatefulSet's pod name is stable); two live gateways must never
    # share one.
    gateway_id: str | None = Field(default=None, min_length=1, max_length=200, description=(
        "The gateway's stable identity: one restarted under it makes its crashed predecessor known gone at once. "
        "Unset: host name, `RELAY_PORT` and data dir. Set it where the host name changes across restarts (a "
        "StatefulSet pod name); never shared by two live gateways."))
    # On SIGTERM a gateway turns not-ready (/readyz 503, upgrades refused with 503) and keeps its executor sockets
    # this long, so the load balancer sees it and sends the reconnections elsewhere, then closes them (1012). A
    # second SIGTERM, or a SIGINT, cuts it short. The process exits within about 10 s after it: a stop must allow
    # for both (terminationGracePeriodSeconds, stop_grace_period).
    shutdown_drain_secs: float = Field(default=5, ge=0, description=(
        "On SIGTERM a gateway turns not-ready (`/readyz` 503, upgrades refused with 503) but keeps its executor "
        "sockets this long, then closes them (1012) and exits within about 10 s more; a second SIGTERM or a SIGINT "
        "cuts it short."))
    # Gateways stay balanced (``gateway.balance``): every check each reports its socket count; one holding more than
    # its share of the live gateways' sockets by more than half the tolerance (the spread, largest minus smallest,
    # within the tolerance of the even share) closes the excess with 1012, idle executors only, at most this many a
    # second and a batch only once the last one was taken in elsewhere. An executor it closed that is not back
    # (anywhere) within the handoff is disconnected then, as any closed socket: its grace starts that much later.
    gateway_rebalance: bool = Field(default=True, description=(
        "Gateways keep their share of the live gateways' executor sockets: one over it by more than the tolerance "
        "closes the excess (1012), idle executors only."))
    gateway_rebalance_tolerance: float = Field(default=0.1, gt=0, le=1, description=(
        "The spread (most minus fewest sockets) allowed, as a share of the even share."))
    gateway_rebalance_per_second: float = Field(default=5, gt=0, description=(
        "At most this many sockets closed to rebalance a second, and a batch only once the last one is back."))
    gateway_rebalance_check_secs: float = Field(default=5, gt=0, description=(
        "How often each gateway reports its socket count and compares."))
    gateway_rebalance_handoff_secs: float = Field(default=10, gt=0, description=(
        "An executor closed to rebalance is disconnected only if it is not back on a gateway within this long."))
    # Executor-facing hardening (frames over the limit close with 1009; compression off: memory per idle
    # socket, and no compression oracle on a stream that carries keys in its URL).
    max_message_bytes: int = Field(default=1024 * 1024, ge=1024, description=(
        "Larger executor frames close the socket (1009)."))
    ws_permessage_deflate: bool = Field(default=False, description=(
        "WebSocket compression (off: memory per idle socket, and no compression oracle)."))
    allowed_origins: str = Field(default="", description=(
        "Comma-separated; a present `Origin` not listed is refused (executors send none)."))
    max_connections_per_key: int = Field(default=10_000, ge=1, description=(
        "Live executor sockets per API key (429 beyond)."))
    handshakes_per_key_per_second: float = Field(default=100, gt=0, description=(
        "Handshake rate per API key (429 beyond)."))
    # HTTP-level hardening: a connection must send a complete request head this soon (partial heads
    # were held forever), and a REST request body may be at most this large (413 beyond; a 10 MB body was parsed).
    header_timeout_secs: float = Field(default=5, gt=0, description=(
        "A connection that has not sent a complete request head this soon is closed."))
    max_request_body_bytes: int = Field(default=1024 * 1024, ge=1024, description=(
        "Larger REST request bodies get 413 problem+json, streamed ones too."))
    recovery_timeout_secs: float = Field(default=60, gt=0, description="Time a peer has to answer `recovery`.")
    # Workflow management (an operator's request carried to an executor): how long one executor has to answer;
    # how large its reply may be (replies to Relay's own requests only: anything else stays under
    # RELAY_MAX_MESSAGE_BYTES); how many workflows one bulk operation may name or match; and how many bulk
    # operations an app takes per minute.
    management_timeout_secs: float = Field(default=30, gt=0, description=(
        "Time one executor has to answer an operator's request (workflow management), its wait for its turn "
        "included; then the next executor is asked (502 when none answers)."))
    max_reply_bytes: int = Field(default=64 * 1024 * 1024, ge=1024, description=(
        "The frame limit of an executor socket while an operator's reply is due on it (otherwise "
        "`RELAY_MAX_MESSAGE_BYTES` holds)."))
    bulk_max_workflows: int = Field(default=1000, ge=1, description=(
        "Workflows one bulk operation may name or match (422 beyond)."))
    bulk_operations_per_minute: int = Field(default=30, ge=1, description=(
        "Bulk operations an app takes per minute (429 beyond)."))
    # Prometheus metrics on a listener of their own (``core.metrics``): no key, every org's numbers, so loopback by
    # default. Each process serves its own: `relay gateway` and `relay worker` on one host need different ports.
    # 0: no listener.
    metrics_host: str = Field(default="127.0.0.1", description=(
        "Address of the Prometheus metrics listener (no key, every org's numbers: loopback by default)."))
    metrics_port: int = Field(default=9464, ge=0, le=65535, description=(
        "Port of each process's Prometheus metrics listener (`relay gateway` and `relay worker` on one host need "
        "different ports); 0: no listener."))
    # The Temporal SDK's own metrics (its Rust core's Prometheus exporter, on RELAY_METRICS_HOST). Unset: the
    # metrics port + 1 (none when RELAY_METRICS_PORT is 0); 0: none.
    temporal_metrics_port: int | None = Field(default=None, ge=0, le=65535, description=(
        "Port of the Temporal SDK's own Prometheus exporter, on `RELAY_METRICS_HOST`. Unset: the metrics port + 1 "
        "(none when `RELAY_METRICS_PORT` is 0); 0: none."))
    # Alerts (``workflows.alerts``): how often the rules are evaluated, and the webhook every alert is POSTed to
    # (none when unset), signed with HMAC-SHA256 when the secret is set. The secret is a SecretStr: its repr and
    # any log of the settings show "**********".
    alert_interval_secs: float = Field(default=60, gt=0, description="How often alert rules are evaluated.")
    # Relay's own alerts (RecoveryBlocked, ...) go out as they happen, at most one per app and kind this often
    # (``core.own_alerts``: one held back goes out when the interval is over); 0: no minimum.
    own_alert_min_interval_secs: float = Field(default=60, ge=0, description=(
        "Relay's own alerts (RecoveryBlocked, ...) go out as they happen, at most one per app and kind this often "
        "(one held back goes out when the interval is over); 0: no minimum."))
    alert_webhook_url: str | None = Field(default=None, description=(
        "The webhook every alert is POSTed to; unset: none."))
    alert_webhook_secret: SecretStr | None = Field(default=None, description=(
        "Alerts are signed with HMAC-SHA256 under this secret when it is set. Never logged."))
    # The orphan sweep (``workflows.orphans``): how often it looks for PENDING workflows of executor ids Relay has
    # no record of (0: never; the schedule is removed), and how old their oldest PENDING workflow must be.
    orphan_sweep_interval_secs: float = Field(default=600, ge=0, description=(
        "How often the orphan sweep looks for PENDING workflows of executor ids Relay has no record of; 0: never "
        "(its schedule is removed)."))
    orphan_min_age_secs: float = Field(default=3600, gt=0, description=(
        "How old an unknown executor id's oldest PENDING workflow must be before the sweep reports it."))
    # The reconciliation (``workflows.reconcile``): how often it looks for registry rows whose lifecycle workflow is
    # not running (0: never, but for the round every worker starts at start-up; the schedule is removed).
    reconcile_interval_secs: float = Field(default=60, ge=0, description=(
        "How often the reconciliation looks for registry rows whose lifecycle workflow is not running; 0: never, "
        "but for the round every worker starts at start-up (its schedule is removed)."))
    # Autoscaling (``api.autoscaling``): how often each gateway computes, for every app with an autoscaling policy
    # and an executor on it, the executors each version needs (``relay_app_desired_executors``); 0: never
    # (getAutoscale still answers, computed when asked).
    autoscale_interval_secs: float = Field(default=15, ge=0, description=(
        "How often each gateway recomputes `relay_app_desired_executors` for the apps with an autoscaling policy "
        "and an executor on it; 0: never (getAutoscale still answers, computed when asked)."))

    @field_validator("data_dir")
    @classmethod
    def _absolute(cls, value: Path) -> Path:
        return value.expanduser().resolve()

    @property
    def origins(self) -> frozenset[str]:
        return frozenset(o.strip() for o in self.allowed_origins.split(",") if o.strip())

    @property
    def database_pool(self) -> DatabasePool:
        return DatabasePool(pool_size=self.database_pool_size, max_overflow=self.database_max_overflow,
                            pool_timeout_secs=self.database_pool_timeout_secs,
                            statement_timeout_secs=self.database_statement_timeout_secs)

    @property
    def recovery_policy(self) -> GatePolicy:
        return GatePolicy(storm_share=self.recovery_storm_share, storm_min=self.recovery_storm_min_executors,
                          window=units.seconds_to_timedelta(self.recovery_storm_window_secs),
                          pace=units.seconds_to_timedelta(self.recovery_pace_secs),
                          pause_recheck=units.seconds_to_timedelta(self.recovery_pause_recheck_secs))

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{self.data_dir / 'relay.db'}"

    @property
    def gateway_identity(self) -> str:
        if self.gateway_id:
            return self.gateway_id
        # Port 0 (a port picked at start): nothing ties a restart to its predecessor, so no successor is named.
        return f"{socket.gethostname()}:{self.port or uuid.uuid4()}:{self.data_dir}"

    @property
    def temporal_target(self) -> str:
        return self.temporal_address or f"127.0.0.1:{self.temporal_port}"

    @property
    def embedded_temporal(self) -> bool:
        """`relay dev` starts its own Temporal: no RELAY_TEMPORAL_ADDRESS (whatever TEMPORAL_ADDRESS says)."""
        return self.temporal_address is None

    @property
    def temporal_connect_timeout(self) -> timedelta:
        return units.seconds_to_timedelta(self.temporal_connect_timeout_secs)

    @property
    def temporal_metrics_address(self) -> str | None:
        """``host:port`` of the Temporal SDK's Prometheus exporter, or None when it is off."""
        port = self.temporal_metrics_port
        if port is None:
            port = self.metrics_port + 1 if self.metrics_port else 0
        return f"{self.metrics_host}:{port}" if port else None

    @property
    def worker_sticky_timeout(self) -> timedelta:
        return units.seconds_to_timedelta(self.worker_sticky_timeout_secs)

    @property
    def executor_ping_wait(self) -> timedelta:
        return units.seconds_to_timedelta(self.executor_ping_wait_secs)

    @property
    def server_ping_interval(self) -> timedelta:
        return units.seconds_to_timedelta(self.server_ping_interval_secs)

    @property
    def retention_interval(self) -> timedelta:
        return units.seconds_to_timedelta(self.retention_interval_secs)

    @property
    def management_timeout(self) -> timedelta:
        return units.seconds_to_timedelta(self.management_timeout_secs)

    @model_validator(mode="after")
    def _secrets_from_files(self) -> Settings:
        """Each ``*_FILE`` setting read into its setting, one trailing newline stripped (``echo`` and most editors
        end a file with one); a setting given both ways is an error, rather than one silently winning."""
        if self.database_url_file is not None:
            self.database_url = _from_file("RELAY_DATABASE_URL", self.database_url, self.database_url_file)
        if self.api_key_file is not None:
            key = self.api_key.get_secret_value() if self.api_key is not None else None
            self.api_key = SecretStr(_from_file("RELAY_API_KEY", key, self.api_key_file))
        if self.alert_webhook_secret_file is not None:
            secret = self.alert_webhook_secret.get_secret_value() if self.alert_webhook_secret is not None else None
            self.alert_webhook_secret = SecretStr(_from_file("RELAY_ALERT_WEBHOOK_SECRET", secret,
                                                             self.alert_webhook_secret_file))
        return self

    @property
    def audit_retention(self) -> timedelta:
        return timedelta(days=self.audit_retention_days)

    @model_validator(mode="after")
    def _fence_before_gone(self) -> Settings:
        if self.gateway_fenced_by >= self.gateway_heartbeat_timeout:
            raise ValueError(
                "RELAY_GATEWAY_FENCE_SECS plus the contact check's own lag (one check interval and one check's "
                f"timeout: {(self.gateway_fenced_by - self.gateway_fence).total_seconds():g} s) must be shorter "
                "than RELAY_GATEWAY_HEARTBEAT_TIMEOUT_SECS: a gateway cut off from Temporal must have closed its "
                "sockets before it can be declared gone")
        return self

    @property
    def gateway_contact_check(self) -> timedelta:
        """How often a gateway checks Temporal, and how long one check may take (at least half a second: a
        healthy server answers in milliseconds, a frozen one never)."""
        return min(timedelta(seconds=1), self.gateway_fence / 3)

    @property
    def gateway_contact_check_timeout(self) -> timedelta:
        return min(max(self.gateway_contact_check, timedelta(milliseconds=500)), self.gateway_fence / 2)

    @property
    def gateway_fenced_by(self) -> timedelta:
        """How long after its last good check a cut-off gateway has closed its sockets, at the latest: the fence
        time, then the next check to notice it (one interval and one check's timeout)."""
        return self.gateway_fence + self.gateway_contact_check + self.gateway_contact_check_timeout

    @property
    def gateway_fence(self) -> timedelta:
        return units.seconds_to_timedelta(self.gateway_fence_secs or 0.5 * self.gateway_heartbeat_timeout_secs)

    @property
    def gateway_heartbeat_timeout(self) -> timedelta:
        return units.seconds_to_timedelta(self.gateway_heartbeat_timeout_secs)

    @property
    def shutdown_drain(self) -> timedelta:
        return units.seconds_to_timedelta(self.shutdown_drain_secs)

    @property
    def gateway_rebalance_check(self) -> timedelta:
        return units.seconds_to_timedelta(self.gateway_rebalance_check_secs)

    @property
    def gateway_rebalance_handoff(self) -> timedelta:
        return units.seconds_to_timedelta(self.gateway_rebalance_handoff_secs)

    @property
    def header_timeout(self) -> timedelta:
        return units.seconds_to_timedelta(self.header_timeout_secs)

    @property
    def handshake_timeout(self) -> timedelta:
        return units.seconds_to_timedelta(self.handshake_timeout_secs)

    @property
    def recovery_timeout(self) -> timedelta:
        return units.seconds_to_timedelta(self.recovery_timeout_secs)

    @property
    def alert_interval(self) -> timedelta:
        return units.seconds_to_timedelta(self.alert_interval_secs)

    @property
    def own_alert_min_interval(self) -> timedelta:
        return units.seconds_to_timedelta(self.own_alert_min_interval_secs)

    @property
    def orphan_sweep_interval(self) -> timedelta:
        return units.seconds_to_timedelta(self.orphan_sweep_interval_secs)

    @property
    def orphan_min_age(self) -> timedelta:
        return units.seconds_to_timedelta(self.orphan_min_age_secs)

    @property
    def reconcile_interval(self) -> timedelta:
        return units.seconds_to_timedelta(self.reconcile_interval_secs)

    @property
    def autoscale_interval(self) -> timedelta:
        return units.seconds_to_timedelta(self.autoscale_interval_secs)


def _from_file(name: str, value: str | None, path: Path) -> str:
    """The secret ``name`` as read from ``path`` (``name``_FILE); ``value`` is ``name`` itself, which must be unset.
    Errors name the variables and the path, never what the file holds."""
    if value is not None:
        raise ValueError(f"{name} and {name}_FILE are both set: set only one")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ValueError(f"{name}_FILE: cannot read {path}: {err.strerror}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{name}_FILE: {path} is not UTF-8 text") from None
    text = text.removesuffix("\n").removesuffix("\r")
    if not text:
        raise ValueError(f"{name}_FILE: {path} is empty")
    return text
