"""Relay's Prometheus metrics: every metric defined once, and the listener that serves them.

Metrics live in ``REGISTRY``, a registry of Relay's own (not prometheus-client's global default, which a library
or a second import could also register into), with the process, platform and garbage-collector collectors. Each
counter or histogram is observed where its event happens, in the process where it happens:

- the worker (``activities``): ``relay_recoveries_total{org,app,outcome}`` (``succeeded`` and ``failed`` per
  recovery attempt, ``blocked`` once per stretch without a peer of the right version),
  ``relay_recovery_duration_seconds{org,app}`` (DEAD recorded to recovery confirmed),
  ``relay_dead_lateness_seconds`` (DEAD recorded minus the end of the grace: the disconnect's record plus the
  app's grace, or the later end of an extended grace), ``relay_signal_delay_seconds`` (a handshake done or
  a socket closed on the gateway to HEALTHY or DISCONNECTED in the registry: two processes' wall clocks, so on two
  hosts their skew counts too),
  ``relay_executor_transitions_total{org,app,status}``, ``relay_retention_rounds_total{org,app,outcome}``
  (``succeeded`` and ``failed`` per attempt, ``skipped``), ``relay_audit_rows_pruned_total`` (audit rows past
  RELAY_AUDIT_RETENTION_DAYS deleted, counted per batch committed);
- the gateway (``gateway``): ``relay_handshake_seconds`` (upgrade request to ``executor_info`` reply),
  ``relay_refusals_total{reason}`` (upgrades refused, handshakes failed), ``relay_gateway_connections``,
  ``relay_management_requests_total{operation,status}`` and ``relay_management_request_seconds{operation}``.

``relay_app_desired_executors{org,app,version}`` (``DESIRED_EXECUTORS``) is what ``api.autoscaling`` last computed for
each app with an autoscaling policy and an executor on this gateway (getAutoscale's ``desiredExecutors``), kept in
memory between its rounds: a scrape never asks an executor. With several gateways, aggregate it with ``max``.

``relay_executors{org,app,status}`` is read from the registry database at scrape time (``ExecutorsCollector``):
every status of every registered app, zero included. The worker process exports it (``relay dev`` too): with
several workers, aggregate it with ``max``, not ``sum``.

Labels are bounded: an org, an app, a status or a reason out of a fixed set; never an executor id, a request id
or a key. No ``<name>_created`` series (prometheus-client's creation timestamp of each counter, histogram and label
set): nothing reads them, and they would add a series per label set. Counters are incremented once per event: the
activities count a row only when their attempt wrote it (see ``activities.registry``).

``serving`` starts the listener, on ``RELAY_METRICS_HOST:RELAY_METRICS_PORT``: every org's numbers, no key. A port
that cannot be bound is logged and skipped: recovery never stops because of metrics. Given a ``Readiness``, it
serves ``/healthz`` and ``/readyz`` too: the worker's probes, as it has no other HTTP port. The Temporal SDK's
metrics come from its own exporter (``core.temporal.install_sdk_runtime``), on a port of their own
(RELAY_TEMPORAL_METRICS_PORT).

``scoped_exposition`` is what the REST API's bearer-authenticated ``GET /metrics`` serves: the same metric names,
with every sample labelled for another org, or for an app the key is not allowed for, left out.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Histogram,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
    make_wsgi_app,
)
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine, func
from sqlalchemy.exc import SQLAlchemyError
from sqlmodel import select

from core.models import Application, Executor
from core.problem import PROBLEM_JSON, problem_body
from core.types import ExecutorStatus

log = logging.getLogger("relay.metrics")

disable_created_metrics()  # type: ignore[no-untyped-call]  # prometheus-client's switch for the whole process: no ``_created`` series (see above)
REGISTRY = CollectorRegistry(auto_describe=True)
ProcessCollector(registry=REGISTRY)
PlatformCollector(registry=REGISTRY)
GCCollector(registry=REGISTRY)

# Seconds. Recoveries take a peer's answer (the SDK recovers, then is asked again); lateness and delays are
# normally milliseconds, and seconds when Temporal or the database was away.
_FAST = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_SLOW = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)

@dataclass(frozen=True)
class MetricDoc:
    """One of Relay's metrics as the reference lists it (docs/reference.py): its name as exposed (a counter's with
    ``_total``), kind, labels and help."""

    name: str
    kind: str
    labels: tuple[str, ...]
    help: str


# Every metric of ``REGISTRY``, as it was defined (below, and the two collectors').
CATALOGUE: list[MetricDoc] = []


def _counter(name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
    CATALOGUE.append(MetricDoc(f"{name}_total", "counter", tuple(labels), documentation))
    return Counter(name, documentation, labels, registry=REGISTRY)


def _gauge(name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
    CATALOGUE.append(MetricDoc(name, "gauge", tuple(labels), documentation))
    return Gauge(name, documentation, labels, registry=REGISTRY)


def _histogram(name: str, documentation: str, labels: Sequence[str] = (), *, buckets: Sequence[float]) -> Histogram:
    CATALOGUE.append(MetricDoc(name, "histogram", tuple(labels), documentation))
    return Histogram(name, documentation, labels, buckets=buckets, registry=REGISTRY)


RECOVERIES = _counter("relay_recoveries", "Recovery outcomes: succeeded and failed per attempt, blocked once per "
                      "stretch with no HEALTHY peer of the dead executor's version.", ["org", "app", "outcome"])
RECOVERY_DURATION = _histogram("relay_recovery_duration_seconds", "From DEAD recorded to recovery confirmed.",
                               ["org", "app"], buckets=_SLOW)
DEAD_LATENESS = _histogram("relay_dead_lateness_seconds", "DEAD recorded minus the end of the grace "
                           "(DISCONNECTED recorded + the app's executorTimeoutSecs, or an extended grace's end).",
                           buckets=_FAST)
SIGNAL_DELAY = _histogram("relay_signal_delay_seconds", "From a socket event on an executor's gateway (handshake "
                          "done, socket closed) to its lifecycle workflow recording it (HEALTHY written in the "
                          "registry; DISCONNECTED, which the gateway writes at the close, taken in).",
                          buckets=_FAST)
MOVES = _counter("relay_gateway_moves", "A HEALTHY executor's new socket, written to the registry by its gateway as "
                 "its connected landed, by outcome: written; already (its workflow took the signal in first and wrote "
                 "it); lost (another write in between, or this gateway known gone: its workflow writes it); unread "
                 "(the row not read in time: its workflow writes it).",
                 ["outcome"])
CONNECTED = _histogram("relay_gateway_connected_seconds", "From an executor's handshake done on this gateway to its "
                       "connected landed in Temporal (stage landed) and, for a HEALTHY executor's new socket, to its "
                       "move written to the registry by this gateway (stage moved).", ["stage"],
                       buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60))
TRANSITIONS = _counter("relay_executor_transitions", "Executor statuses written to the registry.",
                       ["org", "app", "status"])
HANDSHAKE = _histogram("relay_handshake_seconds", "From an executor's upgrade request to its executor_info reply.",
                       buckets=_FAST)
REFUSALS = _counter("relay_refusals", "Executor upgrades refused and handshakes failed, by reason.", ["reason"])
CONNECTIONS = _gauge("relay_gateway_connections", "Executor sockets held by this gateway process.")
REBALANCE_SHED = _counter("relay_gateway_rebalance_shed", "Executor sockets this gateway closed (1012) to even out "
                          "the live gateways' shares; they reconnect through the load balancer.")
REBALANCE_HANDOFFS = _counter("relay_gateway_rebalance_handoffs", "Executors closed to rebalance, by outcome: moved "
                              "(on another gateway within the handoff: no disconnect recorded); returned (sent back to "
                              "this one by the load balancer: the shedding pauses); disconnected (not back within it, "
                              "or this gateway stopped: disconnected as any closed socket).",
                              ["outcome"])
FAIR_SHARE = _gauge("relay_gateway_fair_share", "The live gateways' executor sockets divided by their number, as this "
                    "gateway last counted them (0 when it is alone or not taking sockets).")
MANAGEMENT_REQUESTS = _counter("relay_management_requests", "Workflow management requests to executors, by "
                               "operation and result.", ["operation", "status"])
MANAGEMENT_SECONDS = _histogram("relay_management_request_seconds", "Workflow management requests' duration.",
                                ["operation"], buckets=_FAST)
RETENTION_ROUNDS = _counter("relay_retention_rounds", "Retention rounds: succeeded and failed per attempt, "
                            "skipped.", ["org", "app", "outcome"])

AUDIT_ROWS_PRUNED = _counter("relay_audit_rows_pruned", "Audit rows older than the audit retention, deleted by the "
                             "retention rounds.")

ORPHANS_FOUND = _counter("relay_orphans_found", "Executor ids with old PENDING workflows and no registry row, found "
                         "by the orphan sweep (each found once per sweep).", ["org", "app"])

EXECUTORS_RECONCILED = _counter(
    "relay_executors_reconciled", "Registry rows whose lifecycle workflow was not running (Temporal's state lost, "
     "or the workflow terminated by hand) and was started again from the row, by the row's status.",
     ["org", "app", "status"])


class DesiredExecutors(Collector):
    """``relay_app_desired_executors{org,app,version}``: the executors each version of an app needs for its
    autoscaling policy's queue, as last computed (``core.autoscale``); put and removed per app, read at each scrape
    (from another thread: hence the lock). A computation that began before the app's series were removed (its
    policy deleted meanwhile) does not bring them back: ``put`` with the ``mark`` taken when it began."""

    NAME = "relay_app_desired_executors"
    LABELS = ("org", "app", "version")
    HELP = ("Executors each application version needs for its app's autoscaling policy queue (getAutoscale's "
            "desiredExecutors), as this gateway last computed it; for an HPA or KEDA to scale executors on.")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._apps: dict[tuple[str, str], dict[str, int]] = {}
        self._removals = 0
        self._removed: dict[tuple[str, str], int] = {}  # the app's last removal, as ``_removals`` counted it

    def mark(self) -> int:
        with self._lock:
            return self._removals

    def put(self, org: str, app: str, desired: dict[str, int], *, since: int | None = None) -> bool:
        """The app's series become ``desired`` (version -> executors): a version left out is removed. With
        ``since`` (a ``mark``), nothing changes if the app was removed after it (False)."""
        with self._lock:
            if since is not None and self._removed.get((org, app), -1) > since:
                return False
            self._apps[(org, app)] = dict(desired)
            return True

    def remove(self, org: str, app: str) -> None:
        with self._lock:
            self._apps.pop((org, app), None)
            self._removals += 1
            self._removed[(org, app)] = self._removals

    def apps(self) -> set[tuple[str, str]]:
        with self._lock:
            return set(self._apps)

    def describe(self) -> Iterable[Metric]:
        return [GaugeMetricFamily(self.NAME, self.HELP, labels=self.LABELS)]

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(self.NAME, self.HELP, labels=self.LABELS)
        with self._lock:
            for (org, app), versions in sorted(self._apps.items()):
                for version, n in sorted(versions.items()):
                    family.add_metric([org, app, version], n)
        return [family]


DESIRED_EXECUTORS = DesiredExecutors()
REGISTRY.register(DESIRED_EXECUTORS)
CATALOGUE.append(MetricDoc(DesiredExecutors.NAME, "gauge", DesiredExecutors.LABELS, DesiredExecutors.HELP))

EXECUTORS = "relay_executors"
EXECUTORS_HELP = "Executors in the registry, by status: every status of every registered app, zero included."
EXECUTORS_LABELS = ("org", "app", "status")
CATALOGUE.append(MetricDoc(EXECUTORS, "gauge", EXECUTORS_LABELS, EXECUTORS_HELP))  # ``ExecutorsCollector``
REFUSAL_REASONS = {401: "unauthorized", 403: "forbidden", 404: "not_found", 429: "rate_limited",
                   503: "unavailable"}


def refusal_reason(status: int) -> str:
    """A bounded ``reason`` label for a refusal with this HTTP status."""
    return REFUSAL_REASONS.get(status, "other")


class ExecutorsCollector(Collector):
    """``relay_executors{org,app,status}``, counted in the registry database at each scrape (of one org, or all)."""

    def __init__(self, engine: Engine, org: str | None = None) -> None:
        self._engine, self._org = engine, org

    def describe(self) -> Iterable[Metric]:
        return [GaugeMetricFamily(EXECUTORS, EXECUTORS_HELP, labels=EXECUTORS_LABELS)]

    def collect(self) -> Iterable[Metric]:
        try:
            counts = executor_counts(self._engine, self._org)
        except SQLAlchemyError as err:  # the database is away: no number rather than a wrong one
            log.warning("relay_executors not collected: the database is unavailable: %s", type(err).__name__)
            return []
        family = GaugeMetricFamily(EXECUTORS, EXECUTORS_HELP, labels=EXECUTORS_LABELS)
        for (org, app, status), n in sorted(counts.items()):
            family.add_metric([org, app, status], n)
        return [family]


def executor_counts(engine: Engine, org: str | None = None) -> dict[tuple[str, str, str], int]:
    """``(org, app, status) -> count`` for every status of every registered app (zeros included), and of any app
    that still has rows after it was deleted; of one org, or of all."""
    apps_query = select(Application.org, Application.name)
    rows_query = select(Executor.org, Executor.app, Executor.status, func.count())
    if org is not None:
        apps_query = apps_query.where(Application.org == org)
        rows_query = rows_query.where(Executor.org == org)
    with engine.connect() as c:
        apps = c.execute(apps_query).all()
        rows = c.execute(rows_query.group_by(Executor.org, Executor.app, Executor.status)).all()
    counts = {(org, app, str(status)): 0 for org, app in apps for status in ExecutorStatus}
    for org, app, status, n in rows:
        counts[(org, app, str(status))] = n
    return counts


class _Forward(Collector):
    """``REGISTRY``'s metrics, inside a listener's own registry (which adds the registry collector)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        return self._registry.collect()


def registry_with(engine: Engine | None, *, org: str | None = None) -> CollectorRegistry:
    """What a listener serves: ``REGISTRY``, plus ``relay_executors`` from ``engine`` when given (of ``org``, or of
    every org)."""
    served = CollectorRegistry(auto_describe=False)
    served.register(_Forward(REGISTRY))
    if engine is not None:
        served.register(ExecutorsCollector(engine, org))
    return served


class _Scoped(Collector):
    """Another registry's metrics, each family kept (so its name is served) with only the samples a key may see:
    none labelled for another org, or for an app it is not allowed for. Samples with no org label (the process's
    own: sockets, handshakes, CPU) are kept."""

    def __init__(self, registry: CollectorRegistry, *, org: str, allows: Callable[[str], bool]) -> None:
        self._registry, self._org, self._allows = registry, org, allows

    def describe(self) -> Iterable[Metric]:
        return []

    def collect(self) -> Iterable[Metric]:
        for family in self._registry.collect():
            scoped = Metric(family.name, family.documentation, family.type, family.unit)
            scoped.samples = [s for s in family.samples if self._visible(s.labels)]
            yield scoped

    def _visible(self, labels: dict[str, str]) -> bool:
        return labels.get("org", self._org) == self._org and ("app" not in labels or self._allows(labels["app"]))


def scoped_exposition(engine: Engine, *, org: str, allows: Callable[[str], bool]) -> bytes:
    """Prometheus text for one key: every metric name a listener with ``relay_executors`` serves, with the
    samples of ``org`` and the apps ``allows`` lets through (``Principal.allows``), and the process's own."""
    served = CollectorRegistry(auto_describe=False)
    served.register(_Scoped(registry_with(engine, org=org), org=org, allows=allows))
    return generate_latest(served)


@dataclass(frozen=True)
class Listener:
    host: str
    port: int


# What ``/readyz`` on the listener answers: None when ready, else why not (the detail of a 503 problem). Called on
# the listener's thread, once per probe.
Readiness = Callable[[], str | None]
OK_BODY = b'{"status":"ok"}'  # the REST app's ``Health``


def with_probes(app: WSGIApplication, readiness: Readiness) -> WSGIApplication:
    """``app`` with ``/healthz`` (200 while the process serves) and ``/readyz`` (200, or 503 with the reason)."""

    def probes(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path not in ("/healthz", "/readyz"):
            return app(environ, start_response)
        reason = readiness() if path == "/readyz" else None
        if reason is None:
            status, content_type, body = "200 OK", "application/json", OK_BODY
        else:
            status, content_type = "503 Service Unavailable", PROBLEM_JSON
            body = problem_body(503, "Service Unavailable", reason)
        start_response(status, [("Content-Type", content_type), ("Content-Length", str(len(body)))])
        return [body]

    return probes


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # a scrape or a probe every few seconds: no line each
        pass


def _start(host: str, port: int, app: WSGIApplication) -> tuple[WSGIServer, threading.Thread]:
    """prometheus-client's ``start_http_server``, serving ``app``: a thread per request, on the address family
    ``host`` resolves to."""
    family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]

    class Server(ThreadingWSGIServer):
        address_family = family

    server = make_server(str(address[0]), port, app, Server, handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, name="relay-metrics", daemon=True)
    thread.start()
    return server, thread


@contextlib.contextmanager
def serving(host: str, port: int, *, engine: Engine | None = None,
            readiness: Readiness | None = None) -> Iterator[Listener | None]:
    """Serve ``GET /metrics`` on ``host:port`` (a thread) for the block; ``relay_executors`` from ``engine``; with
    ``readiness``, ``/healthz`` and ``/readyz`` too (``with_probes``).

    Yields None (and serves nothing) when ``port`` is 0 or cannot be bound: a warning, never a failure.
    """
    if not port:
        yield None
        return
    app = make_wsgi_app(registry_with(engine))
    try:
        server, thread = _start(host, port, app if readiness is None else with_probes(app, readiness))
    except OSError as err:
        log.warning("metrics listener not started on %s:%d: %s; Relay runs on without it", host, port, err)
        yield None
        return
    log.info("metrics on http://%s:%d/metrics", host, server.server_port)
    try:
        yield Listener(host, server.server_port)
    finally:
        _stop(server, thread)


def _stop(server: WSGIServer, thread: threading.Thread) -> None:
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def exported_names(registry: CollectorRegistry = REGISTRY) -> set[str]:
    """Every sample name a scrape of ``registry`` (plus ``relay_executors``) can show, whether or not it has been
    observed yet: counters with ``_total``, histograms with ``_bucket``, ``_sum`` and ``_count``."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count", ""),
                "gauge": ("",), "info": ("_info",)}
    names = {EXECUTORS}
    for family in registry.collect():
        names.update(family.name + s for s in suffixes.get(family.type, ("",)))
        names.update(sample.name for sample in family.samples)
    return names
