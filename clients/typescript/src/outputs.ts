/**
 * The SDK's objects as the replies carry them, with the field names of the conductor client built into
 * @dbos-inc/dbos-sdk 5.2.11: workflows in PascalCase with every value text (epoch ms as digits), steps, schedules,
 * application versions and queues in snake_case. Every field is present; an empty one is null.
 */

import { inspect } from 'node:util';
import type { DBOS, VersionInfo, WorkflowQueue, WorkflowSchedule, WorkflowStatus } from '@dbos-inc/dbos-sdk';

/** A step as `DBOS.listWorkflowSteps` lists it (the package exports no name for the type). */
export type StepInfo = NonNullable<Awaited<ReturnType<typeof DBOS.listWorkflowSteps>>>[number];

// Never truncated (depth, arrays, strings): an operator reads the whole value. inspect rather than JSON.stringify,
// as 5.2.11 renders them: a value may hold a bigint, a Date, a Map or a cycle, and must still be shown.
const INSPECT_OPTIONS = { depth: null, maxArrayLength: null, maxStringLength: null } as const;

/** A workflow's or a step's value as an operator reads it; null when there is none. */
export function valueText(value: unknown): string | null {
  return value === undefined || value === null ? null : inspect(value, INSPECT_OPTIONS);
}

/** An error as JSON (its name, message, stack and own fields), so it can be read back; null when there is none. */
export function errorText(error: unknown): string | null {
  if (error === undefined || error === null) {
    return null;
  }
  if (!(error instanceof Error)) {
    return JSON.stringify(error, (_key, value: unknown) => (typeof value === 'bigint' ? value.toString() : value));
  }
  const fields: Record<string, unknown> = { name: error.name, message: error.message, stack: error.stack };
  for (const [key, value] of Object.entries(error)) {
    fields[key] = typeof value === 'object' && value !== null ? valueText(value) : value;
  }
  return JSON.stringify(fields, (_key, value: unknown) => (typeof value === 'bigint' ? value.toString() : value));
}

function text(value: number | string | undefined | null): string | null {
  return value === undefined || value === null ? null : String(value);
}

function nonEmpty(value: string | undefined | null): string | null {
  return value ? value : null; // the SDK stores some absent names as ''
}

/** A workflow as `list_workflows` replies carry it; `withData` false (metadata-only mode) leaves out its input,
 * output and error, whatever the SDK loaded. */
export function workflowOutput(w: WorkflowStatus, { withData = true }: { withData?: boolean } = {}) {
  return {
    WorkflowUUID: w.workflowID,
    Status: w.status,
    WorkflowName: w.workflowName,
    WorkflowClassName: nonEmpty(w.workflowClassName),
    WorkflowConfigName: nonEmpty(w.workflowConfigName),
    AuthenticatedUser: nonEmpty(w.authenticatedUser),
    AssumedRole: nonEmpty(w.assumedRole),
    AuthenticatedRoles: (w.authenticatedRoles ?? []).length > 0 ? JSON.stringify(w.authenticatedRoles) : null,
    Input: withData ? valueText(w.input) : null,
    Output: withData ? valueText(w.output) : null,
    Error: withData ? errorText(w.error) : null,
    CreatedAt: text(w.createdAt),
    UpdatedAt: text(w.updatedAt),
    QueueName: nonEmpty(w.queueName),
    ApplicationVersion: w.applicationVersion ?? null,
    ExecutorID: w.executorId ?? null,
    WorkflowTimeoutMS: text(w.timeoutMS),
    WorkflowDeadlineEpochMS: text(w.deadlineEpochMS),
    DeduplicationID: w.deduplicationID ?? null,
    Priority: text(w.priority),
    QueuePartitionKey: w.queuePartitionKey ?? null,
    ForkedFrom: w.forkedFrom ?? null,
    WasForkedFrom: w.wasForkedFrom ?? false,
    ParentWorkflowID: w.parentWorkflowID ?? null,
    DequeuedAt: text(w.dequeuedAt),
    DelayUntilEpochMS: text(w.delayUntilEpochMS),
    CompletedAt: text(w.completedAt),
    // JSON rather than inspect(), so the attributes can be read back.
    Attributes: w.attributes === undefined || w.attributes === null ? null : JSON.stringify(w.attributes),
    ScheduleName: w.scheduleName ?? null,
    ApplicationName: w.applicationName ?? null,
  };
}

/** A step; `loadOutput` false leaves its output out, `loadError` false its error too (metadata-only mode). */
export function stepOutput(s: StepInfo, { loadOutput, loadError }: { loadOutput: boolean; loadError: boolean }) {
  return {
    function_id: s.functionID,
    function_name: s.name,
    output: loadOutput ? valueText(s.output) : null,
    error: loadError ? errorText(s.error) : null,
    child_workflow_id: s.childWorkflowID ?? null,
    started_at_epoch_ms: text(s.startedAtEpochMs),
    completed_at_epoch_ms: text(s.completedAtEpochMs),
  };
}

export function scheduleOutput(s: WorkflowSchedule, { loadContext }: { loadContext: boolean }) {
  return {
    schedule_id: s.scheduleId,
    schedule_name: s.scheduleName,
    workflow_name: s.workflowName,
    workflow_class_name: nonEmpty(s.workflowClassName),
    schedule: s.schedule,
    status: s.status,
    context: loadContext ? valueText(s.context) : null,
    last_fired_at: s.lastFiredAt ?? null,
    automatic_backfill: s.automaticBackfill ?? false,
    cron_timezone: s.cronTimezone ?? null,
    queue_name: s.queueName ?? null,
    application_name: s.applicationName ?? null,
  };
}

export function versionOutput(v: VersionInfo) {
  return {
    version_id: v.versionId,
    version_name: v.versionName,
    version_timestamp: v.versionTimestamp,
    created_at: v.createdAt,
  };
}

/** A queue from its public fields: `DBOS.listQueues` and `DBOS.retrieveQueue` build them from the queue's row. */
export function queueOutput(q: WorkflowQueue) {
  return {
    name: q.name,
    concurrency: q.concurrency ?? null,
    worker_concurrency: q.workerConcurrency ?? null,
    rate_limit_max: q.rateLimit?.limitPerPeriod ?? null,
    rate_limit_period_sec: q.rateLimit?.periodSec ?? null,
    // Every queue is a priority queue; any per-partition limit makes it partitioned (as 5.2.11 reports).
    priority_enabled: true,
    partition_queue: [q.partitionConcurrency, q.partitionWorkerConcurrency, q.partitionRateLimit].some(
      (limit) => limit !== undefined && limit !== null,
    ),
    polling_interval_sec: (q.minPollingIntervalMs ?? 1000) / 1000,
    application_name: q.applicationName ?? null,
    partition_concurrency: q.partitionConcurrency ?? null,
    partition_worker_concurrency: q.partitionWorkerConcurrency ?? null,
    partition_rate_limit_max: q.partitionRateLimit?.limitPerPeriod ?? null,
    partition_rate_limit_period_sec: q.partitionRateLimit?.periodSec ?? null,
  };
}
