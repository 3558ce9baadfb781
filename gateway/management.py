"""Workflow management: an operator's request (list, get, cancel, resume, fork, ...) carried to one HEALTHY
executor of the app over its conductor socket, and the executor's reply back.

A request still unanswered after ``SLOW_AFTER`` claims its executor in the registry (beside recovery claims) until
it ends: a recovery meanwhile goes to a free peer, never behind an operator's slow query, while one exists.

Every executor of an app shares one system database, so a read can go to any of them; resume and fork go to an
executor on the latest application version (as the SDK defines it: the newest ``version_timestamp`` that
``list_application_versions`` reports) unless the request names a version. Executors a recovery is on (a
``RecoveryClaim``) are asked last: an SDK handles one request at a time, and a recovery must not wait behind an
operator's query. Executors on this gateway process are asked first (a direct request over the socket); one held
by another gateway process is reached through Temporal: a ``ManagementRequestWorkflow`` on that process's own task
queue, whose local activity (``gateway.activities``) asks the executor there.

An executor that cannot be reached, or does not answer, is passed over for the next one — except for a request
that must not run twice (a fork, an import, a schedule trigger or backfill) once it may have been delivered.
Nothing here interprets replies beyond a refusal: the REST routes map them.

Each request counts in ``relay_management_requests_total{operation,status}`` (status: ``ok``, ``executor_error``
when the executor answered with an error message, ``no_executor``, ``failed``, ``refused``, ``unsupported``,
``cancelled``, ``error``) and ``relay_management_request_seconds{operation}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Any

from temporalio.client import Client, WorkflowFailureError
from temporalio.service import RPCError

from core import metrics, wire
from core.errors import (
    ExecutorRefusedError,
    ExecutorsFailedError,
    ExecutorTimeoutError,
    ExecutorUnavailableError,
    ExecutorUnsupportedError,
    NoExecutorError,
    ProtocolError,
)
from core.models import Executor
from core.settings import Settings
from core.store import Candidates, Store
from gateway.hub import Hub
from workflows.contracts.management import (
    ExecutorRequestInput,
    Failure,
    latest_version,
    management_workflow_id,
    unpack,
)
from workflows.management import ManagementRequestWorkflow

log = logging.getLogger("relay.gateway")

# Requests that must not run twice: once one may have reached an executor, no other executor is asked.
NOT_REPEATABLE = frozenset({"fork_workflow", "fork_from_failure", "import_workflow", "trigger_schedule",
                            "backfill_schedule"})
MAX_TRIES = 3  # executors asked per request, at most: each may take the whole timeout
# A routed request's workflow may wait this much longer than the executor's own timeout (its workflow task and
# local activity are scheduled on the other gateway's queue first).
ROUTE_SLACK = timedelta(seconds=5)
METADATA_ONLY = "metadata-only mode"
# A request unanswered this long marks its executor busy in the registry until it ends (a recovery then prefers
# another peer); quicker ones, nearly all, cost no database write.
SLOW_AFTER = timedelta(milliseconds=200)


class Pick(StrEnum):
    ANY = "any"  # reads: any HEALTHY executor
    LATEST = "latest"  # resume and fork: an executor on the latest application version, or on ``version``


@dataclass(frozen=True)
class Answer:
    """One executor's reply: ``body`` is the reply frame without ``type`` and ``request_id`` (``error_message``
    included when the executor set it)."""

    executor_id: str
    body: dict[str, Any]

    @property
    def error(self) -> str | None:
        value = self.body.get("error_message")
        return value if isinstance(value, str) and value else None

    @property
    def unsupported(self) -> bool:
        """The executor's SDK release cannot do this at all (Relay's client for dbos 3.3/3.4 says so)."""
        return self.body.get("unsupported") is True


class _Failed(Exception):
    def __init__(self, failure: Failure, detail: str) -> None:
        super().__init__(detail)
        self.failure = failure
        self.detail = detail


def reply_body(reply: wire.Reply | wire.OtherReply) -> dict[str, Any]:
    if isinstance(reply, wire.OtherReply):
        return reply.body()
    return reply.model_dump(exclude={"type", "request_id"})


def order(rows: list[Executor], *, busy: set[str], local: set[str], version: str | None,
          rng: random.Random | None = None) -> list[Executor]:
    """The executors to ask, in order: of ``version`` only (when given); free before busy (a recovery is on
    them), then on this gateway before elsewhere; shuffled within each group, to spread the load."""
    chosen = [r for r in rows if version is None or r.app_version == version]
    (rng or random).shuffle(chosen)
    return sorted(chosen, key=lambda r: (r.executor_id in busy, r.executor_id not in local))


class Management:
    def __init__(self, *, settings: Settings, store: Store, hub: Hub, client: Client, task_queue: str) -> None:
        self._settings = settings
        self._store = store
        self._hub = hub
        self._client = client
        self._task_queue = task_queue

    async def ask(self, org: str, app: str, kind: str, fields: Mapping[str, Any], *, pick: Pick = Pick.ANY,
                  version: str | None = None, timeout: timedelta | None = None,
                  candidates: Candidates | None = None) -> Answer:
        """Send ``{"type": kind, "request_id": <new>, **fields}`` to one executor of the app and return its reply.

        ``candidates``: the app's ``Store.management_candidates``, when the caller has just read them (a REST
        route reads them with its key check); else they are read here.

        Raises:
            NoExecutorError: no HEALTHY executor (of ``version``, or of the latest one, for ``Pick.LATEST``).
            ExecutorsFailedError: every executor tried failed or timed out (``tried`` names them).
            ExecutorRefusedError: the executor refused (metadata-only mode).
            ExecutorUnsupportedError: every executor asked answered that its SDK release cannot do it.
        """
        started, status = time.monotonic(), "error"
        try:
            answer = await self._ask(org, app, kind, fields, pick=pick, version=version, timeout=timeout,
                                     candidates=candidates)
            status = "ok" if answer.error is None else "executor_error"
            return answer
        except NoExecutorError:
            status = "no_executor"
            raise
        except ExecutorsFailedError:
            status = "failed"
            raise
        except ExecutorUnsupportedError:
            status = "unsupported"
            raise
        except ExecutorRefusedError:
            status = "refused"
            raise
        except asyncio.CancelledError:
            status = "cancelled"
            raise
        finally:
            metrics.MANAGEMENT_REQUESTS.labels(kind, status).inc()
            metrics.MANAGEMENT_SECONDS.labels(kind).observe(time.monotonic() - started)

    async def _ask(self, org: str, app: str, kind: str, fields: Mapping[str, Any], *, pick: Pick,
                   version: str | None, timeout: timedelta | None, candidates: Candidates | None) -> Answer:
        timeout = timeout or self._settings.management_timeout
        if candidates is None:
            candidates = await asyncio.to_thread(self._store.management_candidates, org, app)
        if pick is Pick.LATEST and version is None:
            version = await self.latest_version(org, app, timeout=timeout, candidates=candidates)
        local = {c.executor_id for c in self._hub.in_app(org, app)}
        ordered = order(candidates.executors, busy=candidates.busy, local=local, version=version)
        if not ordered:
            raise await self._none_to_ask(org, app, version)
        tried: list[str] = []
        reasons: list[str] = []
        unsupported: list[Answer] = []
        for row in ordered[:MAX_TRIES]:
            tried.append(row.executor_id)
            request_id = str(uuid.uuid4())
            frame = wire.management_request(kind, request_id, dict(fields))
            try:
                body = await self._ask_one(row, request_id, frame, timeout)
            except _Failed as failed:
                reasons.append(f"{row.executor_id}: {failed.detail}")
                log.info("management request %s to executor %s failed: %s", kind, row.executor_id, failed.detail)
                if failed.failure is not Failure.UNAVAILABLE and kind in NOT_REPEATABLE:
                    raise ExecutorsFailedError(
                        f"{kind} to executor {row.executor_id} failed ({failed.detail}); it may or may not have "
                        "been carried out, so it was not sent to another executor", tried=tried) from None
                continue
            answer = Answer(row.executor_id, body)
            if answer.error is not None and METADATA_ONLY in answer.error:
                raise ExecutorRefusedError(f"executor {row.executor_id} refused {kind}: "
                                           f"{wire.error_summary(answer.error)}", executor_id=row.executor_id)
            if answer.unsupported:  # not carried out, whatever the kind: another SDK release may do it
                unsupported.append(answer)
                reasons.append(f"{row.executor_id}: {wire.error_summary(answer.error or 'unsupported')}")
                continue
            return answer
        if unsupported and len(unsupported) == len(tried):
            first = unsupported[0]
            raise ExecutorUnsupportedError(
                f"{kind} is not supported by the executors of app {app!r} asked ({', '.join(tried)}): "
                f"{wire.error_summary(first.error or 'unsupported')}", executor_id=first.executor_id)
        raise ExecutorsFailedError(f"no executor of app {app!r} answered {kind}: " + "; ".join(reasons)[:1000],
                                   tried=tried)

    async def _none_to_ask(self, org: str, app: str, version: str | None) -> NoExecutorError:
        """The 503 when no executor may be asked, naming the cause: none connected, or every HEALTHY one drained
        (connected, but never chosen while drained; the operator's own drain is the likelier cause, so say how to
        end it)."""
        of = f" on application version {version!r}" if version is not None else ""
        try:
            rows = await asyncio.to_thread(self._store.drained_executors, org, app)
        except Exception as err:  # only to explain a 503: the plain one will do
            log.info("could not read the drains of %s/%s: %s", org, app, err)
            rows = []
        drained = [executor_id for executor_id, v in rows if version is None or v == version]
        if not drained:
            return NoExecutorError(f"no HEALTHY executor of app {app!r}{of} is connected")
        which = ", ".join(drained[:3]) + (f" and {len(drained) - 3} more" if len(drained) > 3 else "")
        whom = (f"the only HEALTHY executor of app {app!r}{of} ({which}) is" if len(drained) == 1 else
                f"all {len(drained)} HEALTHY executors of app {app!r}{of} ({which}) are")
        return NoExecutorError(f"{whom} connected but drained, and a drained executor carries no operator's request: "
                               f"end the drain with `relay drain clear {drained[0]} --app {app}`")

    async def latest_version(self, org: str, app: str, *, timeout: timedelta | None = None,
                             candidates: Candidates | None = None) -> str | None:
        """The app's latest application version, as its executors' SDK defines it (the newest
        ``version_timestamp``); None when the SDK reports none."""
        answer = await self.ask(org, app, "list_application_versions", {}, timeout=timeout, candidates=candidates)
        return latest_version(answer.body)

    async def _ask_one(self, row: Executor, request_id: str, frame: str, timeout: timedelta) -> dict[str, Any]:
        """Ask one executor; a request still unanswered after ``SLOW_AFTER`` claims it (``claim_for_management``)
        until it ends, so that a recovery meanwhile goes to a free peer."""
        asking = asyncio.ensure_future(self._send_one(row, request_id, frame, timeout))
        done, _ = await asyncio.wait([asking], timeout=SLOW_AFTER.total_seconds())
        if done:
            return asking.result()
        claimed = False
        try:
            await asyncio.to_thread(self._store.claim_for_management, org=row.org, app=row.app,
                                    executor_id=row.executor_id, request_id=request_id)
            claimed = True
        except Exception as err:  # the claim is an optimisation: the request goes on without it
            log.info("could not claim executor %s for a slow request: %s", row.executor_id, err)
        try:
            return await asking
        finally:
            if claimed:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(self._store.release_management_claim, org=row.org, app=row.app,
                                            request_id=request_id)

    async def _send_one(self, row: Executor, request_id: str, frame: str, timeout: timedelta) -> dict[str, Any]:
        conn = self._hub.find(row.org, row.app, row.executor_id)
        if conn is not None:
            try:
                reply = await conn.request(request_id, frame, timeout=timeout, large_reply=True)
            except ExecutorTimeoutError as err:
                raise _Failed(Failure.TIMEOUT, err.detail) from None
            except (ExecutorUnavailableError, ProtocolError) as err:
                raise _Failed(Failure.BROKEN, err.detail) from None
            return reply_body(reply.reply)
        if row.gateway_queue is None or row.gateway_queue == self._task_queue:
            raise _Failed(Failure.UNAVAILABLE, "not connected (any more)")
        return await self._routed(row, request_id, frame, timeout)

    async def _routed(self, row: Executor, request_id: str, frame: str, timeout: timedelta) -> dict[str, Any]:
        """Ask through the gateway process that holds the socket."""
        assert row.gateway_queue is not None
        request = ExecutorRequestInput(org=row.org, app=row.app, executor_id=row.executor_id, request_id=request_id,
                                       frame=frame, timeout=timeout)
        try:
            result = await self._client.execute_workflow(
                ManagementRequestWorkflow.run, request, id=management_workflow_id(request_id),
                task_queue=row.gateway_queue, execution_timeout=timeout + ROUTE_SLACK)
        except WorkflowFailureError as err:
            # Its gateway never picked it up (gone), or the local activity failed there: it may have been sent.
            raise _Failed(Failure.TIMEOUT, f"routed through its gateway: {err.cause or err}") from None
        except RPCError as err:
            raise _Failed(Failure.UNAVAILABLE, f"Temporal: {err.message}") from None
        if result.failure is not None:
            raise _Failed(result.failure, result.detail)
        return unpack(result.reply_z)
