"""The autoscaling formula and its choices (``core.autoscale``): executors per version from a queue's backlog,
which versions are reported, the rollout's cap, a queue that cannot drive a policy; and the gauge's collector
(``core.metrics.DesiredExecutors``), scoped per org like every other metric."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from core import metrics
from core.autoscale import (
    Policy,
    QueueFacts,
    Recommendation,
    Rollout,
    desired_executors,
    newest_first,
    recommend,
    unscalable,
)
from core.models import make_engine
from core.store import Store
from tests.quick import examples

AT = datetime(2026, 12, 8, 12, 0, tzinfo=UTC)
Q = QueueFacts(name="work", worker_concurrency=2, partitioned=False)


@pytest.mark.parametrize(("depth", "concurrency", "desired"), [
    (0, 2, 1), (1, 2, 1), (2, 2, 1), (3, 2, 2), (4, 2, 2), (5, 2, 3), (10, 1, 10), (10, 3, 4), (1000, 7, 143),
])
def test_desired_executors_is_the_backlog_over_the_worker_concurrency_rounded_up_at_least_one(
        depth: int, concurrency: int, desired: int) -> None:
    assert desired_executors(depth, concurrency) == desired


@given(st.integers(0, 10**12), st.integers(1, 10**6))
@settings(max_examples=examples(300))
def test_desired_executors_drain_the_backlog_in_one_round_and_no_fewer_would(depth: int, concurrency: int) -> None:
    n = desired_executors(depth, concurrency)
    assert n >= 1 and n * concurrency >= depth
    assert n == 1 or (n - 1) * concurrency < depth


def test_a_worker_concurrency_under_one_is_refused() -> None:
    with pytest.raises(ValueError, match="worker_concurrency"):
        desired_executors(5, 0)


def _recommend(policy: Policy, backlog: dict[str | None, int], *, versions: tuple[str, ...] = ("v3", "v2", "v1"),
               queue: QueueFacts | None = Q) -> list[tuple[str, bool, int, int, str | None]]:
    out = recommend(policy, versions=versions, backlog=backlog, queue=queue, observed_at=AT)
    assert all(r.observed_at == AT for r in out)
    return [(r.version, r.latest, r.depth, r.desired, r.queue) for r in out]


def test_without_a_rollout_only_the_latest_version_is_reported() -> None:
    assert _recommend(Policy("work"), {"v3": 5, "v2": 9, "v1": 1}) == [("v3", True, 5, 3, "work")]


def test_the_latest_version_needs_one_executor_with_nothing_queued() -> None:
    assert _recommend(Policy("work"), {}) == [("v3", True, 0, 1, "work")]


def test_workflows_enqueued_without_a_version_count_for_the_latest() -> None:
    """The SDK lets only an executor of the latest version dequeue them."""
    assert _recommend(Policy("work"), {"v3": 1, None: 4}) == [("v3", True, 5, 3, "work")]


def test_old_versions_with_a_backlog_newest_first_up_to_the_rollouts_number() -> None:
    policy = Policy("work", Rollout(max_old_versions=1))
    versions = ("v4", "v3", "v2", "v1")
    # v3 has nothing queued: it needs no executor, and does not take v2's place
    assert _recommend(policy, {"v4": 0, "v2": 3, "v1": 8}, versions=versions) == [
        ("v4", True, 0, 1, "work"), ("v2", False, 3, 2, "work")]
    two = Policy("work", Rollout(max_old_versions=2))
    assert _recommend(two, {"v2": 3, "v1": 8}, versions=versions) == [
        ("v4", True, 0, 1, "work"), ("v2", False, 3, 2, "work"), ("v1", False, 8, 4, "work")]
    assert _recommend(Policy("work", Rollout(max_old_versions=0)), {"v2": 3}, versions=versions) == [
        ("v4", True, 0, 1, "work")]


def test_the_cap_applies_to_each_old_version_and_never_to_the_latest() -> None:
    policy = Policy("work", Rollout(max_old_versions=5, max_old_executors=2))
    assert _recommend(policy, {"v3": 40, "v2": 40, "v1": 1}) == [
        ("v3", True, 40, 20, "work"), ("v2", False, 40, 2, "work"), ("v1", False, 1, 1, "work")]
    zero = Policy("work", Rollout(max_old_versions=5, max_old_executors=0))  # "unless the rollout caps it lower"
    assert _recommend(zero, {"v3": 1, "v2": 40}) == [("v3", True, 1, 1, "work"), ("v2", False, 40, 0, "work")]
    uncapped = Policy("work", Rollout(max_old_versions=5))
    assert _recommend(uncapped, {"v2": 40}) == [("v3", True, 0, 1, "work"), ("v2", False, 40, 20, "work")]


def test_versions_no_executor_of_the_app_runs_are_not_reported() -> None:
    policy = Policy("work", Rollout(max_old_versions=5))
    assert _recommend(policy, {"v0": 30}) == [("v3", True, 0, 1, "work")]
    assert _recommend(policy, {"v3": 3}, versions=()) == []


@pytest.mark.parametrize("queue", [None, QueueFacts("work", None, False), QueueFacts("work", 2, True)],
                         ids=["gone", "no-worker-concurrency", "partitioned"])
def test_a_queue_no_longer_usable_leaves_each_version_at_its_floor_without_a_queue_name(
        queue: QueueFacts | None) -> None:
    policy = Policy("work", Rollout(max_old_versions=1, max_old_executors=0))
    assert _recommend(policy, {"v3": 9, "v2": 9}, queue=queue) == [
        ("v3", True, 9, 1, None), ("v2", False, 9, 0, None)]


def test_why_a_queue_cannot_drive_a_policy() -> None:
    assert unscalable("work", Q) is None
    assert "does not exist" in str(unscalable("work", None))
    assert "partitioned" in str(unscalable("work", QueueFacts("work", 2, True)))
    assert "no worker_concurrency" in str(unscalable("work", QueueFacts("work", None, False)))
    assert "no worker_concurrency" in str(unscalable("work", QueueFacts("work", 0, False)))


def test_the_registry_orders_versions_by_their_newest_executor() -> None:
    seen = [("v1", AT), ("v2", AT - timedelta(hours=1)), ("v1", AT - timedelta(days=1)), ("v2", AT + timedelta(1))]
    assert newest_first(seen) == ["v2", "v1"]
    assert newest_first([]) == []


def test_a_policy_in_upstreams_names_leaves_out_what_was_left_out() -> None:
    assert Policy("work").rest() == {"queue": "work"}
    assert Policy("work", Rollout(max_old_versions=0)).rest() == {"queue": "work",
                                                                  "rollout": {"maxOldApplicationVersions": 0}}
    assert Policy("work", Rollout(max_old_executors=3)).rest() == {
        "queue": "work", "rollout": {"maxExecutorsForOldApplicationVersions": 3}}
    assert Policy("work", Rollout(max_old_versions=2)).max_old_versions == 2
    assert (Policy("work").max_old_versions, Policy("work").max_old_executors) == (0, None)


def test_recommendations_are_plain_values() -> None:
    r = Recommendation(version="v1", latest=True, depth=0, desired=1, queue="work", observed_at=AT)
    assert r == Recommendation("v1", True, 0, 1, "work", AT)


# -- the gauge ----------------------------------------------------------------------------------------------------


@pytest.fixture
def store() -> Iterator[Store]:
    store = Store(make_engine("sqlite://"))
    yield store
    store.engine.dispose()


def _samples(text: bytes) -> dict[tuple[str, ...], float]:
    return {(s.labels["org"], s.labels["app"], s.labels["version"]): s.value
            for family in text_string_to_metric_families(text.decode()) for s in family.samples
            if s.name == metrics.DESIRED_EXECUTORS.NAME}


def test_the_gauge_holds_what_was_put_per_app_and_is_scoped_per_org(store: Store) -> None:
    gauge = metrics.DESIRED_EXECUTORS
    try:
        gauge.put("local", "scaled-a", {"v2": 3, "v1": 1})
        gauge.put("other_org", "scaled-b", {"v1": 4})
        everything = generate_latest(metrics.REGISTRY)
        assert {k: v for k, v in _samples(everything).items() if k[1].startswith("scaled-")} == {
            ("local", "scaled-a", "v2"): 3, ("local", "scaled-a", "v1"): 1, ("other_org", "scaled-b", "v1"): 4}
        local = metrics.scoped_exposition(store.engine, org="local", allows=lambda app: app == "scaled-a")
        assert {k: v for k, v in _samples(local).items() if k[1].startswith("scaled-")} == {
            ("local", "scaled-a", "v2"): 3, ("local", "scaled-a", "v1"): 1}
        gauge.put("local", "scaled-a", {"v2": 5})  # v1 left out: its series goes
        assert {k: v for k, v in _samples(generate_latest(metrics.REGISTRY)).items()
                if k[1] == "scaled-a"} == {("local", "scaled-a", "v2"): 5}
        gauge.remove("local", "scaled-a")
        assert not [k for k in _samples(generate_latest(metrics.REGISTRY)) if k[1] == "scaled-a"]
        # A computation that began before a removal (its policy deleted meanwhile) does not bring the series back;
        # one that began after it does.
        began = gauge.mark()
        gauge.remove("local", "scaled-a")
        assert not gauge.put("local", "scaled-a", {"v2": 5}, since=began)
        assert ("local", "scaled-a") not in gauge.apps()
        assert gauge.put("local", "scaled-a", {"v2": 6}, since=gauge.mark())
        assert gauge.put("local", "scaled-b", {"v1": 1}, since=began)  # another app's removal is not this one's
        assert {k: v for k, v in _samples(generate_latest(metrics.REGISTRY)).items()
                if k[1].startswith("scaled-")} == {("local", "scaled-a", "v2"): 6, ("local", "scaled-b", "v1"): 1,
                                                   ("other_org", "scaled-b", "v1"): 4}
        assert metrics.DESIRED_EXECUTORS.NAME in metrics.exported_names()
    finally:
        for org, app in [("local", "scaled-a"), ("local", "scaled-b"), ("other_org", "scaled-b")]:
            gauge.remove(org, app)
