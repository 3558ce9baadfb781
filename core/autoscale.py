"""Autoscaling advice (upstream's getAutoscale): how many executors each application version of an app needs for the
backlog of its autoscaling policy's queue. Decisions only, no I/O: ``api.autoscaling`` reads the facts from one of the
app's executors, the REST route shows the result and the gauge ``relay_app_desired_executors`` exports it.

Per version, with ``queueDepth`` its workflows on the policy queue with status ENQUEUED or PENDING::

    desiredExecutors = max(1, ceil(queueDepth / worker_concurrency))
    an old version, when rollout.maxExecutorsForOldApplicationVersions (cap) is set: min(cap, desiredExecutors)

- Versions: the latest (the newest ``version_timestamp`` the SDK reports; when it reports none, the version of the
  app's newest HEALTHY executor, ``newest_first``) always; then the old versions that have a backlog, newest first,
  at most ``rollout.maxOldApplicationVersions`` of them (upstream's default, 0: the latest alone). The cap,
  ``rollout.maxExecutorsForOldApplicationVersions``, applies to each old version, as upstream describes it. An old
  version with nothing queued needs no executor: it is left out, so whatever scales its executors falls to its floor.
- The latest version's depth counts the workflows enqueued with no version too: the SDK lets only an executor of the
  latest version dequeue those (dbos 3.2.0, ``SystemDatabase.start_queued_workflows``).
- ``worker_concurrency`` is how many of the queue's workflows one executor runs at once, so the backlog over it is
  the executors that drain it in one round. A queue without it, or a partitioned one (its limits are per partition),
  says nothing of that: it cannot be a policy's queue (``unscalable``). A policy queue that stops being usable later
  (deleted, or changed) leaves each version at its floor (1, or the cap) and the recommendation without a queue name.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

# The statuses that make a queue's backlog: waiting for an executor, or running on one.
BACKLOG_STATUSES = ("ENQUEUED", "PENDING")


@dataclass(frozen=True)
class Rollout:
    """Upstream ``RolloutPolicy``: None is a field left out."""

    max_old_versions: int | None = None  # None: 0, the latest version alone
    max_old_executors: int | None = None  # None: old versions are not capped


@dataclass(frozen=True)
class Policy:
    """Upstream ``AutoscalePolicy``."""

    queue: str
    rollout: Rollout | None = None

    @property
    def max_old_versions(self) -> int:
        return (self.rollout.max_old_versions if self.rollout else None) or 0

    @property
    def max_old_executors(self) -> int | None:
        return self.rollout.max_old_executors if self.rollout else None

    def rest(self) -> dict[str, object]:
        """The policy as upstream's ``AutoscalePolicy`` names it (the REST body, the audit log): fields left out stay
        out, as upstream's are optional but never null."""
        out: dict[str, object] = {"queue": self.queue}
        if self.rollout is not None:
            names = {"maxOldApplicationVersions": self.rollout.max_old_versions,
                     "maxExecutorsForOldApplicationVersions": self.rollout.max_old_executors}
            out["rollout"] = {k: v for k, v in names.items() if v is not None}
        return out


@dataclass(frozen=True)
class QueueFacts:
    """What an executor reports of a queue (``get_queue``)."""

    name: str
    worker_concurrency: int | None
    partitioned: bool


@dataclass(frozen=True)
class Recommendation:
    """Upstream ``QueueAutoscale``: ``queue`` None when the policy queue is no longer usable."""

    version: str
    latest: bool
    depth: int
    desired: int
    queue: str | None
    observed_at: datetime


def unscalable(name: str, queue: QueueFacts | None) -> str | None:
    """Why queue ``name`` cannot drive a policy (None: it can)."""
    if queue is None:
        return f"queue {name!r} does not exist: no executor of the app has registered it"
    if queue.partitioned:
        return (f"queue {name!r} is partitioned: its limits apply per partition, so its backlog does not say how "
                "many executors it needs")
    if queue.worker_concurrency is None or queue.worker_concurrency < 1:
        return (f"queue {name!r} has no worker_concurrency: without a per-executor limit its backlog does not say how "
                "many executors it needs (register it with worker_concurrency)")
    return None


def desired_executors(depth: int, worker_concurrency: int) -> int:
    """``max(1, ceil(depth / worker_concurrency))``, in integers."""
    if worker_concurrency < 1:
        raise ValueError("worker_concurrency must be at least 1")
    return max(1, -(-depth // worker_concurrency))


def newest_first(seen: Iterable[tuple[str, datetime]]) -> list[str]:
    """Application versions by the newest instant each was seen at, newest first: the registry's view of which
    version is the latest (its newest executor's), for an SDK that reports no versions of its own."""
    newest: dict[str, datetime] = {}
    for version, at in seen:
        if version not in newest or at > newest[version]:
            newest[version] = at
    return sorted(newest, key=lambda v: (newest[v], v), reverse=True)


def recommend(policy: Policy, *, versions: Sequence[str], backlog: Mapping[str | None, int],
              queue: QueueFacts | None, observed_at: datetime) -> list[Recommendation]:
    """The recommendation for each version reported (the module docstring says which).

    Args:
        versions: The app's application versions, newest first (the first is the latest); none, nothing to say.
        backlog: ENQUEUED + PENDING workflows on the policy queue by application version (None: enqueued without
            one); versions not in ``versions`` are not reported, as no executor of the app runs them.
        queue: The policy queue as an executor reports it now (None: it no longer exists).
    """
    if not versions:
        return []
    usable = unscalable(policy.queue, queue) is None
    worker_concurrency = queue.worker_concurrency if usable and queue is not None else None
    latest, old = versions[0], [v for v in dict.fromkeys(versions[1:]) if v != versions[0]]
    chosen = [v for v in old if backlog.get(v, 0) > 0][:policy.max_old_versions]
    out = []
    for version in [latest, *chosen]:
        is_latest = version == latest
        depth = backlog.get(version, 0) + (backlog.get(None, 0) if is_latest else 0)
        desired = 1 if worker_concurrency is None else desired_executors(depth, worker_concurrency)
        cap = policy.max_old_executors
        if not is_latest and cap is not None:
            desired = min(desired, cap)
        out.append(Recommendation(version=version, latest=is_latest, depth=depth, desired=desired,
                                  queue=policy.queue if usable else None, observed_at=observed_at))
    return out
