"""The scale bench's reading of a histogram from gateways' metrics: bucket counts summed over processes, and the
bounds under which a share of the observations between two readings fall."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram, generate_latest

from tests.bench.bench_scale import buckets, quantiles

BOUNDS = (1, 2, 4, 8, 15, 30)


def _gateway() -> tuple[CollectorRegistry, Histogram]:
    registry = CollectorRegistry()
    return registry, Histogram("relay_gateway_connected_seconds", "test", ["stage"], buckets=BOUNDS, registry=registry)


def _read(*registries: CollectorRegistry) -> dict[str, dict[float, float]]:
    total: dict[str, dict[float, float]] = {}
    for registry in registries:
        buckets(generate_latest(registry).decode(), "relay_gateway_connected_seconds", "stage", into=total)
    return total


def test_quantiles_count_only_what_was_observed_between_the_readings_over_every_gateway() -> None:
    (one, h1), (two, h2) = _gateway(), _gateway()
    for _ in range(50):
        h1.labels("landed").observe(0.5)  # before the kill: not counted
    before = _read(one, two)
    for _ in range(90):
        h1.labels("landed").observe(3.0)
    for _ in range(9):
        h2.labels("landed").observe(10.0)
    h2.labels("landed").observe(20.0)
    h2.labels("moved").observe(1.5)
    got = quantiles(_read(one, two), before)
    assert got["landed"] == {"p50": 4.0, "p90": 4.0, "p99": 15.0, "p100": 30.0, "n": 100.0}
    assert got["moved"] == {"p50": 2.0, "p90": 2.0, "p99": 2.0, "p100": 2.0, "n": 1.0}
