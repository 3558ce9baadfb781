/**
 * Recovery of a dead executor's workflows: the one call this client makes outside the SDK's public API.
 *
 * `DBOSExecutor.globalInstance.recoverPendingWorkflows(executorIDs)` is what `DBOS.launch()` itself runs for the
 * process's own id, and what 5.2.11's built-in conductor client ran for Relay's `recovery` request: for each id, the
 * PENDING workflows it owned on this process's application version are put back on DBOS's internal queue, in one
 * update guarded by their status and owner, so a second request finds nothing and still succeeds. No public call does
 * this for another executor's id. @dbos-inc/dbos-sdk 5.3 exports its modules under `./internal/*`; this is the one
 * place that imports from there, and the version check (`version.ts`) pins the release it was read in.
 */

import { DBOSExecutor } from '@dbos-inc/dbos-sdk/internal/dbos-executor';

/** Re-enqueue the PENDING workflows of `executorIds` (this process's version); how many were found. */
export async function recover(executorIds: string[]): Promise<number> {
  const executor = DBOSExecutor.globalInstance;
  if (executor === undefined) {
    throw new Error('DBOS is not launched');
  }
  return (await executor.recoverPendingWorkflows(executorIds)).length;
}
