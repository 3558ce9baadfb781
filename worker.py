"""The Temporal worker for Relay's workflows and database activities, on the shared task queue; at start-up it
also creates (or reconciles) the retention schedule."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.converter import (
    DataConverter,
    SerializationContext,
    StorageDriverStoreContext,
    StorageDriverWorkflowInfo,
    WorkflowSerializationContext,
)
from temporalio.service import RPCError
from temporalio.worker import PollerBehaviorSimpleMaximum, Worker, WorkflowInstance, WorkflowInstanceDetails
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

from activities.alerts import AlertActivities, OwnAlertActivities
from activities.gate import GateActivities
from activities.orphans import OrphanActivities
from activities.reconcile import ReconcileActivities
from activities.registry import RegistryActivities
from activities.retention import RetentionActivities
from core.models import open_engine
from core.settings import DEFAULT_WORKER_STICKY_TIMEOUT, Settings
from core.store import Store
from core.temporal import connect, temporal_connection
from workflows.alerts import AlertsWorkflow, OwnAlertWorkflow
from workflows.contracts.alerts import ALERTS_SCHEDULE_ID, AlertsInput
from workflows.contracts.common import SHARED_TASK_QUEUE
from workflows.contracts.orphans import ORPHANS_SCHEDULE_ID, OrphanSweepInput
from workflows.contracts.reconcile import RECONCILE_SCHEDULE_ID, ReconcileInput
from workflows.contracts.retention import RETENTION_SCHEDULE_ID, RetentionInput
from workflows.gateway_watch import GatewayWorkflow
from workflows.lifecycle import ExecutorLifecycleWorkflow
from workflows.orphans import OrphanSweepWorkflow
from workflows.reconcile import ReconcileWorkflow
from workflows.retention import AppRetentionWorkflow, RetentionWorkflow

log = logging.getLogger("relay.worker")


# Every executor is a long-lived workflow: keep a whole fleet cached, so a signal does not replay its history.
MAX_CACHED_WORKFLOWS = 20_000
# Workflow tasks (and local activities) one worker holds at once: the SDK's default, 100. A thousand removed the
# sticky timeouts of one burst of 100 deaths on one worker (P4), but at scale (1,000 of 10,000 closed at once over
# 2 workers, `make bench PARTS=scale`) each worker took in ~500 tasks whose local activities then queued behind each
# other past the workflow-task timeout: "Workflow task not found" on completion ~1,400 times a minute, every one
# redone from its history, and 249 of 999 recovered in 350 s at 1.0 core per worker. Bounded, the excess waits on the
# server, where the other worker can take it.
MAX_CONCURRENT_TASKS = 100
# Every workflow-task poll holds one of those slots while it waits. Scaled on the server's feedback up to the SDK's
# default maximum (100, per queue), the shared queue's polls held 99 of the 100 after a connect storm, leaving the
# sticky queue, where every task of a cached workflow comes, one poll at a time: a burst of 100 deaths started its
# workflow tasks ~100 a second (P4 burst DEAD p99 1.2-2.2 s with `python -m tests.bench.profile bursts`). Capped at 20
# per queue, still scaled, 1.00-1.69 s on 2026-12-07: the poll count follows the server's feedback, which lags a
# burst that comes all at once (every probe of a burst answers at its grace's end), and the polls it churns cost the
# worker and the server CPU in the burst itself. A fixed 40 polls, split by the SDK between the shared queue (a fifth)
# and the sticky queue, the same day: 0.64-1.07 s, 2-5 ms less worker CPU per death in the burst, and registrations
# in a connect storm (P3) no slower. 40 leaves 60 slots to the tasks themselves.
WORKFLOW_TASK_POLLERS = PollerBehaviorSimpleMaximum(2 * MAX_CONCURRENT_TASKS // 5)


class _Contextless(WorkflowInstance):
    """A sandboxed workflow instance that answers the SDK's per-payload questions (which serialization context,
    which external-store target) outside the sandbox.

    The SDK asks them for every payload of every activation and completion, six passes each, and the sandboxed
    instance answers each by compiling and running a snippet inside the sandbox: a quarter of the worker's CPU in a
    burst of deaths (``tests/bench/profile.py``). Relay's data converter has no codec and no external storage, and
    its payload converter reads no context, so the answer changes nothing: the workflow's own context for every
    payload. The workflow code itself still runs in the sandbox."""

    def __init__(self, inner: WorkflowInstance, det: WorkflowInstanceDetails) -> None:
        self._inner = inner
        info = det.info
        self._context = WorkflowSerializationContext(namespace=info.namespace, workflow_id=info.workflow_id)
        self._store = StorageDriverStoreContext(target=StorageDriverWorkflowInfo(
            id=info.workflow_id, run_id=info.run_id, type=info.workflow_type, namespace=info.namespace))

    def activate(self, act):  # type: ignore[no-untyped-def]  # the SDK's generated protobuf types
        return self._inner.activate(act)

    def get_serialization_context(self, command_info: object) -> SerializationContext | None:
        return self._context

    def get_external_store_context(self, command_info: object) -> StorageDriverStoreContext:
        return self._store

    def get_info(self):  # type: ignore[no-untyped-def]
        return self._inner.get_info()

    def get_thread_id(self) -> int | None:
        return self._inner.get_thread_id()


class ContextlessSandboxRunner(SandboxedWorkflowRunner):
    """The sandbox, with the serialization-context questions answered outside it (``_Contextless``). Only for a
    data converter with neither a payload codec nor external storage, the two things a context could change
    (``build_worker`` checks the client's)."""

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _Contextless(super().create_instance(det), det)


# Modules the workflow sandbox shares with the worker instead of importing them anew for every workflow run.
PASSED_THROUGH = ("pydantic", "core.types", "workflows.contracts", "workflows.timing", "workflows.fence",
                  "workflows.lifecycle_generations", "workflows.lifecycle_base", "workflows.recovery",
                  "workflows.lifecycle")


def workflow_runner(converter: DataConverter) -> SandboxedWorkflowRunner:
    """The sandbox Relay's workflows run in; answering the serialization-context questions outside it
    (``ContextlessSandboxRunner``) unless ``converter`` has a payload codec or external storage."""
    # Relay's contracts (typed inputs, activity stubs) and pydantic are safe to share with the sandbox: not
    # re-importing them for every workflow run is most of the cost of starting one (the connect-storm benchmark).
    # So is the lifecycle's workflow code, all three modules (steps, no state of their own): re-imported for every
    # run, the split into three modules cost the worker about 5 ms of CPU per registration, and the last of them,
    # the workflow class's own module, another 4 ms (12.8 → 8.7 ms per registration in a connect storm). What they
    # may import is checked as the sandbox would (tests/unit/test_layers.py, PASSED_THROUGH); their workflow code
    # still runs in the sandbox's event loop, one instance per run.
    restrictions = SandboxRestrictions.default.with_passthrough_modules(*PASSED_THROUGH)
    if converter.payload_codec is None and converter.external_storage is None:
        return ContextlessSandboxRunner(restrictions=restrictions)
    return SandboxedWorkflowRunner(restrictions=restrictions)


def build_worker(client: Client, store: Store, *, task_queue: str = SHARED_TASK_QUEUE,
                 settings: Settings | None = None) -> Worker:
    alerts = AlertActivities(store, webhook_url=settings.alert_webhook_url if settings else None,
                             webhook_secret=settings.alert_webhook_secret if settings else None)
    return Worker(
        client,
        task_queue=task_queue,
        workflows=[ExecutorLifecycleWorkflow, GatewayWorkflow, RetentionWorkflow, AppRetentionWorkflow,
                   AlertsWorkflow, OwnAlertWorkflow, OrphanSweepWorkflow, ReconcileWorkflow],
        activities=[*RegistryActivities(store).all(), *RetentionActivities(store).all(),
                    *GateActivities(store, settings.recovery_policy if settings else None).all(),
                    *alerts.all(), *OwnAlertActivities(store, settings).all(), *OrphanActivities(store).all(),
                    *ReconcileActivities(store).all()],
        max_cached_workflows=MAX_CACHED_WORKFLOWS,
        max_concurrent_workflow_tasks=MAX_CONCURRENT_TASKS,
        max_concurrent_local_activities=MAX_CONCURRENT_TASKS,
        # The SDK's default, at most 5 workflow-task polls at once, capped a connect storm at ~47 registrations/s
        # with the machine half idle: every new executor's first task comes through the shared queue, one poll
        # each. Scaled on the server's feedback (Temporal's advice for production), 1,000 at once register at
        # ~70/s on the bench's machine; capped so that polls leave the tasks their slots.
        workflow_task_poller_behavior=WORKFLOW_TASK_POLLERS,
        # RELAY_WORKER_STICKY_TIMEOUT_SECS: a SIGKILLed worker's cached workflows wait this long at most on its
        # private queue (core.settings.DEFAULT_WORKER_STICKY_TIMEOUT).
        sticky_queue_schedule_to_start_timeout=(settings.worker_sticky_timeout if settings
                                                else DEFAULT_WORKER_STICKY_TIMEOUT),
        # On SIGTERM polling stops, and the activities in flight get this long to finish before they are cancelled
        # (the longest, an alert webhook's POST, gives up after 10 s); within the 30 s stop grace in deploy/.
        graceful_shutdown_timeout=timedelta(seconds=15),
        workflow_runner=workflow_runner(client.data_converter),
    )


async def run(settings: Settings, stop: asyncio.Event, *, client: Client | None = None) -> None:
    """Run the worker until ``stop`` is set, on ``client`` (the start-up check's: ``core.temporal.start_client``),
    or on a client of its own to the Temporal the environment names."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    store = Store(open_engine(settings))
    client = client or await connect(temporal_connection(settings))
    async with build_worker(client, store, settings=settings):
        log.info("worker running on task queue %s", SHARED_TASK_QUEUE)
        await ensure_retention_schedule(client, settings)
        await ensure_alerts_schedule(client, settings)
        await ensure_orphans_schedule(client, settings)
        await ensure_reconcile_schedule(client, settings)
        await start_reconcile_round(client, settings)
        await stop.wait()
    store.engine.dispose()


# -- the retention schedule ----------------------------------------------------------------------------------------

# After Temporal was unavailable, run at most the rounds due in this last stretch, not a backlog (the server's
# default is a year). Temporal's minimum is 10 s.
RETENTION_CATCHUP_WINDOW = timedelta(minutes=1)


def retention_schedule(settings: Settings) -> Schedule:
    """The schedule Relay wants: a ``RetentionWorkflow`` every ``retention_interval``, overlaps skipped."""
    return Schedule(
        action=ScheduleActionStartWorkflow(
            RetentionWorkflow.run,
            RetentionInput(interval=settings.retention_interval, gc_batch_size=settings.retention_gc_batch_size,
                           reply_timeout=settings.recovery_timeout, audit_retention=settings.audit_retention),
            id=RETENTION_SCHEDULE_ID,  # the schedule appends the nominal time to each run's id
            task_queue=SHARED_TASK_QUEUE,
            static_summary="Relay retention round",
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=settings.retention_interval)]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP, catchup_window=RETENTION_CATCHUP_WINDOW),
    )


async def ensure_retention_schedule(client: Client, settings: Settings) -> None:
    """Create the schedule if missing; if it exists, bring its interval, argument and policy up to the settings.

    Idempotent, so every worker may call it at start-up. Its state (paused, note) is left alone: an operator's
    pause survives restarts. Workers started with different settings overwrite each other: the last one wins.
    """
    desired = retention_schedule(settings)
    try:
        await client.create_schedule(RETENTION_SCHEDULE_ID, desired)
        log.info("retention schedule %s created: every %s", RETENTION_SCHEDULE_ID, settings.retention_interval)
        return
    except ScheduleAlreadyRunningError:
        pass

    async def reconcile(current: ScheduleUpdateInput) -> ScheduleUpdate | None:
        schedule = current.description.schedule
        if await _same_schedule(client, schedule, desired):
            return None
        schedule.action, schedule.spec, schedule.policy = desired.action, desired.spec, desired.policy
        log.info("retention schedule %s updated: every %s", RETENTION_SCHEDULE_ID, settings.retention_interval)
        return ScheduleUpdate(schedule=schedule)

    await client.get_schedule_handle(RETENTION_SCHEDULE_ID).update(reconcile)


async def _same_schedule(client: Client, current: Schedule, desired: Schedule) -> bool:
    def intervals(schedule: Schedule) -> list[tuple[timedelta, timedelta]]:
        return [(i.every, i.offset or timedelta(0)) for i in schedule.spec.intervals]

    action, want = current.action, desired.action
    if not isinstance(action, ScheduleActionStartWorkflow) or not isinstance(want, ScheduleActionStartWorkflow):
        return False
    if (intervals(current) != intervals(desired) or current.spec.calendars or current.spec.cron_expressions
            or (current.policy.overlap, current.policy.catchup_window)
            != (desired.policy.overlap, desired.policy.catchup_window)
            or (action.workflow, action.id, action.task_queue) != (want.workflow, want.id, want.task_queue)):
        return False
    try:
        # A described schedule's arguments are raw payloads; decode them to compare with the settings.
        args = await client.data_converter.decode(list(action.args), [RetentionInput])
    except Exception:  # an argument of another shape (an older Relay): replace it
        return False
    return list(args) == list(want.args)


# -- the alerts schedule -------------------------------------------------------------------------------------------


def alerts_schedule(settings: Settings) -> Schedule:
    """An ``AlertsWorkflow`` every ``alert_interval``, overlaps skipped, no backlog after an outage."""
    return Schedule(
        action=ScheduleActionStartWorkflow(
            AlertsWorkflow.run,
            AlertsInput(interval=settings.alert_interval, reply_timeout=settings.management_timeout),
            id=ALERTS_SCHEDULE_ID,
            task_queue=SHARED_TASK_QUEUE,
            static_summary="Relay alerts round",
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=settings.alert_interval)]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP, catchup_window=RETENTION_CATCHUP_WINDOW),
    )


async def ensure_alerts_schedule(client: Client, settings: Settings) -> None:
    """Create the alerts schedule, or bring it to the settings (``_ensure_schedule``)."""
    await _ensure_schedule(client, ALERTS_SCHEDULE_ID, alerts_schedule(settings),
                           f"alerts schedule: every {settings.alert_interval}")


async def _ensure_schedule(client: Client, schedule_id: str, desired: Schedule, what: str) -> None:
    """Create the schedule, or bring its action, spec and policy to ``desired`` (its state, such as an operator's
    pause, is left alone). Idempotent; the last worker started wins."""
    try:
        await client.create_schedule(schedule_id, desired)
        log.info("%s created (%s)", schedule_id, what)
        return
    except ScheduleAlreadyRunningError:
        pass

    async def reconcile(current: ScheduleUpdateInput) -> ScheduleUpdate:
        schedule = current.description.schedule
        schedule.action, schedule.spec, schedule.policy = desired.action, desired.spec, desired.policy
        return ScheduleUpdate(schedule=schedule)

    await client.get_schedule_handle(schedule_id).update(reconcile)


# -- the orphan sweep's schedule -----------------------------------------------------------------------------------


def orphans_schedule(settings: Settings) -> Schedule:
    """An ``OrphanSweepWorkflow`` every ``orphan_sweep_interval``, overlaps skipped, no backlog after an outage."""
    return Schedule(
        action=ScheduleActionStartWorkflow(
            OrphanSweepWorkflow.run,
            OrphanSweepInput(min_age=settings.orphan_min_age, reply_timeout=settings.management_timeout,
                             recovery_timeout=settings.recovery_timeout,
                             probe_timeout=settings.gateway_heartbeat_timeout),
            id=ORPHANS_SCHEDULE_ID,
            task_queue=SHARED_TASK_QUEUE,
            static_summary="Relay orphan sweep",
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=settings.orphan_sweep_interval)]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP, catchup_window=RETENTION_CATCHUP_WINDOW),
    )


async def ensure_orphans_schedule(client: Client, settings: Settings) -> None:
    """Create the orphan sweep's schedule, or bring its action, spec and policy to the settings (an operator's
    pause is left alone); with ``RELAY_ORPHAN_SWEEP_INTERVAL_SECS`` 0, delete it. Idempotent; the last worker
    started wins."""
    handle = client.get_schedule_handle(ORPHANS_SCHEDULE_ID)
    if settings.orphan_sweep_interval <= timedelta(0):
        try:
            await handle.delete()
            log.info("orphan sweep schedule %s deleted: RELAY_ORPHAN_SWEEP_INTERVAL_SECS is 0", ORPHANS_SCHEDULE_ID)
        except RPCError:
            pass  # none to delete
        return
    await _ensure_schedule(client, ORPHANS_SCHEDULE_ID, orphans_schedule(settings),
                           f"orphan sweep: every {settings.orphan_sweep_interval}")


# -- the reconciliation's schedule ---------------------------------------------------------------------------------

# The round every worker starts at start-up, under one id: workers started together share one round.
RECONCILE_STARTUP_ID = f"{RECONCILE_SCHEDULE_ID}/startup"


def reconcile_input(settings: Settings) -> ReconcileInput:
    return ReconcileInput(recovery_timeout=settings.recovery_timeout, probe_timeout=settings.gateway_heartbeat_timeout)


def reconcile_schedule(settings: Settings) -> Schedule:
    """A ``ReconcileWorkflow`` every ``reconcile_interval``, overlaps skipped, no backlog after an outage."""
    return Schedule(
        action=ScheduleActionStartWorkflow(
            ReconcileWorkflow.run, reconcile_input(settings), id=RECONCILE_SCHEDULE_ID, task_queue=SHARED_TASK_QUEUE,
            static_summary="Relay reconciliation: registry rows without a lifecycle workflow"),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=settings.reconcile_interval)]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP, catchup_window=RETENTION_CATCHUP_WINDOW),
    )


async def ensure_reconcile_schedule(client: Client, settings: Settings) -> None:
    """Create the reconciliation's schedule, or bring it to the settings (an operator's pause is left alone); with
    ``RELAY_RECONCILE_INTERVAL_SECS`` 0, delete it."""
    if settings.reconcile_interval <= timedelta(0):
        try:
            await client.get_schedule_handle(RECONCILE_SCHEDULE_ID).delete()
            log.info("reconciliation schedule %s deleted: RELAY_RECONCILE_INTERVAL_SECS is 0", RECONCILE_SCHEDULE_ID)
        except RPCError:
            pass  # none to delete
        return
    await _ensure_schedule(client, RECONCILE_SCHEDULE_ID, reconcile_schedule(settings),
                           f"reconciliation: every {settings.reconcile_interval}")


async def start_reconcile_round(client: Client, settings: Settings) -> None:
    """One round now, at start-up: after Temporal's state was lost, the rows it stranded are found at once, not an
    interval later. Workers started together share it (one id, the running round reused); not waited for."""
    try:
        await client.start_workflow(
            ReconcileWorkflow.run, reconcile_input(settings), id=RECONCILE_STARTUP_ID, task_queue=SHARED_TASK_QUEUE,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            static_summary="Relay reconciliation at worker start-up")
    except RPCError as err:  # Temporal away: the schedule's next round does it
        log.warning("could not start the reconciliation round at start-up: %s", err.message)
