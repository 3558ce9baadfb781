/**
 * Relay's `retention` request on the SDK's public API: @dbos-inc/dbos-sdk 5.3 moved garbage collection and the
 * global timeout to its add-on, and both are sound as lists and bulk actions.
 *
 * - Garbage collection: the application's finished workflows (SUCCESS, ERROR, CANCELLED,
 *   MAX_RECOVERY_ATTEMPTS_EXCEEDED) completed before `gc_cutoff_epoch_ms` are deleted with everything they hold
 *   (`DBOS.deleteWorkflows`), and so are those beyond the `gc_rows_threshold` newest, a batch of `gc_batch_size` ids
 *   at a time (at most `DELETE_MAX`, so one bulk delete stays one modest statement).
 * - The global timeout: the application's PENDING, ENQUEUED and DELAYED workflows created at or before
 *   `timeout_cutoff_epoch_ms` are cancelled (`DBOS.cancelWorkflows`), a batch at a time.
 *
 * As 5.2.11 did, a round runs off the message loop, so the request is answered at once ("started") and every other
 * request keeps being answered meanwhile; a request while a round runs is skipped, with a warning.
 */

import { DBOS, type WorkflowStatusString } from '@dbos-inc/dbos-sdk';
import type { Logger } from './log';

export const FINISHED: WorkflowStatusString[] = ['SUCCESS', 'ERROR', 'CANCELLED', 'MAX_RECOVERY_ATTEMPTS_EXCEEDED'];
export const ACTIVE: WorkflowStatusString[] = ['PENDING', 'ENQUEUED', 'DELAYED'];
export const DEFAULT_BATCH = 10_000;
export const DELETE_MAX = 10_000;

export interface RoundInput {
  gcCutoffEpochMs: number | null;
  gcRowsThreshold: number | null;
  gcBatchSize: number | null;
  timeoutCutoffEpochMs: number | null;
}

export interface RoundResult {
  deleted: number;
  cancelled: number;
}

/** The ISO text of an instant: the SDK's time filters read it back with `new Date(text).getTime()`, to the ms. */
export function isoAt(epochMs: number): string {
  return new Date(epochMs).toISOString();
}

/** Act on `batch()` until it returns fewer than `size` ids; how many were acted on. A batch that repeats the last
 * one's ids (the action took nothing away) ends the round rather than looping. */
export async function drain(
  batch: () => Promise<string[]>,
  act: (ids: string[]) => Promise<unknown>,
  size: number,
): Promise<number> {
  let total = 0;
  let last: string[] | undefined;
  for (;;) {
    const ids = await batch();
    if (ids.length === 0 || (last !== undefined && ids.join('\n') === last.join('\n'))) {
      return total;
    }
    await act(ids);
    total += ids.length;
    if (ids.length < size) {
      return total;
    }
    last = ids;
  }
}

async function ids(input: Parameters<typeof DBOS.listWorkflows>[0]): Promise<string[]> {
  const found = await DBOS.listWorkflows({ ...input, loadInput: false, loadOutput: false });
  return found.map((w) => w.workflowID);
}

/** One round, awaited: how many workflows were deleted and how many cancelled. */
export async function runRound(input: RoundInput, logger?: Logger): Promise<RoundResult> {
  const size = Math.min(input.gcBatchSize !== null && input.gcBatchSize > 0 ? input.gcBatchSize : DEFAULT_BATCH, DELETE_MAX);
  const remove = (workflowIds: string[]) => DBOS.deleteWorkflows(workflowIds);
  let deleted = 0;
  if (input.gcCutoffEpochMs !== null) {
    // completedBefore is inclusive: a millisecond earlier keeps a workflow completed at the cutoff itself.
    const before = isoAt(input.gcCutoffEpochMs - 1);
    deleted += await drain(() => ids({ status: FINISHED, limit: size, completedBefore: before }), remove, size);
  }
  // A threshold of 0 or less keeps nothing by that rule: it is no rule (5.2.11 turned 0 into an error).
  if (input.gcRowsThreshold !== null && input.gcRowsThreshold > 0) {
    const keep = input.gcRowsThreshold;
    deleted += await drain(
      () => ids({ status: FINISHED, limit: size, sortDesc: true, offset: keep }),
      remove,
      size,
    );
  }
  let cancelled = 0;
  if (input.timeoutCutoffEpochMs !== null) {
    const until = isoAt(input.timeoutCutoffEpochMs); // endTime is inclusive: created at or before the cutoff
    cancelled = await drain(
      () => ids({ status: ACTIVE, limit: size, endTime: until }),
      (workflowIds) => DBOS.cancelWorkflows(workflowIds),
      size,
    );
  }
  if (deleted > 0 || cancelled > 0) {
    logger?.info(`Retention: ${deleted} finished workflows deleted, ${cancelled} timed out (cancelled)`);
  }
  return { deleted, cancelled };
}

export type Round = (input: RoundInput, logger?: Logger) => Promise<RoundResult>;

/** Rounds of retention, one at a time per client. */
export class Retention {
  #running: Promise<void> | undefined;
  #stopping = false;

  constructor(
    private readonly logger: Logger,
    private readonly round: Round = runRound,
  ) {}

  get running(): boolean {
    return this.#running !== undefined;
  }

  /** Start a round in the background; false (and a warning) when the previous one still runs. */
  start(input: RoundInput): boolean {
    if (this.#running !== undefined) {
      this.logger.warn('Skipping retention: the previous round on this executor is still running.');
      return false;
    }
    this.#running = this.#run(input).finally(() => {
      this.#running = undefined;
    });
    return true;
  }

  async #run(input: RoundInput): Promise<void> {
    try {
      await this.round(input, this.logger);
    } catch (err) {
      if (this.#stopping) {
        // The process is shutting down (DBOS may be gone): the next round takes up the work.
        this.logger.debug('Retention interrupted by shutdown');
        return;
      }
      const detail = err instanceof Error ? (err.stack ?? err.message) : String(err);
      this.logger.error(`Exception encountered during enforcing retention policy: ${detail}`);
    }
  }

  /** Wait for the running round, if any, at most `timeoutMs`; `stop` marks its failures as the shutdown's. */
  async join(timeoutMs: number, { stop = false }: { stop?: boolean } = {}): Promise<void> {
    this.#stopping ||= stop;
    const running = this.#running;
    if (running === undefined) {
      return;
    }
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([running, new Promise<void>((resolve) => (timer = setTimeout(resolve, timeoutMs)))]);
    clearTimeout(timer);
  }
}
