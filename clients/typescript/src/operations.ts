/**
 * Every request type Relay sends, answered on the SDK's public API (`DBOS.*`), with the reply fields of the
 * conductor client built into @dbos-inc/dbos-sdk 5.2.11.
 *
 * How each is answered on 5.3 (the closing table of the client's README says the same):
 *
 * - public calls: `list_workflows`, `list_queued_workflows`, `get_workflow`, `exist_pending_workflows`, `list_steps`,
 *   `cancel`, `resume`, `delete`, `fork_workflow`, `rewind_workflow`, `list_schedules`, `get_schedule`,
 *   `pause_schedule`, `resume_schedule`, `backfill_schedule`, `trigger_schedule`, `list_application_versions`,
 *   `set_latest_application_version`, `list_queues`, `get_queue`; `executor_info` and `alert` need no SDK call
 *   beyond `DBOS.executorID` and `DBOS.applicationVersion`;
 * - the one internal call, `recovery` (`recovery.recover`);
 * - this client's own, on public calls: `retention` (`retention.ts`) and `fork_from_failure` (the start step read
 *   from the listed steps, then `DBOS.forkWorkflow`);
 * - unsupported (`Unsupported`, which Relay answers with 501): `get_metrics`, `export_workflow`, `import_workflow`,
 *   `get_workflow_aggregates`, `get_step_aggregates` (5.3 moved them to its add-on), `get_workflow_events`,
 *   `get_workflow_notifications`, `get_workflow_streams` (no public call lists a workflow's events, notifications
 *   or stream keys).
 */

import { randomUUID } from 'node:crypto';
import { hostname } from 'node:os';
import { DBOS, type GetWorkflowsInput, type WorkflowStatus, type WorkflowStatusString } from '@dbos-inc/dbos-sdk';
import type { Logger } from './log';
import { recover } from './recovery';
import type { Retention } from './retention';
import { BadRequest, type Fields, type Operation, type Request, Unsupported } from './protocol';
import {
  type StepInfo,
  queueOutput,
  scheduleOutput,
  stepOutput,
  versionOutput,
  workflowOutput,
} from './outputs';

export type AlertHandler = (name: string, message: string, metadata: Record<string, string>) => void | Promise<void>;

export interface OperationsOptions {
  /** Sent in `executor_info`: any JSON object. */
  metadata: Record<string, unknown> | null;
  /** Takes Relay's alerts; they are logged when absent. */
  onAlert: AlertHandler | null;
  /** Withholds inputs, outputs, step errors and schedule contexts, and refuses the data requests. */
  metadataOnly: boolean;
  retention: Retention;
  logger: Logger;
  /** The installed SDK's version, as `executor_info` reports it and the 501s name it. */
  sdkVersion: string;
}

/** `workflow_ids` when given (a bulk action), else the one `workflow_id`. */
function targetIds(request: Request): string[] {
  const ids = request.strings('workflow_ids');
  return ids !== undefined && ids.length > 0 ? ids : [request.require('workflow_id', 'string')];
}

/** The answers of one executor process. */
export class Operations {
  constructor(private readonly options: OperationsOptions) {}

  table(): Map<string, Operation> {
    const ok = { success: false };
    const entries: [string, Handler, Fields, string][] = [
      ['executor_info', this.executorInfo, {}, 'Exception encountered when describing the executor'],
      ['recovery', this.recovery, ok, 'Exception encountered when recovering workflows'],
      ['exist_pending_workflows', this.existPendingWorkflows, { exist: false },
        'Exception encountered when checking for pending workflows'],
      ['retention', this.retentionRound, ok, 'Exception encountered when starting retention'],
      ['list_workflows', this.listWorkflows, { output: [] }, 'Exception encountered when listing workflows'],
      ['list_queued_workflows', this.listQueuedWorkflows, { output: [] },
        'Exception encountered when listing queued workflows'],
      ['get_workflow', this.getWorkflow, { output: null }, 'Exception encountered when getting a workflow'],
      ['list_steps', this.listSteps, { output: null }, 'Exception encountered when listing steps'],
      ['cancel', this.cancel, ok, 'Exception encountered when cancelling workflow(s)'],
      ['resume', this.resume, ok, 'Exception encountered when resuming workflow(s)'],
      ['delete', this.delete, ok, 'Exception encountered when deleting workflow(s)'],
      ['fork_workflow', this.forkWorkflow, { new_workflow_id: null }, 'Exception encountered when forking a workflow'],
      ['fork_from_failure', this.forkFromFailure, { forked_workflow_ids: null },
        'Exception encountered when bulk forking workflows'],
      ['rewind_workflow', this.rewindWorkflow, ok, 'Exception encountered when rewinding workflow'],
      ['get_metrics', this.moved('get_metrics'), { metrics: [] }, 'get_metrics'],
      ['alert', this.alert, ok, 'Exception encountered when processing alert'],
      ['export_workflow', this.moved('export_workflow'), { serialized_workflow: null }, 'export_workflow'],
      ['import_workflow', this.moved('import_workflow'), ok, 'import_workflow'],
      ['list_schedules', this.listSchedules, { output: [] }, 'Exception encountered when listing schedules'],
      ['get_schedule', this.getSchedule, { output: null }, 'Exception encountered when getting a schedule'],
      ['pause_schedule', this.pauseSchedule, ok, 'Exception encountered when pausing a schedule'],
      ['resume_schedule', this.resumeSchedule, ok, 'Exception encountered when resuming a schedule'],
      ['backfill_schedule', this.backfillSchedule, { workflow_ids: [] },
        'Exception encountered when backfilling a schedule'],
      ['trigger_schedule', this.triggerSchedule, { workflow_id: null },
        'Exception encountered when triggering a schedule'],
      ['get_workflow_events', this.unlisted('get_workflow_events', 'events'), { events: null }, 'get_workflow_events'],
      ['get_workflow_notifications', this.unlisted('get_workflow_notifications', 'notifications'), { notifications: null },
        'get_workflow_notifications'],
      ['get_workflow_streams', this.unlisted('get_workflow_streams', 'streams'), { streams: null }, 'get_workflow_streams'],
      ['get_workflow_aggregates', this.moved('get_workflow_aggregates'), { output: [] }, 'get_workflow_aggregates'],
      ['get_step_aggregates', this.moved('get_step_aggregates'), { output: [] }, 'get_step_aggregates'],
      ['list_application_versions', this.listApplicationVersions, { output: [] },
        'Exception encountered when listing application versions'],
      ['set_latest_application_version', this.setLatestApplicationVersion, ok,
        'Exception encountered when setting the latest application version'],
      ['list_queues', this.listQueues, { output: [] }, 'Exception encountered when listing queues'],
      ['get_queue', this.getQueue, { output: null }, 'Exception encountered when getting a queue'],
    ];
    return new Map(
      entries.map(([kind, handler, failed, context]) => [kind, { handler: handler.bind(this), failed, context }]),
    );
  }

  private get load(): boolean {
    return !this.options.metadataOnly;
  }

  // -- the executor and its recovery --------------------------------------------------------------------------

  private async executorInfo(): Promise<Fields> {
    return {
      executor_id: DBOS.executorID,
      application_version: DBOS.applicationVersion,
      hostname: hostname(),
      language: 'typescript',
      dbos_version: this.options.sdkVersion,
      executor_metadata: this.options.metadata,
    };
  }

  private async recovery(request: Request): Promise<Fields> {
    const ids = request.require('executor_ids', 'list');
    if (!ids.every((id) => typeof id === 'string')) {
      throw new BadRequest("recovery request: field 'executor_ids' must be a list of strings");
    }
    await recover(ids as string[]);
    return { success: true };
  }

  private async existPendingWorkflows(request: Request): Promise<Fields> {
    // The query recovery itself makes: PENDING, owned by that executor, of that version.
    const found = await DBOS.listWorkflows({
      status: 'PENDING',
      executorId: request.require('executor_id', 'string'),
      applicationVersion: request.require('application_version', 'string'),
      limit: 1,
      loadInput: false,
      loadOutput: false,
    });
    return { exist: found.length > 0 };
  }

  private async retentionRound(request: Request): Promise<Fields> {
    const body = request.body();
    this.options.retention.start({
      gcCutoffEpochMs: body.get('gc_cutoff_epoch_ms', 'integer') ?? null,
      gcRowsThreshold: body.get('gc_rows_threshold', 'integer') ?? null,
      gcBatchSize: body.get('gc_batch_size', 'integer') ?? null,
      timeoutCutoffEpochMs: body.get('timeout_cutoff_epoch_ms', 'integer') ?? null,
    });
    return { success: true }; // started, not finished: as 5.2.11 answers
  }

  private async alert(request: Request): Promise<Fields> {
    const name = request.require('name', 'string');
    const message = request.require('message', 'string');
    const metadata = (request.get('metadata', 'object') ?? {}) as Record<string, string>;
    if (this.options.onAlert !== null) {
      await this.options.onAlert(name, message, metadata);
    } else {
      this.options.logger.info(`Alert: ${name} | Message: ${message} | Metadata: ${JSON.stringify(metadata)}`);
    }
    return { success: true };
  }

  // -- workflows ----------------------------------------------------------------------------------------------

  private listed(request: Request): GetWorkflowsInput {
    const b = request.body();
    return {
      workflowIDs: b.strings('workflow_uuids'),
      authenticatedUser: b.stringOrList('authenticated_user'),
      startTime: b.get('start_time', 'string'),
      endTime: b.get('end_time', 'string'),
      completedAfter: b.get('completed_after', 'string'),
      completedBefore: b.get('completed_before', 'string'),
      dequeuedAfter: b.get('dequeued_after', 'string'),
      dequeuedBefore: b.get('dequeued_before', 'string'),
      status: b.stringOrList('status') as WorkflowStatusString | WorkflowStatusString[] | undefined,
      applicationVersion: b.stringOrList('application_version'),
      applicationName: b.stringOrList('application_name'),
      forkedFrom: b.stringOrList('forked_from'),
      parentWorkflowID: b.stringOrList('parent_workflow_id'),
      workflowName: b.stringOrList('workflow_name'),
      queueName: b.stringOrList('queue_name'),
      limit: b.get('limit', 'integer'),
      offset: b.get('offset', 'integer'),
      sortDesc: b.get('sort_desc', 'boolean') ?? false,
      workflow_id_prefix: b.stringOrList('workflow_id_prefix'),
      // As 5.2.11: a list carries inputs and outputs only when asked.
      loadInput: (b.get('load_input', 'boolean') ?? false) && this.load,
      loadOutput: (b.get('load_output', 'boolean') ?? false) && this.load,
      executorId: b.stringOrList('executor_id'),
      queuesOnly: b.get('queues_only', 'boolean'),
      wasForkedFrom: b.get('was_forked_from', 'boolean'),
      hasParent: b.get('has_parent', 'boolean'),
      attributes: b.get('attributes', 'object'),
      scheduleName: b.stringOrList('schedule_name'),
    };
  }

  private output(w: WorkflowStatus) {
    return workflowOutput(w, { withData: this.load });
  }

  private async listWorkflows(request: Request): Promise<Fields> {
    return { output: (await DBOS.listWorkflows(this.listed(request))).map((w) => this.output(w)) };
  }

  private async listQueuedWorkflows(request: Request): Promise<Fields> {
    return { output: (await DBOS.listQueuedWorkflows(this.listed(request))).map((w) => this.output(w)) };
  }

  private async getWorkflow(request: Request): Promise<Fields> {
    const found = await DBOS.listWorkflows({
      workflowIDs: [request.require('workflow_id', 'string')],
      loadInput: (request.get('load_input', 'boolean') ?? true) && this.load,
      loadOutput: (request.get('load_output', 'boolean') ?? true) && this.load,
    });
    return { output: found.length > 0 ? this.output(found[0]!) : null };
  }

  private async listSteps(request: Request): Promise<Fields> {
    const steps = await DBOS.listWorkflowSteps(request.require('workflow_id', 'string'), {
      limit: request.get('limit', 'integer'),
      offset: request.get('offset', 'integer'),
    });
    const loadOutput = (request.get('load_output', 'boolean') ?? true) && this.load;
    // null, not []: the workflow does not exist (Relay answers 404), as 5.2.11 replies.
    return { output: steps?.map((s) => stepOutput(s, { loadOutput, loadError: this.load })) ?? null };
  }

  private async cancel(request: Request): Promise<Fields> {
    await DBOS.cancelWorkflows(targetIds(request), {
      cancelChildren: request.get('cancel_children', 'boolean') ?? false,
    });
    return { success: true };
  }

  private async resume(request: Request): Promise<Fields> {
    await DBOS.resumeWorkflows(targetIds(request), { queueName: request.get('queue_name', 'string') });
    return { success: true };
  }

  private async delete(request: Request): Promise<Fields> {
    await DBOS.deleteWorkflows(targetIds(request), request.get('delete_children', 'boolean') ?? false);
    return { success: true };
  }

  private async forkWorkflow(request: Request): Promise<Fields> {
    const b = request.body();
    const handle = await DBOS.forkWorkflow(b.require('workflow_id', 'string'), b.require('start_step', 'integer'), {
      newWorkflowID: b.get('new_workflow_id', 'string') ?? randomUUID(),
      applicationVersion: b.get('application_version', 'string'),
      queueName: b.get('queue_name', 'string'),
      queuePartitionKey: b.get('queue_partition_key', 'string'),
    });
    return { new_workflow_id: handle.workflowID };
  }

  /**
   * Each workflow forked from one of its steps, chosen as 5.2.11 chose it: `from_step` as given; the last step that
   * failed, else the last step (`from_last_failure`); the last step (`from_last_step`); the last step of that name
   * (`from_step_name`, an error if a workflow has none). A workflow with no step starts again from step 0. Unlike
   * 5.2.11's one transaction, each fork is its own call: an error part-way leaves the forks made before it.
   */
  private async forkFromFailure(request: Request): Promise<Fields> {
    const b = request.body();
    const ids = b.require('workflow_ids', 'list');
    const modes = [
      b.get('from_last_failure', 'boolean') ?? false,
      b.get('from_last_step', 'boolean') ?? false,
      b.get('from_step', 'integer') !== undefined,
      b.get('from_step_name', 'string') !== undefined,
    ];
    if (modes.filter(Boolean).length !== 1) {
      throw new BadRequest(
        'fork_from_failure request: exactly one of from_last_failure, from_last_step, from_step, from_step_name',
      );
    }
    if (!ids.every((id) => typeof id === 'string')) {
      throw new BadRequest("fork_from_failure request: field 'workflow_ids' must be a list of strings");
    }
    const forked: string[] = [];
    for (const workflowId of ids as string[]) {
      const handle = await DBOS.forkWorkflow(workflowId, await startStep(workflowId, b), {
        newWorkflowID: randomUUID(),
        applicationVersion: b.get('application_version', 'string'),
        queueName: b.get('queue_name', 'string'),
        queuePartitionKey: b.get('queue_partition_key', 'string'),
      });
      forked.push(handle.workflowID);
    }
    return { forked_workflow_ids: forked };
  }

  private async rewindWorkflow(request: Request): Promise<Fields> {
    const b = request.body();
    await DBOS.rewindWorkflow(b.require('workflow_id', 'string'), {
      startStep: b.get('start_step', 'integer') ?? 0,
      applicationVersion: b.get('application_version', 'string'),
      queueName: b.get('queue_name', 'string'),
      queuePartitionKey: b.get('queue_partition_key', 'string'),
    });
    return { success: true };
  }

  // -- schedules ----------------------------------------------------------------------------------------------

  private async listSchedules(request: Request): Promise<Fields> {
    const b = request.body({ required: false });
    const loadContext = (b.get('load_context', 'boolean') ?? true) && this.load;
    const schedules = await DBOS.listSchedules({
      status: b.stringOrList('status'),
      workflowName: b.stringOrList('workflow_name'),
      scheduleNamePrefix: b.stringOrList('schedule_name_prefix'),
      applicationName: b.stringOrList('application_name'),
    });
    return { output: schedules.map((s) => scheduleOutput(s, { loadContext })) };
  }

  private async getSchedule(request: Request): Promise<Fields> {
    const found = await DBOS.getSchedule(request.require('schedule_name', 'string'));
    const loadContext = (request.get('load_context', 'boolean') ?? true) && this.load;
    return { output: found === null ? null : scheduleOutput(found, { loadContext }) };
  }

  private async pauseSchedule(request: Request): Promise<Fields> {
    await DBOS.pauseSchedule(request.require('schedule_name', 'string'));
    return { success: true };
  }

  private async resumeSchedule(request: Request): Promise<Fields> {
    await DBOS.resumeSchedule(request.require('schedule_name', 'string'));
    return { success: true };
  }

  private async backfillSchedule(request: Request): Promise<Fields> {
    const start = instant(request, 'start');
    const end = instant(request, 'end');
    const handles = await DBOS.backfillSchedule(request.require('schedule_name', 'string'), start, end);
    return { workflow_ids: handles.map((h) => h.workflowID) };
  }

  private async triggerSchedule(request: Request): Promise<Fields> {
    return { workflow_id: (await DBOS.triggerSchedule(request.require('schedule_name', 'string'))).workflowID };
  }

  // -- versions and queues ------------------------------------------------------------------------------------

  private async listApplicationVersions(): Promise<Fields> {
    return { output: (await DBOS.listApplicationVersions()).map(versionOutput) };
  }

  private async setLatestApplicationVersion(request: Request): Promise<Fields> {
    await DBOS.setLatestApplicationVersion(request.require('version_name', 'string'));
    return { success: true };
  }

  private async listQueues(request: Request): Promise<Fields> {
    const b = request.body({ required: false });
    return { output: (await DBOS.listQueues(b.stringOrList('application_name'))).map(queueOutput) };
  }

  private async getQueue(request: Request): Promise<Fields> {
    const found = await DBOS.retrieveQueue(request.require('name', 'string'));
    return { output: found === null ? null : queueOutput(found) };
  }

  // -- what this SDK release cannot do ------------------------------------------------------------------------

  private unlisted(operation: string, what: string): Handler {
    const version = this.options.sdkVersion;
    return async () => {
      throw new Unsupported(
        `${operation} is not available with @dbos-inc/dbos-sdk ${version}: no public call lists a workflow's ` +
          `${what} (5.3 moved that listing to its add-on; relay-dbos uses the SDK's public API only)`,
      );
    };
  }

  private moved(operation: string): Handler {
    const version = this.options.sdkVersion;
    return async () => {
      throw new Unsupported(
        `${operation} is not available with @dbos-inc/dbos-sdk ${version}: DBOS moved it out of its ` +
          'MIT-licensed package in 5.3, and relay-dbos has no public call to do it with',
      );
    };
  }
}

type Handler = (request: Request) => Promise<Fields>;

/** A time field of the request as a `Date`. */
function instant(request: Request, name: string): Date {
  const value = request.require(name, 'string');
  const at = new Date(value);
  if (Number.isNaN(at.getTime())) {
    throw new BadRequest(`${request.kind} request: field '${name}' is not a date: ${JSON.stringify(value)}`);
  }
  return at;
}

/** The step `fork_from_failure` starts a workflow's fork from (see `Operations.forkFromFailure`). */
async function startStep(workflowId: string, b: Request): Promise<number> {
  const fromStep = b.get('from_step', 'integer');
  if (fromStep !== undefined) {
    return fromStep;
  }
  const steps: StepInfo[] = (await DBOS.listWorkflowSteps(workflowId)) ?? [];
  const last = (chosen: StepInfo[]) => Math.max(...chosen.map((s) => s.functionID));
  const name = b.get('from_step_name', 'string');
  if (name !== undefined) {
    const named = steps.filter((s) => s.name === name);
    if (named.length === 0) {
      throw new Error(`Workflow ${workflowId} has no step named '${name}'`);
    }
    return last(named);
  }
  if (b.get('from_last_failure', 'boolean') === true) {
    const failed = steps.filter((s) => s.error !== null && s.error !== undefined);
    if (failed.length > 0) {
      return last(failed);
    }
  }
  return steps.length > 0 ? last(steps) : 0;
}
