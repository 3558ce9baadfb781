"""Autoscaling advice read from an app's executors (upstream getAutoscale, and setAutoscalingPolicy's check of its
queue), and kept current as the gauge ``relay_app_desired_executors`` for an HPA or KEDA to scale executors on.

What an executor is asked, each an ordinary management request (``gateway.management``), for ``core.autoscale`` to
decide on: the policy queue (``get_queue``: exists, partitioned, ``worker_concurrency``), the app's versions
(``list_application_versions``; when the SDK reports none, or cannot, the versions of the app's HEALTHY executors
in the registry, the newest executor's first), and the queue's backlog per version: one ``get_workflow_aggregates``
(ENQUEUED and PENDING on the queue, counted by application version), or, from an SDK release that cannot aggregate
(Relay's client on dbos 3.4), its ``list_workflows`` pages of the same filter, counted here.

Each gateway refreshes the gauge every RELAY_AUTOSCALE_INTERVAL_SECS for the apps with a policy that have an executor
on it (``Refresher``): the requests go to its own sockets first, every app with a HEALTHY executor is covered by the
gateways holding them, and a gateway that holds none of an app's executors any more drops the app's series. A round
that fails for an app keeps its last values (logged once a minute while it lasts). A scrape reads what the last round
found: it never asks an executor.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol, TypeVar

from fastapi.exceptions import RequestValidationError

from api import conductor as c
from api.managed import check, parse
from core import autoscale, metrics
from core.autoscale import Policy, Recommendation
from core.errors import ExecutorUnsupportedError
from core.logs import OncePerWindow
from core.store import Store
from core.units import utcnow
from gateway import Gateway

log = logging.getLogger("relay.gateway")

R = TypeVar("R", bound=c.SdkReply)

LIST_PAGE = c.MAX_PAGE  # the fallback's page of workflows (ids and fields, no inputs or outputs)
# The fallback counts at most this many pages (100,000 workflows): beyond, the backlog is at least that.
MAX_LIST_PAGES = 100
ROUND_CONCURRENCY = 8  # apps refreshed at once in a round
FAILURE_LOG_EVERY = timedelta(minutes=1)


class Reader(Protocol):
    """Who reads from the app's executors: ``api.managed.Managed`` for a request, ``AppReader`` for the gauge."""

    @property
    def org(self) -> str: ...

    @property
    def app(self) -> str: ...

    @property
    def store(self) -> Store: ...

    async def read(self, kind: str, fields: Mapping[str, Any], reply: type[R]) -> R: ...


@dataclass(frozen=True)
class AppReader:
    """Reads of one app's executors on behalf of Relay itself (no operator's request)."""

    gateway: Gateway
    org: str
    app: str

    @property
    def store(self) -> Store:
        return self.gateway.store

    async def read(self, kind: str, fields: Mapping[str, Any], reply: type[R]) -> R:
        answer = await self.gateway.management.ask(self.org, self.app, kind, fields)
        check(answer, kind)
        return parse(answer, reply, kind)


async def queue_facts(reader: Reader, name: str) -> autoscale.QueueFacts | None:
    reply = await reader.read("get_queue", {"name": name}, c.GetQueueReply)
    return None if reply.output is None else c.queue_facts_of(reply.output)


async def require_scalable(reader: Reader, name: str) -> None:
    """422 unless queue ``name`` exists and can drive a policy (``core.autoscale.unscalable``)."""
    problem = autoscale.unscalable(name, await queue_facts(reader, name))
    if problem is not None:
        raise RequestValidationError([{"loc": ("body", "queue"), "type": "value_error", "input": name,
                                       "msg": problem}])


async def versions(reader: Reader) -> list[str]:
    """The app's application versions, newest first (the first is the latest): as the SDK lists them, else (none
    listed, or an SDK release that cannot list them) by the app's HEALTHY executors in the registry."""
    try:
        reply = await reader.read("list_application_versions", {}, c.ListVersionsReply)
    except ExecutorUnsupportedError:
        reply = c.ListVersionsReply()
    if reply.output:
        rows = sorted(reply.output, key=lambda v: (v.version_timestamp, v.version_name), reverse=True)
        return list(dict.fromkeys(v.version_name for v in rows))
    candidates = await reader.store.call(reader.store.management_candidates, reader.org, reader.app)
    return autoscale.newest_first((e.app_version, e.created_at) for e in candidates.executors)


async def backlog(reader: Reader, queue: str) -> dict[str | None, int]:
    """ENQUEUED + PENDING workflows on ``queue`` by application version (None: enqueued without one)."""
    body = {"group_by_application_version": True, "select_count": True, "status": list(autoscale.BACKLOG_STATUSES),
            "queue_name": [queue]}
    try:
        reply = await reader.read("get_workflow_aggregates", {"body": body}, c.WorkflowAggregatesReply)
    except ExecutorUnsupportedError:
        return await _listed_backlog(reader, queue)
    counts: Counter[str | None] = Counter()
    for row in reply.output:
        version = row.group.get("application_version")
        counts[version if isinstance(version, str) else None] += row.count or 0
    return dict(counts)


async def _listed_backlog(reader: Reader, queue: str) -> dict[str | None, int]:
    """``backlog`` from pages of ``list_workflows``, for an SDK release that cannot aggregate."""
    counts: Counter[str | None] = Counter()
    for page in range(MAX_LIST_PAGES):
        body = {"status": list(autoscale.BACKLOG_STATUSES), "queue_name": queue, "limit": LIST_PAGE,
                "offset": page * LIST_PAGE, "sort_desc": False, "load_input": False, "load_output": False}
        reply = await reader.read("list_workflows", {"body": body}, c.ListWorkflowsReply)
        counts.update(w.ApplicationVersion or None for w in reply.output)
        if len(reply.output) < LIST_PAGE:
            break
    else:
        log.warning("app %s/%s: the backlog of queue %r counted on its first %d workflows only", reader.org,
                    reader.app, queue, MAX_LIST_PAGES * LIST_PAGE)
    return dict(counts)


async def observe(reader: Reader, policy: Policy) -> list[Recommendation]:
    """The app's recommendation now: the queue, the versions, then the backlog (``observed_at`` when it came)."""
    queue = await queue_facts(reader, policy.queue)
    ordered = await versions(reader)
    counts = await backlog(reader, policy.queue)
    return autoscale.recommend(policy, versions=ordered, backlog=counts, queue=queue, observed_at=utcnow())


@dataclass
class Refresher:
    """Keeps ``relay_app_desired_executors`` current on one gateway: a round every ``interval``."""

    gateway: Gateway
    interval: timedelta
    failures: OncePerWindow = field(default_factory=lambda: OncePerWindow(FAILURE_LOG_EVERY))

    async def run(self) -> None:
        while True:
            try:
                await self.round()
            except Exception as err:  # the database away: the series stay as they were until the next round
                if self.failures.due("round"):
                    log.warning("autoscaling round failed: %s: %s", type(err).__name__, err)
            await asyncio.sleep(self.interval.total_seconds())

    async def round(self) -> None:
        """Every app with a policy and an executor here gets fresh series; every other app loses its series."""
        store = self.gateway.store
        since = metrics.DESIRED_EXECUTORS.mark()  # a policy deleted from here on keeps its series removed
        policies = await store.call(store.autoscaling_policies)
        here = {(org, app): policy for org, app, policy in policies if self.gateway.connected_in(org, app)}
        for org, app in metrics.DESIRED_EXECUTORS.apps() - here.keys():
            metrics.DESIRED_EXECUTORS.remove(org, app)
        limit = asyncio.Semaphore(ROUND_CONCURRENCY)

        async def refresh(org: str, app: str, policy: Policy) -> None:
            async with limit:
                await self.refresh(org, app, policy, since=since)

        await asyncio.gather(*(refresh(org, app, policy) for (org, app), policy in here.items()))

    async def refresh(self, org: str, app: str, policy: Policy, *, since: int | None = None) -> None:
        try:
            recommendations = await observe(AppReader(self.gateway, org, app), policy)
        except Exception as err:  # an executor's error or none to ask: the last values stand
            if self.failures.due((org, app)):
                log.warning("autoscaling of app %s/%s not refreshed: %s", org, app,
                            getattr(err, "detail", None) or f"{type(err).__name__}: {err}")
            return
        self.failures.forget((org, app))
        metrics.DESIRED_EXECUTORS.put(org, app, {r.version: r.desired for r in recommendations}, since=since)


@contextlib.asynccontextmanager
async def refreshing(gateway: Gateway) -> AsyncIterator[None]:
    """The gateway's ``Refresher`` runs for the block (none when RELAY_AUTOSCALE_INTERVAL_SECS is 0)."""
    interval = gateway.settings.autoscale_interval
    if not interval:
        yield
        return
    task = asyncio.create_task(Refresher(gateway, interval).run(), name="relay-autoscale-refresher")
    try:
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
