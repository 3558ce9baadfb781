"""End to end, real processes: `relay dev` with its metrics listener and the Temporal SDK's exporter on free ports,
two real ``dbos==3.2.0`` executors; one is SIGKILLed and recovered by the other, then both listeners are scraped."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from tests.support import Process, Relay, dbos_executor, free_port, running_relay, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.concurrent]
APP = "metered-recovery"

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


@pytest.fixture(scope="module")
def metered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Relay, str, str]]:
    """`relay dev` with both metrics listeners on free ports: (relay, Relay's metrics URL, the SDK's)."""
    data_dir = tmp_path_factory.mktemp("relay-metrics")
    port, sdk_port = free_port(), free_port()
    with running_relay(data_dir, RELAY_METRICS_PORT=str(port), RELAY_TEMPORAL_METRICS_PORT=str(sdk_port)) as relay:
        yield relay, f"http://127.0.0.1:{port}/metrics", f"http://127.0.0.1:{sdk_port}/metrics"


def _scrape(url: str) -> tuple[str, Samples]:
    text = httpx.get(url, timeout=5).raise_for_status().text
    samples = {(s.name, frozenset(s.labels.items())): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    return text, samples


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_a_recovery_shows_on_the_metrics_listener(metered: tuple[Relay, str, str], tmp_path: Path) -> None:
    relay, url, sdk_url = metered
    started = time.monotonic()
    with relay.api() as client:
        assert client.put(f"/v2/orgs/local/apps/{APP}").status_code == 204
        assert client.patch(f"/v2/orgs/local/apps/{APP}", json={"executorTimeoutSecs": 1}).status_code == 204
    with pytest.raises(InvalidStatus):
        connect(f"{relay.ws_url}websocket/{APP}/not-a-key", open_timeout=5).close()
    _, before = _scrape(url)
    assert _value(before, "relay_executors", org="local", app=APP, status="DEAD") == 0  # registered: zeros shown
    assert _value(before, "relay_refusals_total", reason="unauthorized") >= 1
    sys_db = tmp_path / "sys.sqlite"
    executors: list[Process] = []
    try:
        # One at a time: two executors migrating a brand-new SQLite system database at once can crash one.
        executors.append(dbos_executor(relay.ws_url, relay.key, APP, sys_db, tmp_path / "a.log"))
        wait_until(lambda: list(relay.executors(APP).values()) == ["HEALTHY"], timeout=30, what="A HEALTHY")
        [a_id] = relay.executors(APP)
        executors.append(dbos_executor(relay.ws_url, relay.key, APP, sys_db, tmp_path / "b.log"))
        wait_until(lambda: len(relay.executors(APP)) == 2, timeout=30, what="B HEALTHY")

        executors[0].kill()
        wait_until(lambda: a_id not in relay.executors(APP), timeout=20, interval=0.1, what="A recovered, deleted")
        text, after = _scrape(url)
    finally:
        for process in executors:
            process.stop()

    counts = {status: _value(after, "relay_executors", org="local", app=APP, status=status)
              for status in ("HEALTHY", "DISCONNECTED", "DEAD")}
    assert counts == {"HEALTHY": 1, "DISCONNECTED": 0, "DEAD": 0}, text
    succeeded = ("relay_recoveries_total", {"org": "local", "app": APP, "outcome": "succeeded"})
    assert _value(after, succeeded[0], **succeeded[1]) == _value(before, succeeded[0], **succeeded[1]) + 1, text
    assert _value(after, "relay_recovery_duration_seconds_count", org="local", app=APP) == 1, text
    assert 0 < _value(after, "relay_recovery_duration_seconds_sum", org="local", app=APP) < 20, text
    assert _value(after, "relay_dead_lateness_seconds_count") >= 1, text
    assert _value(after, "relay_handshake_seconds_count") >= 2, text
    assert _value(after, "relay_signal_delay_seconds_count") >= 3, text  # two handshakes and the SIGKILLed close
    assert _value(after, "relay_executor_transitions_total", org="local", app=APP, status="DEAD") == 1, text
    assert _value(after, "process_resident_memory_bytes") > 0, text
    assert not [labels for _, labels in after if any(a_id in value for _, value in labels)], text
    if out := os.environ.get("RELAY_METRICS_SAMPLE"):  # kept for the note
        Path(out).write_text(text)

    sdk_text = httpx.get(sdk_url, timeout=5).raise_for_status().text
    assert "temporal_workflow_completed" in sdk_text or "temporal_workflow_task" in sdk_text, sdk_text[:2000]
    assert time.monotonic() - started < 30
