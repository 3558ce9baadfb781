"""Relay's metrics (``core.metrics``): the registry collector (every status, zero included), labels that never
name an executor, counters that count an event once when its activity is retried, the listener, and the Grafana
dashboard, whose every query names a metric Relay exports."""

from __future__ import annotations

import dataclasses
import json
import logging
import re
import socket
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from temporalio.testing import ActivityEnvironment

from activities.registry import RegistryActivities
from activities.retention import RetentionActivities
from core import metrics
from core.models import make_engine
from core.settings import Settings
from core.store import Store
from tests.support import LogRecords, free_port
from workflows.contracts.common import ExecutorInfo, ExecutorStatus
from workflows.contracts.lifecycle import RecordStatusInput, WriteAuditInput
from workflows.contracts.retention import WriteRetentionAuditInput

ORG, APP = "metrics-org", "metrics-app"
SECRET_ID = "executor-id-that-must-not-be-a-label"
DASHBOARD = Path(__file__).parents[2] / "deploy" / "grafana" / "relay.json"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(make_engine(f"sqlite:///{tmp_path / 'relay.db'}"))
    yield s
    s.engine.dispose()


def _scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in registry.collect() for sample in family.samples}


def _executors(store: Store) -> dict[tuple[str, str, str], float]:
    registry = CollectorRegistry()
    registry.register(metrics.ExecutorsCollector(store.engine))
    return {(labels["org"], labels["app"], labels["status"]): value
            for (name, pairs), value in _scrape(registry).items() for labels in [dict(pairs)]}


def _record(store: Store, executor_id: str, status: ExecutorStatus, key: str, app: str = APP) -> None:
    store.record_status(org=ORG, app=app, executor_id=executor_id, status=status, operation="test", event_key=key,
                        info=ExecutorInfo(executor_id, "v1"), connection_id="c", gateway_queue="gw", details={})


# -- relay_executors -----------------------------------------------------------------------------------------------

def test_executors_has_every_status_of_every_app_zero_included(store: Store) -> None:
    store.ensure_app(ORG, APP)
    store.ensure_app(ORG, "idle-app")
    _record(store, "a", ExecutorStatus.HEALTHY, "k1")
    _record(store, "b", ExecutorStatus.HEALTHY, "k2")
    _record(store, "c", ExecutorStatus.DEAD, "k3")
    assert _executors(store) == {
        (ORG, APP, "HEALTHY"): 2, (ORG, APP, "DISCONNECTED"): 0, (ORG, APP, "DEAD"): 1,
        (ORG, "idle-app", "HEALTHY"): 0, (ORG, "idle-app", "DISCONNECTED"): 0, (ORG, "idle-app", "DEAD"): 0,
    }


def test_executor_counts_of_one_org_leave_the_others_out(store: Store) -> None:
    store.ensure_app(ORG, APP)
    store.ensure_app("other-org", APP)
    assert {org for org, _, _ in metrics.executor_counts(store.engine, ORG)} == {ORG}
    assert {org for org, _, _ in metrics.executor_counts(store.engine)} == {ORG, "other-org"}


def test_executors_is_left_out_not_wrong_when_the_database_is_away(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'relay.db'}")
    (tmp_path / "relay.db").unlink()
    (tmp_path / "relay.db").mkdir()  # the file is now a directory: every connection fails
    engine.dispose()
    assert list(metrics.ExecutorsCollector(engine).collect()) == []


# -- what the worker's activities count ------------------------------------------------------------------------------

async def _lifecycle_events(store: Store, env: ActivityEnvironment, executor_id: str) -> None:
    """One executor's whole life, written as the lifecycle workflow writes it."""
    activities = RegistryActivities(store)
    now = datetime.now(UTC)
    await env.run(activities.record_status, RecordStatusInput(
        ORG, APP, executor_id, ExecutorStatus.HEALTHY, "executor.healthy", event_key=f"{executor_id}/1",
        info=ExecutorInfo(executor_id, "v1"), connection_id="c1", gateway_queue="gw",
        connected_at=now - timedelta(milliseconds=30)))
    await env.run(activities.record_status, RecordStatusInput(
        ORG, APP, executor_id, ExecutorStatus.DISCONNECTED, "executor.disconnected", event_key=f"{executor_id}/2",
        durations={"executorTimeoutSecs": timedelta(seconds=3)}, disconnected_at=now - timedelta(milliseconds=40)))
    await env.run(activities.record_status, RecordStatusInput(
        ORG, APP, executor_id, status=ExecutorStatus.DEAD, operation="executor.dead", event_key=f"{executor_id}/3",
        grace_deadline=now - timedelta(milliseconds=200)))
    details = {"candidate": "peer", "attempt": 1, "request_id": "r-1"}
    for n, (operation, extra) in enumerate([("executor.recovery.blocked", {"reason": "no peer"}),
                                           ("executor.recovery.dispatched", {}),
                                           ("executor.recovery.failed", {"reason": "timeout"}),
                                           ("executor.recovery.succeeded", {})]):
        await env.run(activities.write_audit, WriteAuditInput(
            ORG, APP, executor_id, operation, f"{executor_id}/audit/{n}", details={**details, **extra}))


def _value(name: str, **labels: str) -> float:
    return metrics.REGISTRY.get_sample_value(name, labels) or 0.0


async def test_recovery_and_lifecycle_metrics_are_observed_where_the_rows_are_written(store: Store) -> None:
    store.ensure_app(ORG, APP)
    before = {outcome: _value("relay_recoveries_total", org=ORG, app=APP, outcome=outcome)
              for outcome in ("succeeded", "failed", "blocked")}
    durations = _value("relay_recovery_duration_seconds_count", org=ORG, app=APP)
    lateness, delay = _value("relay_dead_lateness_seconds_count"), _value("relay_signal_delay_seconds_count")
    lateness_sum, delay_sum = _value("relay_dead_lateness_seconds_sum"), _value("relay_signal_delay_seconds_sum")
    await _lifecycle_events(store, ActivityEnvironment(), "ex-1")
    assert {outcome: _value("relay_recoveries_total", org=ORG, app=APP, outcome=outcome) - n
            for outcome, n in before.items()} == {"succeeded": 1, "failed": 1, "blocked": 1}
    assert _value("relay_recovery_duration_seconds_count", org=ORG, app=APP) == durations + 1
    assert _value("relay_dead_lateness_seconds_count") == lateness + 1
    assert 0.2 <= _value("relay_dead_lateness_seconds_sum") - lateness_sum < 5
    # Both socket events: the handshake (HEALTHY) and the close (DISCONNECTED), each 30-40 ms before its write.
    assert _value("relay_signal_delay_seconds_count") == delay + 2
    assert 0.07 <= _value("relay_signal_delay_seconds_sum") - delay_sum < 5


async def test_a_retried_activity_counts_its_row_once(store: Store) -> None:
    store.ensure_app(ORG, APP)
    activities = RegistryActivities(store)
    env = ActivityEnvironment()
    audit = WriteAuditInput(ORG, APP, "ex-2", "executor.recovery.failed", "ex-2/failed", details={"reason": "x"})
    before = _value("relay_recoveries_total", org=ORG, app=APP, outcome="failed")
    await env.run(activities.write_audit, audit)
    env.info = dataclasses.replace(env.info, attempt=2)  # the same row again: a retry after it landed
    await env.run(activities.write_audit, audit)
    assert _value("relay_recoveries_total", org=ORG, app=APP, outcome="failed") == before + 1
    # A retry whose first attempt never wrote the row counts it.
    await env.run(activities.write_audit, dataclasses.replace(audit, event_key="ex-2/failed-again"))
    assert _value("relay_recoveries_total", org=ORG, app=APP, outcome="failed") == before + 2


async def test_retention_rounds_count_by_outcome(store: Store) -> None:
    store.ensure_app(ORG, APP)
    activities = RetentionActivities(store)
    env = ActivityEnvironment()
    clock = datetime.now(UTC)
    before = _value("relay_retention_rounds_total", org=ORG, app=APP, outcome="skipped")
    for key in ("round/1", "round/1", "round/2"):
        await env.run(activities.write_retention_audit,
                      WriteRetentionAuditInput(ORG, APP, "retention.skipped", key, clock, status="failure"))
        env.info = dataclasses.replace(env.info, attempt=2)
    assert _value("relay_retention_rounds_total", org=ORG, app=APP, outcome="skipped") == before + 2


async def test_lifecycle_events_are_one_console_line_each_with_their_ids(store: Store) -> None:
    store.ensure_app(ORG, APP)
    records = LogRecords()
    logger = logging.getLogger("relay.worker")
    logger.addHandler(records)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        await _lifecycle_events(store, ActivityEnvironment(), "ex-3")
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
    lines = [r.getMessage() for r in records.records]
    assert len(lines) == 7, lines
    expected = ["ex-3 of metrics-org/metrics-app connected", "ex-3 of metrics-org/metrics-app disconnected",
                "ex-3 of metrics-org/metrics-app is DEAD", "ex-3 of metrics-org/metrics-app blocked",
                "dispatched to peer", "by peer failed", "recovered by peer"]
    assert all(want in line for want, line in zip(expected, lines, strict=True)), lines
    for record in records.records:
        assert (record.__dict__["org"], record.__dict__["app"], record.__dict__["executor_id"]) == (ORG, APP, "ex-3")
        assert "workflow_id" in record.__dict__
    assert records.records[4].__dict__["request_id"] == "r-1"


async def test_no_label_names_an_executor(store: Store) -> None:
    """Labels stay bounded: after every metric has been observed for an executor, a full scrape (with the
    registry's ``relay_executors``) has no label named for an id or a key, and the executor's id nowhere."""
    store.ensure_app(ORG, APP)
    await _lifecycle_events(store, ActivityEnvironment(), SECRET_ID)
    metrics.HANDSHAKE.observe(0.01)
    metrics.REFUSALS.labels(metrics.refusal_reason(401)).inc()
    metrics.MANAGEMENT_REQUESTS.labels("list_workflows", "ok").inc()
    metrics.MANAGEMENT_SECONDS.labels("list_workflows").observe(0.01)
    metrics.RETENTION_ROUNDS.labels(ORG, APP, "succeeded").inc()
    _record(store, SECRET_ID + "-2", ExecutorStatus.HEALTHY, "k-secret")
    scraped = _scrape(metrics.registry_with(store.engine))
    assert ("relay_executors", (("app", APP), ("org", ORG), ("status", "HEALTHY"))) in scraped
    names = {name for name, _ in scraped}
    assert {"relay_recoveries_total", "relay_handshake_seconds_bucket", "process_cpu_seconds_total"} <= names
    label_names = {label for _, pairs in scraped for label, _ in pairs}
    assert not {label for label in label_names if re.search(r"id$|key|request|connection|executor", label)}, \
        label_names
    assert not [pairs for _, pairs in scraped if any(SECRET_ID in value for _, value in pairs)]


# -- the listener --------------------------------------------------------------------------------------------------

def test_listener_serves_prometheus_text_with_the_registry(store: Store) -> None:
    store.ensure_app(ORG, "listened-app")
    with metrics.serving("127.0.0.1", free_port(), engine=store.engine) as listener:
        assert listener is not None
        response = httpx.get(f"http://{listener.host}:{listener.port}/metrics", timeout=5)
    assert response.status_code == 200
    families = {f.name: f for f in text_string_to_metric_families(response.text)}
    assert {"relay_executors", "relay_recoveries", "process_resident_memory_bytes"} <= set(families)
    zeros = {(s.labels["app"], s.labels["status"]): s.value for s in families["relay_executors"].samples}
    assert zeros[("listened-app", "DEAD")] == 0
    with pytest.raises(httpx.ConnectError):  # stopped with the block
        httpx.get(f"http://{listener.host}:{listener.port}/metrics", timeout=1)


def test_listener_off_or_port_taken_is_no_failure(caplog: pytest.LogCaptureFixture) -> None:
    with metrics.serving("127.0.0.1", 0) as listener:
        assert listener is None
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with caplog.at_level(logging.WARNING, "relay.metrics"), \
                metrics.serving("127.0.0.1", taken.getsockname()[1]) as listener:
            assert listener is None
    assert "metrics listener not started" in caplog.text


def test_settings_put_the_sdk_metrics_next_to_relays() -> None:
    assert Settings().temporal_metrics_address == "127.0.0.1:9465"
    assert Settings(metrics_port=9000).temporal_metrics_address == "127.0.0.1:9001"
    assert Settings(metrics_port=0).temporal_metrics_address is None
    assert Settings(temporal_metrics_port=0).temporal_metrics_address is None
    assert Settings(metrics_port=0, temporal_metrics_port=9100).temporal_metrics_address == "127.0.0.1:9100"


def test_refusal_reasons_are_a_fixed_set() -> None:
    assert [metrics.refusal_reason(s) for s in (401, 403, 404, 429, 503, 418)] == [
        "unauthorized", "forbidden", "not_found", "rate_limited", "unavailable", "other"]


# -- the Grafana dashboard -----------------------------------------------------------------------------------------

_NOT_METRICS = {"by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool",
                "offset", "inf", "nan"}


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression (or a Grafana ``label_values`` query) reads."""
    expr = re.sub(r"^label_values\((.*),\s*\w+\)$", r"\1", expr.strip())
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)  # strings
    expr = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", "", expr)  # ranges
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set()
    for match in re.finditer(r"(?<![\w.$])[a-zA-Z_:][a-zA-Z0-9_:]*", expr):
        if expr[match.end():].lstrip().startswith("(") or match[0] in _NOT_METRICS:
            continue  # a function or an aggregation, or a keyword
        names.add(match[0])
    return names


def _queries(dashboard: dict[str, object]) -> list[str]:
    found: list[str] = []

    def walk(node: object, key: str = "") -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                walk(v, k)
        elif isinstance(node, list):
            for v in node:
                walk(v, key)
        elif isinstance(node, str) and key in ("expr", "query") and node != "prometheus":
            found.append(node)

    walk(dashboard)
    return found


def test_parser_finds_the_metrics_of_an_expression() -> None:
    assert metric_names('histogram_quantile(0.99, sum by (le) (rate(relay_handshake_seconds_bucket{app=~"$app"}'
                        '[$__rate_interval])))') == {"relay_handshake_seconds_bucket"}
    assert metric_names('sum(max by (org, app) (relay_executors{status="DEAD"})) / on(org) group_left x_total') == {
        "relay_executors", "x_total"}
    assert metric_names('label_values(relay_executors{org=~"$org"}, app)') == {"relay_executors"}


def test_every_dashboard_query_names_a_metric_relay_exports() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = _queries(dashboard)
    assert len(queries) >= 15
    exported = metrics.exported_names()
    unknown = {q: sorted(metric_names(q) - exported) for q in queries if metric_names(q) - exported}
    assert not unknown, unknown
    used = set().union(*(metric_names(q) for q in queries))
    assert {"relay_executors", "relay_recoveries_total", "relay_recovery_duration_seconds_bucket",
            "relay_dead_lateness_seconds_bucket", "relay_signal_delay_seconds_bucket",
            "relay_handshake_seconds_bucket", "relay_refusals_total", "relay_retention_rounds_total",
            "relay_management_requests_total", "process_cpu_seconds_total",
            "process_resident_memory_bytes"} <= used
    assert "relay_recoveries_totl" not in exported  # a misspelt name would be caught
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))


def test_no_created_series(store: Store) -> None:
    """prometheus-client would add ``<name>_created`` to every counter and histogram (and label set): turned off."""
    metrics.RECOVERIES.labels(ORG, APP, "succeeded").inc()
    metrics.HANDSHAKE.observe(0.01)
    names = {name for name, _ in _scrape(metrics.registry_with(store.engine))}
    assert "relay_recoveries_total" in names and "relay_handshake_seconds_count" in names
    assert not {name for name in names if name.endswith("_created")}, names
    assert not {name for name in metrics.exported_names() if name.endswith("_created")}
