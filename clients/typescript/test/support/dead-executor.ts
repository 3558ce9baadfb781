/**
 * A dead executor in the making: `node dead-executor.js DB_URL EXECUTOR_ID COUNT IDS_FILE` launches DBOS with that
 * executor id, starts COUNT waiters (PENDING, owned by that id), writes their ids to IDS_FILE (one a line; the file
 * appears whole) and waits to be killed (or for its stdin to close).
 */

import * as fs from 'node:fs';
import { DBOS } from '@dbos-inc/dbos-sdk';
import { launch, waiter } from './app';

async function main(): Promise<void> {
  const [url, executorId, count, idsFile] = process.argv.slice(2) as [string, string, string, string];
  await launch(url, executorId);
  const ids: string[] = [];
  for (let n = 0; n < Number(count); n++) {
    ids.push((await DBOS.startWorkflow(waiter)('never')).workflowID);
  }
  fs.writeFileSync(`${idsFile}.partial`, ids.map((id) => `${id}\n`).join(''));
  fs.renameSync(`${idsFile}.partial`, idsFile);
  process.stdin.resume();
  process.stdin.on('end', () => process.exit(0));
}

main().catch((err: unknown) => {
  console.error(err);
  process.exit(1);
});
